#!/usr/bin/env bash
# bench/many-tenants.sh [BUILDDIR]: many small tenants in one engramd (issue 34 item 3):
# creates MT_TENANTS tenants (10,000) of MT_MIN to MT_MAX memories (20 to 200) of MT_DIM
# dimensions (384), the first MT_SAMPLE (1,000) one by one, the rest and the filling from
# MT_PROCS client processes (4), measures them idle MT_IDLE_WAIT s (25) later, searches each
# once, then a Zipf mix of MT_MIX searches (20,000), under an index budget of MT_BUDGET_MB
# (64) that holds a fraction of them; prints the per-tenant cost, the latencies and
# PostgreSQL's share of the CPU (bench/many_tenants.py says how). MT_FILL_S and MT_SEARCH_S
# (0: no limit) end the filling and the first searches after that many seconds, for a run
# that must end by a deadline: the report says how many tenants each phase reached.
# Uses a release build (default build-bench/; build-rel/ works), its own PostgreSQL cluster
# in MT_OUT/pg (var/many-tenants) and its own engramd on 127.0.0.1:7630/7631; each run
# starts from an empty database. The report is MT_OUT/report.txt and report.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/own-engramd.sh"
cd "$ENGRAM_ROOT"
build=${1:-build-bench}
out=${MT_OUT:-var/many-tenants}
bin=$build/server/engramd
[ -x "$bin" ] || die "$bin missing: build a release first"
mkdir -p "$out"
out=$(cd "$out" && pwd)
db=engram_mt
own_engramd "$bin" "$out" "$db" 7630 7631 --index-memory-mb "${MT_BUDGET_MB:-64}"
postmaster=$(head -1 "$out/pg/data/postmaster.pid")
{
    echo "engramd $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)," \
        "load average $(cut -d' ' -f1-3 /proc/loadavg), index budget ${MT_BUDGET_MB:-64} MiB"
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/many_tenants.py --port 7630 --http-port 7631 \
        --admin-key-file "$out/admin.key" --engramd-pid "$pid" --postmaster-pid "$postmaster" \
        --tenants "${MT_TENANTS:-10000}" --min "${MT_MIN:-20}" --max "${MT_MAX:-200}" \
        --dim "${MT_DIM:-384}" --mix "${MT_MIX:-20000}" --procs "${MT_PROCS:-4}" \
        --sample "${MT_SAMPLE:-1000}" --idle-wait "${MT_IDLE_WAIT:-25}" \
        --fill-seconds "${MT_FILL_S:-0}" --search-seconds "${MT_SEARCH_S:-0}" \
        --out "$out/report.json"
    echo "database: $(pg_as_owner "$PG_BINDIR/psql" -h "$out/pg/run" -U postgres -d "$db" -tAc \
        "SELECT pg_size_pretty(pg_database_size('$db'))"), load average after" \
        "$(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$out/report.txt"
