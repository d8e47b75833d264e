# shellcheck shell=bash disable=SC2034 # the variables are for the scripts that source this
# deploy/ha/common.sh: the layout and the helpers deploy/ha/start, stop, rejoin, switchover,
# status and kill-primary share. Sourced.
#
# One machine plays three: a pg_auto_failover monitor, two PostgreSQL nodes (a primary and
# its synchronous secondary, each its own cluster directory and port), two engramd processes
# on the formation's multi-host DSN, and an HAProxy in TCP mode in front of them.
#
# Environment (defaults in brackets):
#   HA_DIR        where every cluster, log, key and pid file lives [var/ha]
#   HA_PORT_BASE  first of the ports [55400]: monitor +0, node1 +1, node2 +2,
#                 engramd a RPC +10 HTTP +11, engramd b RPC +20 HTTP +21, HAProxy RPC +30,
#                 HAProxy HTTP (the JSON API, same checks) +31, HAProxy stats +32
#   HA_DBNAME     the application database [engram]
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

HA_DIR=${HA_DIR:-$ENGRAM_ROOT/var/ha}
HA_PORT_BASE=${HA_PORT_BASE:-55400}
HA_DBNAME=${HA_DBNAME:-engram}
HA_HOST=127.0.0.1
HA_MONITOR_PORT=$HA_PORT_BASE
HA_NODE_PORTS=($((HA_PORT_BASE + 1)) $((HA_PORT_BASE + 2)))
HA_A_RPC=$((HA_PORT_BASE + 10))
HA_A_HTTP=$((HA_PORT_BASE + 11))
HA_B_RPC=$((HA_PORT_BASE + 20))
HA_B_HTTP=$((HA_PORT_BASE + 21))
HA_RPC_PORT=$((HA_PORT_BASE + 30))
HA_HTTP_PORT=$((HA_PORT_BASE + 31))
HA_STATS_PORT=$((HA_PORT_BASE + 32))
HA_MONITOR_URI="postgres://autoctl_node@$HA_HOST:$HA_MONITOR_PORT/pg_auto_failover?sslmode=disable"
# engramd's DSN names both nodes; libpq takes the one that accepts writes, so a promoted
# secondary is found by the next connection attempt
HA_DSN="host=$HA_HOST,$HA_HOST port=${HA_NODE_PORTS[0]},${HA_NODE_PORTS[1]} dbname=$HA_DBNAME user=postgres target_session_attrs=read-write"

# pg_autoctl refuses to run as root: as root it runs as the postgres user (as lib.sh's
# clusters do), with PostgreSQL's binaries on its PATH.
autoctl() { pg_as_owner env PATH="$PG_BINDIR:$PATH" pg_autoctl "$@"; }

# monitor_sql SQL: runs SQL on the monitor's database as its superuser.
monitor_sql() {
    pg_as_owner "$PG_BINDIR/psql" -h "$HA_HOST" -p "$HA_MONITOR_PORT" -U postgres \
        -d pg_auto_failover -v ON_ERROR_STOP=1 -tAqc "$1"
}

# node_sql PORT SQL: runs SQL on a node's application database as the superuser.
node_sql() {
    "$PG_BINDIR/psql" "host=$HA_HOST port=$1 dbname=$HA_DBNAME user=postgres connect_timeout=3" \
        -v ON_ERROR_STOP=1 -tAqc "$2"
}

# ha_state: one line per node, "name port reported_state assigned_state", as the monitor
# holds them (nothing when the monitor does not answer).
ha_state() {
    "$PG_BINDIR/psql" "$HA_MONITOR_URI" -tAq -F ' ' -c \
        "SELECT nodename, nodeport, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid"
}

# ha_nodes: the nodes created in HA_DIR (node1, node2), in order.
ha_nodes() {
    local n
    for n in 1 2; do
        if [ -f "$HA_DIR/node$n/PG_VERSION" ]; then echo "node$n"; fi
    done
}

# ha_primary: the node the monitor holds as the primary now: reported and assigned one of
# single, wait_primary or primary (nothing while there is none, e.g. during a failover).
ha_primary() {
    ha_state | awk '$3 == $4 && ($3 == "single" || $3 ~ /primary$/) {print $1; exit}'
}

