#!/usr/bin/env bash
# bench/tenant-memory.sh [BUILDDIR]: measures the memory one tenant of 50,000 memories of
# 768 dimensions costs engramd (the sizing figure of docs/operations.md). Uses a release
# build (default build-bench/, as bench/run-targets.sh makes it; build-rel/ or build/ work
# too), its own PostgreSQL cluster in var/tenant-memory/pg and its own engramd on
# 127.0.0.1:7620/7621. Prints the resident memory and the index bytes:
#   1. just started (on the first run, before any tenant exists; later runs preload it);
#   2. after loading the tenant (engram-bench --workload load: memory.store_batch; the first
#      run only, later runs reuse the data) and one second of searches, which loads its
#      index (from the database, or from its snapshot on later runs);
#   3. after a restart (the index snapshot is written at shutdown) and one second of
#      searches: the index loaded from its snapshot, nothing else warm;
#   4. after 15 s of searches (the row cache holds the rows searches returned);
#   5. every 20 s of TM_IDLE_S (60) without searches: only the recall monitor's probes read
#      rows, until the index is steady (its vectors unchanged during its last 205 probes:
#      about 4 minutes at this machine's probe rate) and probed once a minute.
# Each line also gives the float rows mapped from the snapshot and those of them in RAM, and
# the bytes the index dropped to hold them to index_rows_ram_percent.
# Environment: TM_MEMORIES (50000), TM_DIM (768), TM_OUT (var/tenant-memory), TM_IDLE_S;
# ENGRAM_* settings reach engramd (ENGRAM_INDEX_ROWS_RAM_PERCENT=100: no cap).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
cd "$ENGRAM_ROOT"
build=${1:-build-bench}
n=${TM_MEMORIES:-50000}
dim=${TM_DIM:-768}
out=${TM_OUT:-var/tenant-memory}
bin=$build/server/engramd
bench=$build/bench/engram-bench
[ -x "$bin" ] && [ -x "$bench" ] || die "$bin or $bench missing: build a release first"
mkdir -p "$out"
out=$(cd "$out" && pwd)
pg_cluster_init "$out/pg" >/dev/null
pg_cluster_start "$out/pg" engram_tm
pid=
stop() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    pid=
}
trap 'stop; pg_cluster_stop "$out/pg"' EXIT
start() {
    "$bin" --pg-dsn "$PG_DSN" --rpc-port 7620 --http-port 7621 --data-dir "$out/data" \
        --admin-key-file "$out/admin.key" --premium-max-memories 0 --premium-rate-per-s 0 \
        >>"$out/engramd.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        curl -sf http://127.0.0.1:7621/healthz 2>/dev/null | grep -q '"indexes":"loaded"' && return 0
        sleep 0.2
    done
    die "engramd did not start, see $out/engramd.log"
}
metric() { curl -sf http://127.0.0.1:7621/metrics | awk -v m="$1" '$1 == m { printf "%.0f", $2 }'; }
mib() { echo "${1:-0} / 1048576" | bc -l; }
report() {
    local rss idx vec
    rss=$(metric engram_process_resident_bytes)
    idx=$(metric engram_index_bytes)
    vec=$(metric engram_index_vectors)
    printf '%-44s RSS %7.1f MiB   index %7.1f MiB (%.2f B per dim)   vectors %s   rows in RAM %.1f of %.1f MiB, dropped %.1f MiB\n' \
        "$1" "$(mib "$rss")" "$(mib "$idx")" "$(echo "${idx:-0} / ($n * $dim)" | bc -l)" "$vec" \
        "$(mib "$(metric engram_index_rows_resident_bytes)")" \
        "$(mib "$(metric engram_index_rows_mapped_bytes)")" \
        "$(mib "$(metric engram_index_rows_dropped_bytes_total)")" | tee -a "$out/report.txt"
    printf '%-44s recall monitor: %s probes, %s rounds passed over a steady index\n' "" \
        "$(metric engram_index_recall_probes_total)" \
        "$(metric engram_index_recall_steady_skips_total)" | tee -a "$out/report.txt"
}
: >"$out/report.txt"
echo "engramd $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $n x $dim, $(date -u +%FT%TZ)" | tee -a "$out/report.txt"
start
report "1. started (first run: no tenant yet)"
"$bench" --port 7620 --http-port 7621 --admin-key-file "$out/admin.key" --workload load \
    --tenants 1 --memories "$n" --dim "$dim" --reuse --state-file "$out/bench.state" \
    --tenant-prefix tm --quiet >"$out/load.log" 2>&1 || die "load failed, see $out/load.log"
search1() {
    "$bench" --port 7620 --http-port 7621 --admin-key-file "$out/admin.key" --workload search \
        --tenants 1 --memories "$n" --dim "$dim" --reuse --state-file "$out/bench.state" \
        --tenant-prefix tm --duration 1 --warmup 0 --quiet >"$out/search1.log" 2>&1 ||
        die "search failed, see $out/search1.log"
}
search1
report "2. loaded, index in memory"
stop
start
search1
report "3. restarted, index from its snapshot"
"$bench" --port 7620 --http-port 7621 --admin-key-file "$out/admin.key" --workload search \
    --tenants 1 --memories "$n" --dim "$dim" --reuse --state-file "$out/bench.state" \
    --tenant-prefix tm --duration 15 --warmup 1 --connections 4 --quiet >"$out/search.log" 2>&1 ||
    die "search failed, see $out/search.log"
sleep 1.5 # the housekeeping's next measurement
report "4. after 15 s of searches (row cache warm)"
idle=${TM_IDLE_S:-60}
for t in $(seq 20 20 "$idle"); do
    sleep 20
    report "5. idle ${t} s (recall monitor only)"
done
grep -E "index loaded|snapshot" "$out/engramd.log" | tail -3 || true
