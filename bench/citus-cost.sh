#!/usr/bin/env bash
# bench/citus-cost.sh [BUILDDIR]: what a store and a search cost on one PostgreSQL and on a
# Citus coordinator with two workers (issue 35 item 6), on this machine: the same workload
# (bench/citus_cost.py: CC_TENANTS tenants (8), CC_STORES memory.store calls (4,000) and then
# CC_SEARCHES memory.search calls (8,000) of CC_DIM dimensions (384), from CC_PROCS client
# processes (4)) against a release engramd on its own PostgreSQL cluster, then against one
# on a deploy/citus cluster (coordinator and two workers on this machine, ports from
# CC_CITUS_PORT, 9750). Prints per phase the operations per second and the CPU
# milliseconds per operation of engramd and of each PostgreSQL server. Every server shares
# the machine's cores, so the speeds are not a cluster's: the CPU per operation and where
# it is spent are what carry over to machines of their own. Uses a release build (default
# build-bench/), CC_OUT (var/citus-cost) for the clusters and reports (report.txt, one
# JSON per setup).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/own-engramd.sh"
cd "$ENGRAM_ROOT"
build=${1:-build-bench}
out=${CC_OUT:-var/citus-cost}
bin=$build/server/engramd
[ -x "$bin" ] || die "$bin missing: build a release first"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cport=${CC_CITUS_PORT:-9750}
args=(--tenants "${CC_TENANTS:-8}" --stores "${CC_STORES:-4000}"
    --searches "${CC_SEARCHES:-8000}" --procs "${CC_PROCS:-4}" --dim "${CC_DIM:-384}")
pm() { head -1 "$1/data/postmaster.pid"; }
{
    echo "engramd $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)," \
        "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "== one PostgreSQL"
    own_engramd "$bin" "$out" engram_cc 7640 7641
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/citus_cost.py --port 7640 --http-port 7641 \
        --admin-key-file "$out/admin.key" --engramd-pid "$pid" --node "pg=$(pm "$out/pg")" \
        --label single --out "$out/single.json" "${args[@]}"
    own_engramd_stop
    pg_cluster_stop "$out/pg"
    trap - EXIT
    echo "== Citus: coordinator and two workers"
    export ENGRAM_CITUS_DIR=$out/citus ENGRAM_CITUS_PORT=$cport ENGRAM_CITUS_DB=engram_cc
    export ENGRAM_BIN=$bin
    rm -rf "$out/citus"
    trap 'own_engramd_stop; deploy/citus stop >/dev/null 2>&1 || true' EXIT
    deploy/citus start >/dev/null
    rm -rf "$out/cdata"
    "$bin" --pg-dsn "$(deploy/citus dsn)" --rpc-port 7642 --http-port 7643 \
        --data-dir "$out/cdata" --admin-key-file "$out/admin.key" --premium-max-memories 0 \
        --premium-rate-per-s 0 >"$out/engramd-citus.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:7643/healthz" 2>/dev/null | grep -q '"indexes":"loaded"' &&
            break
        sleep 0.2
    done
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/citus_cost.py --port 7642 --http-port 7643 \
        --admin-key-file "$out/admin.key" --engramd-pid "$pid" \
        --node "coordinator=$(pm "$out/citus/coord")" --node "worker1=$(pm "$out/citus/w1")" \
        --node "worker2=$(pm "$out/citus/w2")" --label citus --out "$out/citus.json" "${args[@]}"
    echo "load average after $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$out/report.txt"
