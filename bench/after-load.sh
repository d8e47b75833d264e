#!/usr/bin/env bash
# bench/after-load.sh [BUILDDIR]: the first searches after a bulk load (issue 34 target 2):
# one tenant of AL_N memories (50,000) of AL_DIM dimensions (768) stored with store_batch,
# then AL_FIRST searches (1,000) at once, and as many again after AL_SETTLE seconds (10):
# p50/p90/p99, recall@10 and rows read per search of both, and the ratio of their p50s
# (bench/after_load.py says how). Uses a release build (default build-bench/), its own
# PostgreSQL cluster in AL_OUT/pg (var/after-load) and its own engramd on 127.0.0.1:7640/7641;
# each run starts from an empty database. The report is AL_OUT/report.txt and report.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/own-engramd.sh"
cd "$ENGRAM_ROOT"
build=${1:-build-bench}
out=${AL_OUT:-var/after-load}
bin=$build/server/engramd
[ -x "$bin" ] || die "$bin missing: build a release first"
mkdir -p "$out"
out=$(cd "$out" && pwd)
own_engramd "$bin" "$out" engram_al 7640 7641
{
    echo "engramd $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)," \
        "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/after_load.py --port 7640 --http-port 7641 \
        --admin-key-file "$out/admin.key" --n "${AL_N:-50000}" --dim "${AL_DIM:-768}" \
        --first "${AL_FIRST:-1000}" --settle "${AL_SETTLE:-10}" --out "$out/report.json"
    echo "load average after $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$out/report.txt"
