#!/usr/bin/env bash
# bench/run-targets.sh: measures every performance target of bench/README.md end to end and
# writes the results table. Self-contained: builds a release engramd and engram-bench into
# build-bench/, starts its own PostgreSQL cluster and its own engramd (ports 7520/7521, so a
# deploy/run server on 7420 is left alone), loads the data sets (reused on later runs),
# runs every workload, restarts engramd to time the restart, stops everything.
#
#   bench/run-targets.sh                 # results in var/bench/
#   BENCH_OUT=/tmp/b bench/run-targets.sh
#   BENCH_DURATION=30 BENCH_WARMUP=5 bench/run-targets.sh
#   BENCH_SECTIONS=datasets bench/run-targets.sh   # only the data sets x engines table
#
# Settings (environment): BENCH_OUT, BENCH_DURATION (15 s per run), BENCH_WARMUP (3 s),
# BENCH_RESTARTS (3), BENCH_WAIT_QUIET (25: before each run wait until the machine is less
# than 25% busy, as other work would compete with the run), BENCH_WAIT_QUIET_MAX (120 s),
# BENCH_ATTEMPTS (3) and BENCH_NOISE (0.3): a row is run again, up to BENCH_ATTEMPTS times,
# while processes other than engramd, PostgreSQL and engram-bench used more than
# BENCH_NOISE cores during it, and the least disturbed attempt is kept,
# BENCH_RPC_PORT / BENCH_HTTP_PORT (7520 / 7521), FAISS_PREFIX (a ready FAISS build),
# BENCH_SECTIONS ("targets writes datasets": which parts run), BENCH_ENGRAMD (measure this
# engramd instead of the tree's release build), BENCH_DATASETS (the data sets of the
# datasets part: "gaussian anisotropic spectral relu clustered text"), BENCH_ENGINES ("native
# faiss"), BENCH_DS_DURATION / BENCH_DS_WARMUP (10 / 2 s per data-set row),
# BENCH_TEXT_DATASET (the text data set's directory: $ENGRAM_TEXT_DATASET, else
# $BENCH_OUT/text; made by bench/text-dataset.sh when missing, a few minutes once).
#
# Outputs in $BENCH_OUT: one JSON per row (engram-bench --json-out), PNG charts, engramd's
# log, restart probes, targets.md (the table), writes.md (stores over 1 to 1,000 tenants,
# store_batch: PostgreSQL's CPU and WAL bytes per memory), datasets.md and datasets.png (recall and
# latency per data set and index engine). The data sets stay in $BENCH_OUT/pg and
# are reused by the next run (delete $BENCH_OUT to start from nothing). Server and load
# generator share the machine, as the targets assume.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
cd "$ENGRAM_ROOT"

OUT=${BENCH_OUT:-var/bench}
DURATION=${BENCH_DURATION:-15}
WARMUP=${BENCH_WARMUP:-3}
RESTARTS=${BENCH_RESTARTS:-3}
QUIET=${BENCH_WAIT_QUIET:-25}       # wait for the machine to be below this % busy ...
QUIET_MAX=${BENCH_WAIT_QUIET_MAX:-120} # ... for at most this many seconds before each run
ATTEMPTS=${BENCH_ATTEMPTS:-3}           # runs per row at most, while the machine is noisy
NOISE=${BENCH_NOISE:-0.3}               # cores of other work that make a run noisy
RPC_PORT=${BENCH_RPC_PORT:-7520}
HTTP_PORT=${BENCH_HTTP_PORT:-7521}
SECTIONS=${BENCH_SECTIONS:-targets writes datasets}
BUILD=build-bench
want() { [[ " ${SECTIONS//,/ } " == *" $1 "* ]]; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# ---- build ------------------------------------------------------------------------------
install_deps
if [ -n "${FAISS_PREFIX:-}" ] && [ -f "$FAISS_PREFIX/.complete" ]; then
    log "using FAISS from $FAISS_PREFIX"
else
    build_faiss
fi
# A release build (-O3).
build_engram "$BUILD" --buildtype=release
# BENCH_ENGRAMD: another engramd to measure (an earlier commit's release build, for a
# before/after table) with this tree's engram-bench
ENGRAMD="${BENCH_ENGRAMD:-$ENGRAM_ROOT/$BUILD/server/engramd}"
BENCH="$ENGRAM_ROOT/$BUILD/bench/engram-bench"

# ---- database and server ------------------------------------------------------------------
pg_cluster_init "$OUT/pg"
pg_cluster_start "$OUT/pg" engram_bench
DSN=$PG_DSN
DATA_DIR="$OUT/data"
VACUUM_DB=engram_bench
mkdir -p "$OUT/data"
ENGRAMD_PID=
stop_engramd() {
    [ -n "$ENGRAMD_PID" ] || return 0
    kill -TERM "$ENGRAMD_PID" 2>/dev/null || true
    wait "$ENGRAMD_PID" 2>/dev/null || true
    ENGRAMD_PID=
}
cleanup() {
    stop_engramd
    pg_cluster_stop "$OUT/pg"
}
trap cleanup EXIT

# Starts engramd in the background; sets ENGRAMD_PID and START_NS (just before exec).
# Unlimited premium rate and memory count: the benchmark measures the engine, not the
# tier's budget (the rate limiter alone would cap one tenant at 5,000 requests/s).
# Extra arguments go to engramd.
start_engramd() {
    START_NS=$(date +%s%N)
    "$ENGRAMD" --pg-dsn "$DSN" --rpc-port "$RPC_PORT" --http-port "$HTTP_PORT" \
        --data-dir "$DATA_DIR" --admin-key-file "$OUT/admin.key" \
        --premium-rate-per-s 0 --premium-max-memories 0 --log-level warn "$@" \
        >>"$OUT/engramd.log" 2>&1 &
    ENGRAMD_PID=$!
}

healthy() {
    python3 - "$HTTP_PORT" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
}

wait_ready() {
    local i
    for i in $(seq 1 600); do
        healthy && return 0
        kill -0 "$ENGRAMD_PID" 2>/dev/null || die "engramd exited, see $OUT/engramd.log"
        sleep 0.1
    done
    die "engramd did not become healthy, see $OUT/engramd.log"
}


# Waits (at most QUIET_MAX s) until the machine is less than QUIET % busy over a second;
# prints the last busy share (0..1).
wait_quiet() {
    python3 - "$QUIET" "$QUIET_MAX" <<'PY'
import sys, time
def sample():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)
limit, deadline = float(sys.argv[1]) / 100, time.time() + float(sys.argv[2])
while True:
    b0, t0 = sample(); time.sleep(1); b1, t1 = sample()
    busy = (b1 - b0) / max(t1 - t0, 1)
    if busy < limit or time.time() >= deadline:
        print(f"{busy:.3f}")
        break
PY
}

