#!/usr/bin/env bash
# bench/text-dataset.sh: the benchmark's `text` data set: real English sentences embedded by
# a model trained here, offline.
#
#   bench/text-dataset.sh OUTDIR
#
# 1. Takes the package descriptions of `apt-cache dumpavail` (after `apt-get update` when the
#    package lists are empty), splits them into sentences, keeps the distinct English ones.
# 2. Holds out TEXT_QUERIES of them (1,000) as queries, chosen by a hash of the sentence, so
#    the choice does not depend on the order of the lists; the rest are the stored ones, in
#    the order of that hash (any prefix is a random sample).
# 3. Trains Debian's fastText (`fasttext skipgram`, TEXT_DIM = 384 dimensions) on the stored
#    sentences only, then embeds stored and held-out sentences with
#    `print-sentence-vectors` (the mean of the normalized word vectors of a line).
# 4. Writes into OUTDIR:
#      sentences.txt  queries.txt         one sentence a line, in vector order
#      vectors.f32    queries.f32         rows of dim float32, little-endian, L2-normalized
#      dataset.json                       {"dim", "vectors", "queries", "model", ...}
#    and train.log (the model itself, a few hundred MB, is not kept).
#
# Cached: when OUTDIR/dataset.json exists the script does nothing. Installs the `fasttext`
# package when it is missing (as root, like deploy/lib.sh's install_deps). Settings
# (environment): TEXT_DIM (384), TEXT_EPOCH (5), TEXT_THREADS (2), TEXT_QUERIES (1000),
# TEXT_MAX (0: all sentences; else at most this many stored ones).
set -euo pipefail

[ $# -eq 1 ] || {
    echo "usage: $0 OUTDIR" >&2
    exit 2
}
OUT=$1
DIM=${TEXT_DIM:-384}
EPOCH=${TEXT_EPOCH:-5}
THREADS=${TEXT_THREADS:-2}
NQUERIES=${TEXT_QUERIES:-1000}
MAXN=${TEXT_MAX:-0}

log() { printf '[text-dataset] %s\n' "$*" >&2; }
die() {
    printf '[text-dataset] error: %s\n' "$*" >&2
    exit 1
}
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if [ -f "$OUT/dataset.json" ]; then
    log "$OUT/dataset.json exists: nothing to do"
    exit 0
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK="$OUT/work"
mkdir -p "$WORK"

# ---- tools ----------------------------------------------------------------------------------
if ! command -v fasttext >/dev/null 2>&1; then
    log "installing Debian's fasttext"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null ||
        die "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        fasttext >/dev/null || die "apt-get install fasttext failed"
fi
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

# ---- sentences ------------------------------------------------------------------------------
if [ "$(apt-cache dumpavail 2>/dev/null | grep -c '^Description')" -lt 10000 ]; then
    log "package lists are empty: apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null ||
        die "apt-get update failed"
fi
apt-cache dumpavail >"$WORK/dumpavail.txt"
"$PY" - "$WORK/dumpavail.txt" "$WORK" "$NQUERIES" "$MAXN" <<'PY'
import hashlib, re, sys

src, work, nq, maxn = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

# Descriptions: the "Description:" line and its continuation lines (long descriptions, when
# the lists carry them); " ." separates paragraphs.
texts, cur = [], None
with open(src, encoding="utf-8", errors="replace") as f:
    for line in f:
        line = line.rstrip("\n")
        if line.startswith("Description:"):
            if cur is not None:
                texts.append(" ".join(cur))
            cur = [line[len("Description:"):].strip()]
        elif cur is not None and line.startswith(" "):
            s = line.strip()
            cur.append("" if s == "." else s)
        else:
            if cur is not None:
                texts.append(" ".join(cur))
            cur = None
if cur is not None:
    texts.append(" ".join(cur))

split = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
word = re.compile(r"[A-Za-z]+")
seen, sents = set(), []
for t in texts:
    for s in split.split(" ".join(t.split())):
        s = s.strip()
        if not (12 <= len(s) <= 300) or not s.isascii():
            continue
        words = s.split()
        letters = sum(len(w) for w in word.findall(s))
        # English prose: at least 3 words, mostly letters, and some common function words or
        # at least several words (short descriptions are often noun phrases)
        if len(words) < 3 or letters < 0.6 * len(s):
            continue
        key = s.lower().rstrip(".")
        if key in seen:
            continue
        seen.add(key)
        sents.append(s)

def h(s):
    return hashlib.sha256(s.encode()).hexdigest()

