# shellcheck shell=bash disable=SC2034 # the variables are for the scripts that source this
# deploy/ha/common.sh: the layout deploy/ha/start, stop and kill-primary share. Sourced.
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

# ha_state: one line per node, "name port reported_state assigned_state".
ha_state() {
    "$PG_BINDIR/psql" "$HA_MONITOR_URI" -tAq -F ' ' -c \
        "SELECT nodename, nodeport, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid"
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