# The CPU (in cores) that neither engramd, PostgreSQL nor engram-bench used during the
# noisiest run of a JSON report: other work on this shared machine (plus kernel time not
# charged to a process, such as loopback softirqs). -1 when unknown.
interference() {
    python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
worst = -1.0
for r in d["runs"]:
    c = r["cpu"]
    if c.get("machine_busy") is None:
        continue
    other = c["machine_busy"] * c["cores"] - sum(c.get(k) or 0 for k in
                                                 ("server_cores", "postgres_cores", "client_cores"))
    worst = max(worst, other)
print(f"{worst:.2f}")
PY
}

# bench NAME ARGS...: one row. Runs engram-bench up to ATTEMPTS times while other work on
# the machine took more than NOISE cores during a run, and keeps the least disturbed run
# as NAME.{json,txt,cmd,*.png}; the others stay in attempts/.
bench() {
    local name=$1 a n best_a=0 best_n=1000
    shift
    echo "engram-bench $*" >"$OUT/$name.cmd"
    mkdir -p "$OUT/attempts"
    for a in $(seq 1 "$ATTEMPTS"); do
        log "row $name (attempt $a): engram-bench $*"
        [ -z "${WAL_ROWS:-}" ] || wal_start "$OUT/attempts/$name.a$a"
        "$BENCH" --port "$RPC_PORT" --http-port "$HTTP_PORT" --admin-key-file "$OUT/admin.key" \
            --state-file "$OUT/engram-bench.state" --server-pid "$ENGRAMD_PID" \
            --pg-pid "$(head -n 1 "$OUT/pg/data/postmaster.pid")" --wait-quiet "$QUIET" \
            --wait-quiet-max "$QUIET_MAX" --reuse --json-out "$OUT/attempts/$name.a$a.json" \
            --plot-prefix "$OUT/attempts/$name.a$a" "$@" | tee "$OUT/attempts/$name.a$a.txt"
        [ -z "${WAL_ROWS:-}" ] || wal_stop "$OUT/attempts/$name.a$a"
        vacuum
        n=$(interference "$OUT/attempts/$name.a$a.json")
        log "row $name (attempt $a): other work took $n cores"
        if python3 -c "import sys; sys.exit(0 if $n < $best_n else 1)"; then
            best_a=$a
            best_n=$n
        fi
        python3 -c "import sys; sys.exit(0 if $n <= $NOISE else 1)" && break
    done
    for f in "$OUT/attempts/$name.a$best_a".* "$OUT/attempts/$name.a$best_a"-*; do
        [ -e "$f" ] && cp "$f" "$OUT/$name${f#"$OUT/attempts/$name.a$best_a"}"
    done
    echo "{\"attempt\": $best_a, \"attempts\": $a, \"other_cores\": $best_n}" \
        >"$OUT/$name.attempt"
}

# Write rows delete what they stored (--reuse keeps the data sets as loaded); vacuum
# right away so autovacuum does not run into the next row's measurement.
vacuum() {
    pg_as_owner "$PG_BINDIR/psql" -h "$OUT/pg/run" -U postgres -d "$VACUUM_DB" -qAtc \
        'VACUUM' >/dev/null 2>&1 || log "VACUUM failed (ignored)"
}

T=(--duration "$DURATION" --warmup "$WARMUP")

# WAL per stored memory (the writes part, WAL_ROWS set): during a run one psql samples,
# twice a second, PostgreSQL's clock, its WAL position and the memory ids handed out so far
# (every tenant's memory_id_last, which deletes do not move) into ATTEMPT.walsamples;
# wal_stop ATTEMPT then writes ATTEMPT.wal (JSON): both interpolated at the measurement
# window's ends (window_unix_ns in the report), and the load average when the run began.
wal_start() {
    rm -f "$1.walstop"
    cut -d' ' -f1 /proc/loadavg >"$1.load1"
    while [ ! -e "$1.walstop" ]; do
        echo "SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint,"
        echo "  pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'),"
        echo "  (SELECT COALESCE(sum(memory_id_last), 0) FROM tenants);"
        sleep 0.5
    done | pg_as_owner "$PG_BINDIR/psql" -h "$OUT/pg/run" -U postgres -d "$VACUUM_DB" -qAt \
        -F ' ' >"$1.walsamples" 2>/dev/null &
    WAL_PID=$!
}
wal_stop() {
    touch "$1.walstop"
    wait "$WAL_PID" 2>/dev/null || true
    rm -f "$1.walstop"
    python3 - "$1" <<'PY'
import json, sys
a = sys.argv[1]
pts = []
for line in open(a + ".walsamples"):
    f = line.split()
    if len(f) == 3:
        pts.append((int(f[0]), float(f[1]), float(f[2])))
r = json.load(open(a + ".json"))["runs"][0]
t0, t1 = r["window_unix_ns"]
def at(t, k):  # linear between the samples around t
    for (ta, *va), (tb, *vb) in zip(pts, pts[1:]):
        if ta <= t <= tb:
            return va[k] + (vb[k] - va[k]) * (t - ta) / max(tb - ta, 1)
    return float("nan")
wal, ids = at(t1, 0) - at(t0, 0), at(t1, 1) - at(t0, 1)
json.dump({"wal_bytes": wal, "memories": ids,
           "wal_bytes_per_memory": wal / ids if ids > 0 else None,
           "load1_at_start": float(open(a + ".load1").read())}, open(a + ".wal", "w"))
PY
}

