#!/usr/bin/env bash
# deploy/gen-config-docs.sh [ENGRAMD]: regenerates docs/configuration.md and
# deploy/engramd.conf from the settings table of an engramd binary (default: the first of
# build/, build-test/ that exists). Run it after changing server/core/config.c;
# tests/integration/test_config_reference.py fails while either file differs from what the
# binary generates.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${1:-}
if [ -z "$bin" ]; then
    for b in "$root/build/server/engramd" "$root/build-test/server/engramd"; do
        if [ -x "$b" ]; then bin=$b; break; fi
    done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "usage: $0 [path of engramd]" >&2; exit 2; }
# no ENGRAM_* variable may leak into the reference (it shows defaults only)
env -u ENGRAM_CONFIG "$bin" --print-config=markdown >"$root/docs/configuration.md"
env -u ENGRAM_CONFIG "$bin" --print-config=ini >"$root/deploy/engramd.conf"
echo "wrote docs/configuration.md and deploy/engramd.conf from $bin"