sents.sort(key=h)
queries, stored = sents[:nq], sents[nq:]
if maxn > 0:
    stored = stored[:maxn]
with open(f"{work}/queries.txt", "w") as f:
    f.write("".join(s + "\n" for s in queries))
with open(f"{work}/sentences.txt", "w") as f:
    f.write("".join(s + "\n" for s in stored))
# fastText's tokenizer splits on whitespace only: train on lower-case text with the
# punctuation set apart, and embed the same form.
def norm(s):
    return " ".join(re.findall(r"[a-z0-9]+(?:[-'.+][a-z0-9]+)*|[^\sa-z0-9]", s.lower()))
with open(f"{work}/train.txt", "w") as f:
    f.write("".join(norm(s) + "\n" for s in stored))
with open(f"{work}/queries.norm.txt", "w") as f:
    f.write("".join(norm(s) + "\n" for s in queries))
print(f"{len(texts)} descriptions, {len(sents)} distinct sentences: {len(stored)} stored, "
      f"{len(queries)} queries", file=sys.stderr)
PY

# ---- model and vectors ----------------------------------------------------------------------
log "training fastText skipgram, $DIM dimensions, $EPOCH epochs, $THREADS threads"
start=$(date +%s)
# -bucket: the character n-gram table; fastText's default (2,000,000 rows) would make a 3 GB
# model for a vocabulary of a few ten thousand words.
fasttext skipgram -input "$WORK/train.txt" -output "$WORK/model" -dim "$DIM" -epoch "$EPOCH" \
    -thread "$THREADS" -minCount 2 -bucket 200000 -verbose 1 >"$WORK/train.log" 2>&1 ||
    die "fasttext skipgram failed, see $WORK/train.log"
train_s=$(($(date +%s) - start))
log "trained in $train_s s; embedding"
fasttext print-sentence-vectors "$WORK/model.bin" <"$WORK/train.txt" >"$WORK/vectors.txt" ||
    die "print-sentence-vectors failed"
fasttext print-sentence-vectors "$WORK/model.bin" <"$WORK/queries.norm.txt" >"$WORK/queries.vec.txt" ||
    die "print-sentence-vectors failed"

"$PY" - "$WORK" "$OUT" "$DIM" "$EPOCH" "$train_s" <<'PY'
import array, json, math, sys

work, out, dim, epoch, train_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]

def convert(txt, f32):
    rows = 0
    a = array.array("f")
    with open(txt) as f:
        for line in f:
            v = [float(x) for x in line.split()[-dim:]]
            if len(v) != dim:
                sys.exit(f"{txt}: a line with {len(v)} values, not {dim}")
            n = math.sqrt(sum(x * x for x in v))
            if n == 0:  # no known word or n-gram: keep the row, the loader reports zero rows
                n = 1.0
            a.extend(x / n for x in v)
            rows += 1
    if sys.byteorder != "little":
        a.byteswap()
    with open(f32, "wb") as f:
        a.tofile(f)
    return rows

nv = convert(f"{work}/vectors.txt", f"{out}/vectors.f32.tmp")
nq = convert(f"{work}/queries.vec.txt", f"{out}/queries.f32.tmp")
for name, n in (("sentences.txt", nv), ("queries.txt", nq)):
    with open(f"{work}/{name}") as f:
        if sum(1 for _ in f) != n:
            sys.exit(f"{name}: line count differs from its vectors ({n})")
meta = {"dim": dim, "vectors": nv, "queries": nq, "dtype": "float32", "byte_order": "little",
        "normalized": True,
        "source": "apt-cache dumpavail package descriptions, distinct English sentences",
        "model": f"fasttext skipgram -dim {dim} -epoch {epoch} -minCount 2 -bucket 200000 "
                 "(Debian fasttext), trained on the stored sentences only",
        "embedding": "fasttext print-sentence-vectors, then L2-normalized",
        "train_seconds": int(train_s)}
with open(f"{out}/dataset.json.tmp", "w") as f:
    json.dump(meta, f, indent=1)
    f.write("\n")
PY
mv "$WORK/sentences.txt" "$OUT/sentences.txt"
mv "$WORK/queries.txt" "$OUT/queries.txt"
mv "$OUT/vectors.f32.tmp" "$OUT/vectors.f32"
mv "$OUT/queries.f32.tmp" "$OUT/queries.f32"
cp "$WORK/train.log" "$OUT/train.log"
rm -rf "$WORK"
mv "$OUT/dataset.json.tmp" "$OUT/dataset.json" # last: its presence means complete
log "done: $(cat "$OUT/dataset.json" | tr -d '\n')"