# The targets part (everything down to targets.md) runs when BENCH_SECTIONS names it.
if want targets; then
start_engramd
wait_ready
log "engramd (release) pid $ENGRAMD_PID on 127.0.0.1:$RPC_PORT, results in $OUT"

# ---- searches -----------------------------------------------------------------------------
bench search-50k-c1 --workload search --memories 50000 --dim 768 --connections 1 "${T[@]}"
bench search-50k-sweep --workload search --memories 50000 --dim 768 \
    --sweep-concurrency 1,2,4,8,16 "${T[@]}"
bench search-5k-c1 --workload search --memories 5000 --dim 768 --connections 1 "${T[@]}"
bench search-100-c1 --workload search --memories 100 --dim 768 --connections 1 "${T[@]}"
bench search-100-tput --workload search --memories 100 --dim 768 --connections 16 --depth 4 \
    "${T[@]}"

# ---- writes -------------------------------------------------------------------------------
bench store-c1 --workload store --memories 5000 --dim 768 --connections 1 "${T[@]}"
bench store-c16 --workload store --memories 5000 --dim 768 --connections 16 "${T[@]}"
bench store-batch --workload store_batch --memories 5000 --dim 768 --batch-size 1000 \
    --connections 2 "${T[@]}"

# ---- diagnostics (no target): the RPC floor, and writes spread over tenants ----------------
bench ping-c1 --workload ping --memories 100 --dim 768 --connections 1 "${T[@]}"
bench store-c16-t8 --workload store --tenants 8 --memories 5000 --dim 768 --connections 16 \
    "${T[@]}"
bench store-batch-t2 --workload store_batch --tenants 2 --memories 5000 --dim 768 \
    --batch-size 1000 --connections 2 "${T[@]}"

# ---- restart with 10 tenants x 50,000 x 768 -------------------------------------------------
# tenant 0 is the data set of the 50k rows above; tenants 1..9 are loaded once and reused
bench restart-load --workload load --tenants 10 --memories 50000 --dim 768
# First use of the ten tenants by the running server: the nine that were only written to
# have no index yet and are built from PostgreSQL (then snapshotted); a diagnostic.
probe_all() {
    "$BENCH" --port "$RPC_PORT" --http-port "$HTTP_PORT" --state-file "$OUT/engram-bench.state" \
        --tenants 10 --memories 50000 --dim 768 --probe-ready 300
}
# Prints the index loads so far as JSON: {"snapshot": [count, seconds], "database": [...]}.
index_loads() {
    python3 - "$HTTP_PORT" <<'PY'
import json, sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5) as r:
    text = r.read().decode()
out = {"snapshot": [0, 0.0], "database": [0, 0.0]}
for line in text.splitlines():
    for src in out:
        for i, kind in enumerate(("count", "sum")):
            if line.startswith(f'engram_index_load_duration_seconds_{kind}{{source="{src}"}} '):
                out[src][i] = float(line.split()[-1])
print(json.dumps(out))
PY
}
COLD_NS=$(date +%s%N)
before=$(index_loads)
cold=$(probe_all) || die "engramd did not serve the ten tenants, see $OUT/engramd.log"
echo "{\"start_unix_ns\": $COLD_NS, \"probe\": $cold, \"loads_before\": $before," \
    "\"loads_after\": $(index_loads)}" >"$OUT/first-use.json"
log "first use of 10 tenants: $cold"
: >"$OUT/restart.jsonl"
for i in $(seq 1 "$RESTARTS"); do
    stop_engramd
    sync
    busy=$(wait_quiet)
    start_engramd
    probe=$(probe_all) || die "restart $i: engramd did not serve, see $OUT/engramd.log"
    echo "{\"start_unix_ns\": $START_NS, \"busy_before\": $busy, \"probe\": $probe}" \
        >>"$OUT/restart.jsonl"
    log "restart $i: $probe (started at $START_NS)"
done
curl_metrics() {
    python3 - "$HTTP_PORT" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5) as r:
    for line in r.read().decode().splitlines():
        if line.startswith(("engram_process_resident_bytes", "engram_index_vectors",
                            "engram_index_bytes", "engram_indexes_loaded")):
            print(line)
PY
}
curl_metrics >"$OUT/restart-metrics.txt"

# ---- a cold tenant of 5,000 x 768 -----------------------------------------------------------
# A tenant coming in cold on a running server: engramd with a 1 MiB index budget (it
# preloads nothing and evicts every index about a second after its use, snapshotting it)
# and one background thread, warmed up by loading another tenant first. A new tenant every
# run (loaded with store_batch, never searched: no index yet): its first search builds the
# index from PostgreSQL; after each eviction the next search loads its snapshot. The load
# durations are engramd's own (its metrics); the tenant is deleted after.
COLD_PREFIX="cold$(date +%s)"
COLD_TENANT="$COLD_PREFIX-v2-s1-n5000-d768-0"
probe_one() { # probe_one PREFIX MEMORIES
    "$BENCH" --port "$RPC_PORT" --http-port "$HTTP_PORT" --state-file "$OUT/engram-bench.state" \
        --tenant-prefix "$1" --tenants 1 --memories "$2" --dim 768 --probe-ready 60
}
evictions() {
    python3 - "$HTTP_PORT" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5) as r:
    for line in r.read().decode().splitlines():
        if line.startswith("engram_index_evictions_total "):
            print(int(float(line.split()[1])))
PY
}
wait_evicted() { # until evictions() passes $1 (at most 15 s)
    local i
    for i in $(seq 1 150); do
        [ "$(evictions)" -gt "$1" ] && return 0
        sleep 0.1
    done
    die "cold tenant: no eviction within 15 s, see $OUT/engramd.log"
}
stop_engramd
start_engramd --index-memory-mb 1 --bg-threads 1
wait_ready
probe_one bench 100 >/dev/null || die "cold tenant: warm-up failed, see $OUT/engramd.log"
"$BENCH" --port "$RPC_PORT" --http-port "$HTTP_PORT" --admin-key-file "$OUT/admin.key" \
    --state-file "$OUT/engram-bench.state" --tenant-prefix "$COLD_PREFIX" --reuse --quiet \
    --workload load --tenants 1 --memories 5000 --dim 768 >/dev/null
