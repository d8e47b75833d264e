#!/usr/bin/env bash
# bench/failover.sh [BUILDDIR [RUNS]]: measures the unavailability window of a failover: the
# time from the first failed write to the first acknowledged write after it, while four
# writers store memories (each with an idempotency key, retried on 'unavailable' or a lost
# connection) through HAProxy and the primary's machine dies (SIGKILL to its pg_autoctl
# keeper and its postmaster) and pg_auto_failover promotes the synchronous secondary.
# The same machinery as tests/integration/test_failover.py: deploy/ha (monitor, primary,
# secondary, two engramd, HAProxy) in a temporary directory on free ports, started and
# removed for each run. Uses a release build (default build-bench/, as bench/run-targets.sh
# makes it). Prints one line per run, then the median window.
# The window is mostly pg_auto_failover's: deploy/ha/start's monitor timeouts (a primary
# unhealthy after 3 s, a demote timeout of 4 s) plus engramd's reconnect backoff (at most
# 500 ms here) and HAProxy's health checks (1 s).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
cd "$ENGRAM_ROOT"
build=${1:-build-bench}
runs=${2:-3}
bin=$ENGRAM_ROOT/$build/server/engramd
[ -x "$bin" ] || die "$bin missing: build a release first (bench/run-targets.sh does)"
if ! command -v pg_autoctl >/dev/null || ! command -v haproxy >/dev/null; then
    install_deps "${ENGRAM_HA_PACKAGES[@]}"
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
(cd tests/integration && /usr/bin/python3 failover_run.py "$bin" "$runs") | tee "$out"
sed -n 's/.*unavailability window \([0-9.]*\) s.*/\1/p' "$out" | sort -n |
    awk '{w[NR] = $1} END {if (NR) printf "median unavailability window over %d runs: %.2f s\n", NR, w[int((NR + 1) / 2)]}'
