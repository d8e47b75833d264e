# shellcheck shell=bash
# bench/own-engramd.sh: sourced by benchmarks that run a release engramd on a PostgreSQL
# cluster of their own (bench/after-load.sh, bench/many-tenants.sh). Needs deploy/lib.sh.
#
# own_engramd BIN OUT DB RPC HTTP [ARGS...]: (re)creates database DB in the cluster OUT/pg
# (made and started when needed), starts BIN on 127.0.0.1:RPC/HTTP with an empty data dir
# OUT/data, the admin key in OUT/admin.key, no premium memory or rate limits and ARGS, logs
# to OUT/engramd.log, and waits until its indexes are loaded. Sets dsn and pid; on exit the
# engramd and then the cluster are stopped.
own_engramd() {
    local bin=$1 out=$2 db=$3 rpc=$4 http=$5
    shift 5
    pg_cluster_init "$out/pg" >/dev/null
    pg_cluster_start "$out/pg" postgres
    pg_as_owner "$PG_BINDIR/dropdb" -h "$out/pg/run" -U postgres --if-exists "$db"
    pg_as_owner "$PG_BINDIR/createdb" -h "$out/pg/run" -U postgres "$db"
    dsn="host=$out/pg/run dbname=$db user=postgres"
    rm -rf "$out/data"
    pid=
    # shellcheck disable=SC2064 # out is fixed now
    trap "own_engramd_stop; pg_cluster_stop '$out/pg'" EXIT
    "$bin" --pg-dsn "$dsn" --rpc-port "$rpc" --http-port "$http" --data-dir "$out/data" \
        --admin-key-file "$out/admin.key" --premium-max-memories 0 --premium-rate-per-s 0 \
        "$@" >"$out/engramd.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$http/healthz" 2>/dev/null | grep -q '"indexes":"loaded"' && break
        sleep 0.2
    done
}

own_engramd_stop() {
    if [ -n "${pid:-}" ] && kill -TERM "$pid" 2>/dev/null; then
        wait "$pid" 2>/dev/null || true
    fi
    pid=
}