: >"$OUT/cold.jsonl"
for i in 0 $(seq 1 "$RESTARTS"); do
    ev=$(evictions)
    busy=$(wait_quiet)
    before=$(index_loads)
    probe=$(probe_one "$COLD_PREFIX" 5000) || die "cold tenant: no answer, see $OUT/engramd.log"
    echo "{\"busy_before\": $busy, \"probe\": $probe, \"loads_before\": $before," \
        "\"loads_after\": $(index_loads)}" >>"$OUT/cold.jsonl"
    wait_evicted "$ev"
done
"$ENGRAM_ROOT/$BUILD/client/engram" --port "$RPC_PORT" --key-file "$OUT/admin.key" \
    admin tenant delete "$COLD_TENANT" >/dev/null || log "could not delete $COLD_TENANT"
sed -i "/^$COLD_TENANT /d" "$OUT/engram-bench.state"
stop_engramd

# ---- the table ------------------------------------------------------------------------------
python3 - "$OUT" <<'PY'
import json, os, statistics, sys

out = sys.argv[1]


def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        return json.load(f)


def run_at(d, conns):
    return next(r for r in d["runs"] if r["connections"] == conns)


def op(run, name):
    return run["ops"][name]


def cmd(name):
    with open(os.path.join(out, name + ".cmd")) as f:
        return f.read().strip()


def le(value, target, unit, fmt="{:.3f}"):
    v = fmt.format(value) + unit
    if value <= target:
        return v, "met"
    return v, f"missed, {value / target:.1f}x the target ({fmt.format(value - target)}{unit} over)"


def ge(value, target, unit, fmt="{:,.0f}"):
    v = fmt.format(value) + unit
    if value >= target:
        return v, "met"
    return v, f"missed, reached {value / target * 100:.0f}% of the target"


rows = []


def attempt_note(names):
    parts = []
    for n in names:
        p = os.path.join(out, n + ".attempt")
        if os.path.exists(p):
            a = json.load(open(p))
            parts.append(f"{n}: attempt {a['attempt']} of {a['attempts']}, other work "
                         f"{max(a['other_cores'], 0):.2f} cores")
    return "; ".join(parts)


def add(workload, target, checks, run, name, extra=""):
    meas = "; ".join(f"{label} {v}" for label, (v, _) in checks)
    verdict = "; ".join(f"{label}: {s}" if s != "met" else f"{label} met"
                        for label, (_, s) in checks)
    cpu = run["cpu"] if run else None
    if cpu and cpu.get("machine_busy") is not None:
        extra += (f" cpu: machine {cpu['machine_busy'] * 100:.0f}% of {cpu['cores']} cores"
                  f" (engramd {cpu['server_cores'] or 0:.2f}, postgres "
                  f"{cpu['postgres_cores'] or 0:.2f}, engram-bench {cpu['client_cores'] or 0:.2f};"
                  f" busy before {(cpu['background_busy_before'] or 0) * 100:.0f}%)")
    note = attempt_note([n.strip() for n in name.split(",")])
    if note:
        extra += f" [{note}]"
    rows.append((workload, target, meas, verdict, name, extra.strip()))


d = load("search-50k-c1"); r = d["runs"][0]; s = op(r, "search")
add("50,000 x 768 search, one client", "p50 <= 1.0 ms, p99 <= 2.5 ms, recall@10 >= 0.98",
    [("p50", le(s["latency_ms"]["p50"], 1.0, " ms")), ("p99", le(s["latency_ms"]["p99"], 2.5, " ms")),
     ("recall@10", ge(s["recall_at_k"], 0.98, "", "{:.4f}"))], r, "search-50k-c1",
    f"{s['throughput_rps']:,.0f} req/s; server-side mean {s['server_mean_ms']:.3f} ms.")

d = load("search-50k-sweep"); r = run_at(d, 8); s = op(r, "search")
add("50,000 x 768 search, 8 clients", ">= 1,500 queries/s with p99 <= 10 ms",
    [("throughput", ge(s["throughput_rps"], 1500, " q/s")), ("p99", le(s["latency_ms"]["p99"], 10, " ms"))],
    r, "search-50k-sweep",
    "sweep: " + ", ".join(f"{x['connections']} conn {x['throughput_rps']:,.0f} q/s p99 "
                          f"{x['latency_ms']['p99']:.1f} ms" for x in d["runs"]) + ".")

d = load("search-5k-c1"); r = d["runs"][0]; s = op(r, "search")
add("5,000 x 768 search", "p50 <= 0.3 ms, recall 1.0",
    [("p50", le(s["latency_ms"]["p50"], 0.3, " ms")), ("recall@10", ge(s["recall_at_k"], 1.0, "", "{:.4f}"))],
    r, "search-5k-c1", f"p99 {s['latency_ms']['p99']:.3f} ms.")

d1 = load("search-100-c1"); r1 = d1["runs"][0]; s1 = op(r1, "search")
d2 = load("search-100-tput"); r2 = d2["runs"][0]; s2 = op(r2, "search")
add("100 x 768 search", "p50 <= 0.15 ms; >= 20,000 requests/s",
    [("p50 (1 client)", le(s1["latency_ms"]["p50"], 0.15, " ms")),
     ("throughput (16 conn x depth 4)", ge(s2["throughput_rps"], 20000, " req/s"))],
    r2, "search-100-c1, search-100-tput",
    f"one client {s1['throughput_rps']:,.0f} req/s; at 16x4 p50 {s2['latency_ms']['p50']:.2f} ms,"
    f" p99 {s2['latency_ms']['p99']:.2f} ms.")

