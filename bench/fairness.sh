#!/usr/bin/env bash
# bench/fairness.sh [BUILDDIR]: the figures of "no tenant can stall another" (issue 30) on a
# release build. The reliability tests that stage these attacks check behaviour (nothing
# refused, budgets hard, each bystander served, no bystander waiting for the attacker's
# lock or behind its queue of batches); this script runs the same scenarios against the
# release engramd of BUILDDIR (default build-bench/; build-rel/ or build/ work too) and its
# own PostgreSQL cluster in var/fairness/pg, and prints the lines with the figures:
#   - hostile metadata (4 MiB array, a million keys): refusal time, pings of both workers;
#   - large answers pipelined unread: bytes held for clients, bystander p99s quiet -> loaded;
#   - a tenant's row held by another transaction: other tenants' store p50/p99/max;
#   - one tenant's 1,000 x 8 KB batches: another tenant's store p50/p99/max.
# bench/README.md ("Fairness between tenants") keeps the last figures.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
cd "$ENGRAM_ROOT"
build=${1:-build-bench}
bin=$build/server/engramd
[ -x "$bin" ] || die "$bin missing: build a release first (meson setup $build --buildtype=release)"
out=var/fairness
mkdir -p "$out"
pg_cluster_init "$out/pg" >/dev/null
pg_cluster_start "$out/pg" postgres
trap 'pg_cluster_stop "$out/pg"' EXIT
export ENGRAM_BIN=$PWD/$bin ENGRAM_TEST_PG_DSN=$PG_DSN ENGRAM_TEST_PG_BINDIR=$PG_BINDIR
run() {
    (cd "$1" && /usr/bin/python3 -m pytest -q -s -p no:cacheprovider "${@:2}") 2>&1 |
        grep -E "^(hostile metadata|pings meanwhile|large answers|held row|large batches)" ||
        die "the scenario $2 printed no figures (see it with: cd $1 && pytest -s $2)"
}
run tests/integration test_field_limits.py -k hostile
run tests/reliability test_budgets.py -k large_answers_pipelined
run tests/reliability test_write_isolation.py