# ha_assigned_primary: the node the monitor assigns a primary's role (its goal state), even
# while that node is away; the node to start first.
ha_assigned_primary() {
    ha_state | awk '$4 == "single" || $4 ~ /primary$/ {print $1; exit}'
}

# monitor_now: the monitor's clock (for formation_ready's SINCE).
monitor_now() { "$PG_BINDIR/psql" "$HA_MONITOR_URI" -tAqc "SELECT now()"; }

# formation_ready [SINCE]: a primary and a synchronous secondary, each in the state assigned
# to it, passing the monitor's health checks, its PostgreSQL running and its keeper heard
# from in the last 5 seconds (and after SINCE, a monitor_now, when given: a node whose
# keeper was just started has reported since). Without the freshness the monitor's view of
# a node killed a moment ago still reads "primary".
formation_ready() {
    local since=${1:-'-infinity'}
    [ "$("$PG_BINDIR/psql" "$HA_MONITOR_URI" -tAq -F ' ' -v since="$since" 2>/dev/null <<'SQL'
SELECT string_agg(reportedstate::text, ' ' ORDER BY reportedstate::text)
  FROM pgautofailover.node
 WHERE reportedstate = goalstate AND health = 1 AND reportedpgisrunning
   AND reporttime > greatest(now() - interval '5 seconds', :'since'::timestamptz)
   AND (SELECT count(*) FROM pgautofailover.node) = 2
SQL
)" = "primary secondary" ]
}

# node_back NAME SINCE: NAME is in its assigned state, its PostgreSQL running, passing the
# monitor's health checks, and its keeper has reported after SINCE (a monitor_now).
node_back() {
    [ "$("$PG_BINDIR/psql" "$HA_MONITOR_URI" -tAq -v name="$1" -v since="$2" 2>/dev/null <<'SQL'
SELECT count(*) FROM pgautofailover.node
 WHERE nodename = :'name' AND reportedstate = goalstate AND health = 1
   AND reportedpgisrunning AND reporttime > :'since'::timestamptz
SQL
)" = 1 ]
}

# wait_formation SECONDS WHAT [SINCE]: waits until formation_ready SINCE; dies after SECONDS
# naming WHAT and showing the monitor's view of every node.
wait_formation() {
    local secs=$1 what=$2 since=${3:-} i
    for ((i = 0; i < secs * 2; i++)); do
        formation_ready "$since" && return 0
        sleep 0.5
    done
    die "timed out after ${secs}s waiting for $what; the monitor says (node port reported" \
        "assigned): $(ha_state | tr '\n' ';')"
}

# keeper_running NAME: whether NAME's keeper (`pg_autoctl run`) is running.
keeper_running() { autoctl status --pgdata "$HA_DIR/$1" >/dev/null 2>&1; }

# run_keeper NAME: starts `pg_autoctl run` of HA_DIR/NAME in its own session (a terminal's
# Ctrl-C does not reach it), logging to HA_DIR/NAME.log, unless it runs already. A node's
# keeper asks the monitor for the node's role and takes it: a lost primary that comes back
# finds a new primary and rejoins it as a standby (pg_rewind), a stopped node resumes.
run_keeper() {
    local name=$1
    keeper_running "$name" && return 0
    pg_as_owner setsid env PATH="$PG_BINDIR:$PATH" pg_autoctl run --pgdata "$HA_DIR/$name" \
        >>"$HA_DIR/$name.log" 2>&1 </dev/null &
}

# http_status PORT PATH: the HTTP status engramd answers on 127.0.0.1:PORT (000 when none).
http_status() {
    python3 - "$1" "$2" <<'PY' 2>/dev/null || echo 000
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}{sys.argv[2]}", timeout=3) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
PY
}

# wait_until SECONDS WHAT CMD...: runs CMD every half second until it succeeds; dies after
# SECONDS naming WHAT.
wait_until() {
    local secs=$1 what=$2 i
    shift 2
    for ((i = 0; i < secs * 2; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    die "timed out after ${secs}s waiting for $what"
}