d1 = load("store-c1"); r1 = d1["runs"][0]; s1 = op(r1, "store")
d2 = load("store-c16"); r2 = d2["runs"][0]; s2 = op(r2, "store")
add("store, one memory, durable", "p50 <= 1 ms; >= 3,000/s with concurrent clients",
    [("p50 (1 client)", le(s1["latency_ms"]["p50"], 1.0, " ms")),
     ("throughput (16 clients)", ge(s2["throughput_rps"], 3000, "/s"))],
    r2, "store-c1, store-c16",
    f"one client {s1['throughput_rps']:,.0f}/s; at 16 clients p50 {s2['latency_ms']['p50']:.2f} ms,"
    f" p99 {s2['latency_ms']['p99']:.2f} ms.")

d = load("store-batch"); r = d["runs"][0]; s = op(r, "store_batch")
loads = [load(n)["load"] for n in ("search-50k-c1", "restart-load") if load(n)["load"]["memories"]]
lt = ", ".join(f"{l['memories_per_s']:,.0f}/s loading {l['memories']:,} memories" for l in loads)
add("store_batch", ">= 10,000 memories/s",
    [("throughput", ge(s["memories_per_s"], 10000, " memories/s"))], r, "store-batch",
    f"batches of 1000, 2 connections; batch p50 {s['latency_ms']['p50']:.0f} ms."
    + (f" Data-set loads: {lt}." if lt else ""))

restarts = []
with open(os.path.join(out, "restart.jsonl")) as f:
    for line in f:
        x = json.loads(line)
        restarts.append(((x["probe"]["healthz_unix_ns"] - x["start_unix_ns"]) / 1e9,
                         (x["probe"]["all_tenants_unix_ns"] - x["start_unix_ns"]) / 1e9,
                         x["busy_before"]))
worst = max(t for _, t, _ in restarts)
med = statistics.median(t for _, t, _ in restarts)
with open(os.path.join(out, "restart-metrics.txt")) as f:
    met = dict(line.split()[:2] for line in f if line.strip())
rss = float(met.get("engram_process_resident_bytes", "nan")) / 2**30
add("restart with 10 tenants x 50,000 x 768", "serving in <= 5 s",
    [("time until all 10 tenants answered a search (median)", le(med, 5.0, " s", "{:.2f}")),
     ("worst", le(worst, 5.0, " s", "{:.2f}"))], None, "restart-load, restart.jsonl",
    "runs (healthz 200 / all ten tenants answered; machine busy before): "
    + ", ".join(f"{h:.2f}/{t:.2f} s ({b * 100:.0f}%)" for h, t, b in restarts)
    + f"; resident afterwards {rss:.2f} GiB, {float(met.get('engram_index_vectors', 0)):,.0f}"
      " vectors.")
with open(os.path.join(out, "first-use.json")) as f:
    fu = json.load(f)
first_use = (fu["probe"]["all_tenants_unix_ns"] - fu["start_unix_ns"]) / 1e9


def load_delta(x, src):
    """(loads, seconds) of source between a record's loads_before and loads_after."""
    return (int(x["loads_after"][src][0] - x["loads_before"][src][0]),
            x["loads_after"][src][1] - x["loads_before"][src][1])


fu_db, fu_snap = load_delta(fu, "database"), load_delta(fu, "snapshot")
cold_db, cold_snap = [], []
with open(os.path.join(out, "cold.jsonl")) as f:
    for line in f:
        x = json.loads(line)
        answered = (x["probe"]["all_tenants_unix_ns"] - x["probe"]["healthz_unix_ns"]) / 1e9
        # healthz answers at once on a running server: this is the search's wait
        for src, into in (("database", cold_db), ("snapshot", cold_snap)):
            n, secs = load_delta(x, src)
            if n:
                into.append((secs / n * 1000, n, answered * 1000))

diag = []
d = load("ping-c1"); r = d["runs"][0]; s = op(r, "ping")
diag.append(f"ping, one client (the RPC path without database or index): p50 "
            f"{s['latency_ms']['p50'] * 1000:.0f} us, p99 {s['latency_ms']['p99'] * 1000:.0f} us, "
            f"{s['throughput_rps']:,.0f} req/s, engram-bench {r['cpu']['client_cores']:.2f} cores")
d = load("store-c16-t8"); r = d["runs"][0]; s = op(r, "store")
diag.append(f"store, 16 clients over 8 tenants: {s['throughput_rps']:,.0f}/s, p50 "
            f"{s['latency_ms']['p50']:.2f} ms, p99 {s['latency_ms']['p99']:.2f} ms, postgres "
            f"{r['cpu']['postgres_cores'] or 0:.2f} cores")
d = load("store-batch-t2"); r = d["runs"][0]; s = op(r, "store_batch")
diag.append(f"store_batch, 2 connections over 2 tenants: {s['memories_per_s']:,.0f} memories/s, "
            f"postgres {r['cpu']['postgres_cores'] or 0:.2f} cores")

with open(os.path.join(out, "targets.md"), "w") as f:
    f.write("| workload | target | measured | verdict |\n|---|---|---|---|\n")
    for w, t, m, v, _, _ in rows:
        f.write(f"| {w} | {t} | {m} | {v} |\n")
    f.write("\nNotes per row:\n\n")
    for w, _, _, _, n, e in rows:
        f.write(f"- {w} ({n}): {e}\n")
    f.write("\nDiagnostics (no target):\n\n")
    for x, n in zip(diag, ("ping-c1", "store-c16-t8", "store-batch-t2")):
        f.write(f"- {x} [{attempt_note([n])}]\n")
    f.write(f"- first use of the ten tenants by the running server: all answered after "
            f"{first_use:.2f} s; indexes built from PostgreSQL meanwhile: {fu_db[0]}"
            + (f" ({fu_db[1] / fu_db[0]:.2f} s each)" if fu_db[0] else "")
            + f", loaded from snapshots: {fu_snap[0]}"
            + (f" ({fu_snap[1] / fu_snap[0]:.2f} s each)" if fu_snap[0] else "")
            + " (tenants whose index a previous run snapshotted are preloaded at start)"
            " [first-use.json]\n")
    fmt = lambda xs: ", ".join(f"{ms:.0f} ms" + (f" ({n} loads)" if n > 1 else "")
                               + f" (answered in {a:.0f} ms)" for ms, n, a in xs)
    f.write(f"- cold tenant of 5,000 x 768 on a running server: index built from PostgreSQL "
            f"on its first search in {fmt(cold_db) or 'n/a'}; after each eviction, loaded "
            f"from its snapshot in {fmt(cold_snap) or 'n/a'} (load durations from engramd's "
            f"metrics; the probe's search is answered after the load) [cold.jsonl]\n")
    f.write("\nCommands (the script adds --port, --http-port, --admin-key-file, --state-file, "
            "--server-pid, --pg-pid, --wait-quiet, --wait-quiet-max, --reuse, --json-out and "
            "--plot-prefix):\n\n")
    for name in ("search-50k-c1", "search-50k-sweep", "search-5k-c1", "search-100-c1",
                 "search-100-tput", "store-c1", "store-c16", "store-batch", "ping-c1",
                 "store-c16-t8", "store-batch-t2", "restart-load"):
        f.write(f"    {cmd(name)}\n")
print(open(os.path.join(out, "targets.md")).read())
PY
log "table written to $OUT/targets.md"
fi # want targets

# ---- writes: durable stores over a mix of tenants -------------------------------------------
# 16 clients' stores spread over 1, 8, 100 and 1,000 tenants (one connection per tenant, at
# most 16 requests in flight over all of them: --inflight), one client, and store_batch;
# with PostgreSQL's CPU and the WAL written per stored memory. Tenants of their own (prefix
# mix, 100 memories each; what a run stores is deleted after it, outside the window).
if want writes; then
stop_engramd
start_engramd --max-connections-per-address 0
wait_ready
log "engramd (release) pid $ENGRAMD_PID for the writes rows, results in $OUT/writes.md"
WAL_ROWS=1
MIX=(--tenant-prefix mix --memories 100 --dim 768)
bench w-store-c1 --workload store "${MIX[@]}" --connections 1 "${T[@]}"
for nt in 1 8 100 1000; do
    conns=$((nt > 16 ? nt : 16))
    bench "w-store-t$nt" --workload store "${MIX[@]}" --tenants "$nt" --connections "$conns" \
        --inflight 16 "${T[@]}"
done
bench w-batch-t1 --workload store_batch "${MIX[@]}" --batch-size 1000 --connections 2 "${T[@]}"
bench w-batch-t2 --workload store_batch "${MIX[@]}" --tenants 2 --batch-size 1000 \
    --connections 2 "${T[@]}"
WAL_ROWS=
stop_engramd
python3 - "$OUT" <<'PY'
import json, os, sys

out = sys.argv[1]
rows = [("w-store-c1", "store, 1 client, 1 tenant"),
        ("w-store-t1", "store, 16 clients, 1 tenant"),
        ("w-store-t8", "store, 16 clients over 8 tenants"),
        ("w-store-t100", "store, 16 clients over 100 tenants"),
        ("w-store-t1000", "store, 16 clients over 1,000 tenants"),
        ("w-batch-t1", "store_batch of 1,000, 2 connections, 1 tenant"),
        ("w-batch-t2", "store_batch of 1,000, 2 connections over 2 tenants")]
with open(os.path.join(out, "writes.md"), "w") as f:
    f.write("| workload | memories/s | p50 ms | p99 ms | engramd cores | PostgreSQL cores | "
            "WAL bytes per memory | load (1 min) at start | other work (cores) |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    for name, what in rows:
        p = os.path.join(out, name + ".json")
        if not os.path.exists(p):
            f.write(f"| {what} | not run | | | | | | | |\n")
            continue
        r = json.load(open(p))["runs"][0]
        op = "store_batch" if "batch" in name else "store"
        s = r["ops"][op]
        rate = s.get("memories_per_s") or s["throughput_rps"]
        w = json.load(open(os.path.join(out, name + ".wal")))
        a = json.load(open(os.path.join(out, name + ".attempt")))
        wal = w["wal_bytes_per_memory"] or float("nan")
        c = r["cpu"]
        f.write(f"| {what} | {rate:,.0f} | {s['latency_ms']['p50']:.2f} | "
                f"{s['latency_ms']['p99']:.2f} | {c.get('server_cores') or 0:.2f} | "
                f"{c.get('postgres_cores') or 0:.2f} | {wal:,.0f} | {w['load1_at_start']} | "
                f"{a['other_cores']} |\n")
    f.write("\nCommands (the script adds --port, --http-port, --admin-key-file, --state-file, "
            "--server-pid, --pg-pid, --wait-quiet, --wait-quiet-max, --reuse, --json-out and "
            "--plot-prefix):\n\n")
    for name, _ in rows:
        p = os.path.join(out, name + ".cmd")
        if os.path.exists(p):
            f.write("    " + open(p).read().strip() + "\n")
print(open(os.path.join(out, "writes.md")).read())
PY
log "writes table written to $OUT/writes.md"
fi # want writes

# ---- data sets x index engines ---------------------------------------------------------------
# Search quality and latency on every data set (bench/dataset.h) with each index engine: one
# client, top-10, 50,000 x 768 for the synthetic sets and the whole text set at its own 384
# dimensions; 8 clients on gaussian and text. Its own database (engram_datasets) and data
# directory, so these tenants neither load into nor slow down the targets' restarts. A row
# that fails (an engine the server does not offer: admin.tenant.create refuses
# index_engine) is marked in the table and the run goes on.
if want datasets; then
DATASETS=${BENCH_DATASETS:-gaussian anisotropic spectral relu clustered text}
ENGINES=${BENCH_ENGINES:-native faiss}
DS_T=(--duration "${BENCH_DS_DURATION:-10}" --warmup "${BENCH_DS_WARMUP:-2}")
TEXT_DIR=${BENCH_TEXT_DATASET:-${ENGRAM_TEXT_DATASET:-$OUT/text}}
export ENGRAM_TEXT_DATASET="$TEXT_DIR"
TEXT_N=
if [[ " $DATASETS " == *" text "* ]]; then
    if "$ENGRAM_ROOT/bench/text-dataset.sh" "$TEXT_DIR"; then
        TEXT_N=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vectors'])" \
            "$TEXT_DIR/dataset.json")
    else
        log "the text data set could not be made: its rows are marked failed"
    fi
fi
# Does this engramd know index engines? Without the setting, the native rows run on the
# server's only engine without sending index_engine, and the table says so.
ENGINE_OPT=0
"$ENGRAMD" --help 2>&1 | grep -q -- '--index-engine' && ENGINE_OPT=1

pg_cluster_start "$OUT/pg" engram_datasets
DSN=$PG_DSN
DATA_DIR="$OUT/data-datasets"
VACUUM_DB=engram_datasets
mkdir -p "$DATA_DIR"
start_engramd
wait_ready
log "engramd (release) pid $ENGRAMD_PID for the data sets, results in $OUT/datasets.md"

# ds_row NAME ARGS...: one data-set row, as bench() but a failing engram-bench is recorded in
# NAME.failed (its last message) instead of stopping the script.
ds_row() {
    local name=$1 a n best_a=0 best_n=1000
    shift
    echo "engram-bench $*" >"$OUT/$name.cmd"
    rm -f "$OUT/$name.failed" "$OUT/$name.json" "$OUT/$name.attempt"
    mkdir -p "$OUT/attempts"
    for a in $(seq 1 "$ATTEMPTS"); do
        log "row $name (attempt $a): engram-bench $*"
        if ! "$BENCH" --port "$RPC_PORT" --http-port "$HTTP_PORT" \
            --admin-key-file "$OUT/admin.key" --state-file "$OUT/datasets.state" \
            --tenant-prefix ds --server-pid "$ENGRAMD_PID" \
            --pg-pid "$(head -n 1 "$OUT/pg/data/postmaster.pid")" --wait-quiet "$QUIET" \
            --wait-quiet-max "$QUIET_MAX" --reuse --json-out "$OUT/attempts/$name.a$a.json" \
            "$@" >"$OUT/attempts/$name.a$a.txt" 2>"$OUT/attempts/$name.a$a.err"; then
            tail -n 1 "$OUT/attempts/$name.a$a.err" >"$OUT/$name.failed" # the error
            log "row $name failed: $(cat "$OUT/$name.failed")"
            kill -0 "$ENGRAMD_PID" 2>/dev/null || { log "engramd exited; restarting it";
                start_engramd; wait_ready; }
            break
        fi
        cat "$OUT/attempts/$name.a$a.txt"
        vacuum
        n=$(interference "$OUT/attempts/$name.a$a.json")
        log "row $name (attempt $a): other work took $n cores"
        if python3 -c "import sys; sys.exit(0 if $n < $best_n else 1)"; then
            best_a=$a
            best_n=$n
        fi
        python3 -c "import sys; sys.exit(0 if $n <= $NOISE else 1)" && break
    done
    [ "$best_a" -gt 0 ] || return 0
    rm -f "$OUT/$name.failed"
    cp "$OUT/attempts/$name.a$best_a.json" "$OUT/$name.json"
    cp "$OUT/attempts/$name.a$best_a.txt" "$OUT/$name.txt"
    echo "{\"attempt\": $best_a, \"attempts\": $a, \"other_cores\": $best_n}" \
        >"$OUT/$name.attempt"
}

ds_args() { # ds_args DATASET ENGINE: the data set and engine options of a row
    if [ "$1" = text ]; then # its own size and dimension
        echo "--dataset text --memories ${TEXT_N:-1}"
    else
        echo "--dataset $1 --memories 50000 --dim 768"
    fi
    if [ "$2" = faiss ] || [ "$ENGINE_OPT" = 1 ]; then echo "--index-engine $2"; fi
}
: >"$OUT/datasets.rows"
for ds in $DATASETS; do
    for eng in $ENGINES; do
        name="ds-$ds-$eng-c1"
        if [ "$ds" = text ] && [ -z "$TEXT_N" ]; then
            echo "the text data set could not be made (bench/text-dataset.sh)" >"$OUT/$name.failed"
        else
            # shellcheck disable=SC2046
            ds_row "$name" --workload search $(ds_args "$ds" "$eng") --connections 1 "${DS_T[@]}"
        fi
        echo "$ds $eng 1 $name" >>"$OUT/datasets.rows"
    done
done
for ds in gaussian text; do
    [[ " $DATASETS " == *" $ds "* ]] || continue
    for eng in $ENGINES; do
        name="ds-$ds-$eng-c8"
        if [ "$ds" = text ] && [ -z "$TEXT_N" ]; then
            echo "the text data set could not be made (bench/text-dataset.sh)" >"$OUT/$name.failed"
        elif [ -f "$OUT/ds-$ds-$eng-c1.failed" ]; then
            cp "$OUT/ds-$ds-$eng-c1.failed" "$OUT/$name.failed" # the same failure again
        else
            # shellcheck disable=SC2046
            ds_row "$name" --workload search $(ds_args "$ds" "$eng") --connections 8 "${DS_T[@]}"
        fi
        echo "$ds $eng 8 $name" >>"$OUT/datasets.rows"
    done
done
stop_engramd

# datasets.md (the table) and datasets.dat / datasets.png (the chart)
python3 - "$OUT" "$ENGINE_OPT" <<'PY'
import json, os, sys

out, engine_opt = sys.argv[1], sys.argv[2] == "1"
rows = [line.split() for line in open(os.path.join(out, "datasets.rows")) if line.strip()]


def result(name):
    p = os.path.join(out, name + ".json")
    if os.path.exists(os.path.join(out, name + ".failed")) or not os.path.exists(p):
        f = os.path.join(out, name + ".failed")
        why = open(f).read().strip() if os.path.exists(f) else "no result"
        return None, why
    d = json.load(open(p))
    r = d["runs"][0]
    s = r["ops"]["search"]
    return {"recall": s["recall_at_k"], "p50": s["latency_ms"]["p50"],
            "p99": s["latency_ms"]["p99"], "rps": s["throughput_rps"],
            "errors": s.get("errors", 0), "n": d["config"]["memories"],
            "dim": d["config"]["dim"], "cos": d["config"].get("mean_cosine")}, ""


engines = []
for _, eng, _, _ in rows:
    if eng not in engines:
        engines.append(eng)
datasets = []
for ds, _, _, _ in rows:
    if ds not in datasets:
        datasets.append(ds)
one = {(ds, eng): result(name) for ds, eng, c, name in rows if c == "1"}
eight = [(ds, eng, result(name)) for ds, eng, c, name in rows if c == "8"]


def eng_label(eng):
    return eng if engine_opt or eng != "native" else "native (server default: no index_engine option)"


def cell(r):
    res, why = r
    if res is None:
        return "failed: " + why.replace("|", "/")[:140], "", ""
    rec = f"{res['recall']:.4f}" if res["recall"] is not None else "n/a"
    return rec, f"{res['p50']:.3f}", f"{res['p99']:.3f}"


with open(os.path.join(out, "datasets.md"), "w") as f:
    f.write("Search, one client, top-10, `similarity_weight: 1.0` (recall@10 against the exact "
            "answer; latency in ms as the client sees it)\n\n")
    head = "| data set | memories x dim | mean pairwise cosine |"
    sep = "|---|---|---|"
    for eng in engines:
        head += f" {eng_label(eng)}: recall@10 | p50 | p99 |"
        sep += "---|---|---|"
    f.write(head + "\n" + sep + "\n")
    for ds in datasets:
        shape, cos = "", ""
        for eng in engines:
            res, _ = one.get((ds, eng), (None, ""))
            if res:
                shape = f"{res['n']:,} x {res['dim']}"
                cos = f"{res['cos']:.3f}" if res["cos"] is not None else ""
        line = f"| {ds} | {shape} | {cos} |"
        for eng in engines:
            rec, p50, p99 = cell(one.get((ds, eng), (None, "not run")))
            line += f" {rec} | {p50} | {p99} |"
        f.write(line + "\n")
    if eight:
        f.write("\nSearch, 8 clients (one request in flight each)\n\n")
        f.write("| data set | engine | searches/s | p50 ms | p99 ms | recall@10 |\n"
                "|---|---|---|---|---|---|\n")
        for ds, eng, (res, why) in eight:
            if res is None:
                f.write(f"| {ds} | {eng_label(eng)} | failed: {why[:140]} | | | |\n")
            else:
                f.write(f"| {ds} | {eng_label(eng)} | {res['rps']:,.0f} | {res['p50']:.3f} | "
                        f"{res['p99']:.3f} | {res['recall']:.4f} |\n")
    f.write("\nCommands (the script adds --port, --http-port, --admin-key-file, --state-file, "
            "--tenant-prefix ds, --server-pid, --pg-pid, --wait-quiet, --wait-quiet-max, --reuse "
            "and --json-out):\n\n")
    for _, _, _, name in rows:
        p = os.path.join(out, name + ".cmd")
        if os.path.exists(p):
            f.write("    " + open(p).read().strip() + "\n")
    f.write("\n![recall and latency per data set](datasets.png)\n")

# chart data: one line per data set; per engine recall, p50, p99 (missing: "-" = NaN)
with open(os.path.join(out, "datasets.dat"), "w") as f:
    f.write("# dataset " + " ".join(f"{e}_recall {e}_p50 {e}_p99" for e in engines) + "\n")
    for ds in datasets:
        vals = []
        for eng in engines:
            res, _ = one.get((ds, eng), (None, ""))
            vals += ([f"{res['recall']:.4f}", f"{res['p50']:.4f}", f"{res['p99']:.4f}"]
                     if res and res["recall"] is not None else ["-", "-", "-"])
        f.write(ds + " " + " ".join(vals) + "\n")
with open(os.path.join(out, "datasets.engines"), "w") as f:  # the engines with a result
    f.write(" ".join(e for e in engines if any(one.get((ds, e), (None,))[0] for ds in datasets))
            + "\n")
print(open(os.path.join(out, "datasets.md")).read())
PY
read -r -a ENG_LIST <"$OUT/datasets.engines" || true
if [ ${#ENG_LIST[@]} -eq 0 ]; then
    log "no data-set row succeeded: no datasets.png"
elif command -v gnuplot >/dev/null 2>&1; then
    term="pngcairo size 1200,480 font ',10'"
    gnuplot -e "set term $term" </dev/null >/dev/null 2>&1 || term="png size 1200,480"
    {
        echo "set term $term; set output '$OUT/datasets.png'"
        echo "set datafile missing '-'; set style data histograms"
        echo "set style histogram clustered gap 1; set style fill solid 0.8 border -1"
        echo "set termoption noenhanced; set key below; set grid ytics; set xtics rotate by -20"
        echo "set multiplot layout 1,2 title 'engramd search, one client, top-10'"
        echo "set title 'recall@10 (engines that ran)'; set yrange [0:1.05]"
        plot="plot"
        for i in "${!ENG_LIST[@]}"; do
            plot+=" '$OUT/datasets.dat' using $((2 + 3 * i)):xtic(1) title '${ENG_LIST[$i]}',"
        done
        echo "${plot%,}"
        echo "set title 'latency (ms)'; set yrange [0:*]; set logscale y; set yrange [0.05:*]"
        plot="plot"
        for i in "${!ENG_LIST[@]}"; do
            plot+=" '$OUT/datasets.dat' using $((3 + 3 * i)):xtic(1) title '${ENG_LIST[$i]} p50',"
            plot+=" '' using $((4 + 3 * i)) title '${ENG_LIST[$i]} p99',"
        done
        echo "${plot%,}"
        echo "unset multiplot"
    } >"$OUT/datasets.gp"
    gnuplot "$OUT/datasets.gp" || log "gnuplot failed: no datasets.png"
fi
log "data sets table written to $OUT/datasets.md"
fi # want datasets
