# Shared steps of deploy/run and deploy/test: dependency install, the FAISS build, the
# embedded PostgreSQL cluster. Sourced, never executed. Every function is idempotent.

ENGRAM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENGRAM_DEPS="$ENGRAM_ROOT/.deps"
FAISS_VERSION=1.7.3
PG_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}

log() { printf '[deploy] %s\n' "$*" >&2; }
# The machine's cores. Not nproc: it honours OMP_NUM_THREADS, which this file sets to 1 for
# engramd (below), and so built FAISS and Citus on one core.
ncpu() { getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2; }
die() { printf '[deploy] error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the build, the server, the tests and the benchmarks need.
ENGRAM_PACKAGES=(
    build-essential g++ pkg-config meson ninja-build cmake dpkg-dev clang-format
    clang libclang-rt-14-dev
    libevent-dev libpq-dev libmsgpack-dev libopenblas-dev libfaiss-dev libsodium-dev
    libinih-dev libomp-dev libssl-dev libsystemd-dev openssl postgresql postgresql-contrib
    python3 python3-msgpack python3-pytest python3-numpy gnuplot-nox procps iproute2 util-linux
    systemd binutils
)
# deploy/ha's formation: pg_auto_failover (its PostgreSQL 15 extension and pg_autoctl) and
# HAProxy in front of the engramd processes.
ENGRAM_HA_PACKAGES=(postgresql-15-auto-failover pg-auto-failover-cli haproxy)
# Only the tests need these: headless Chromium for the web console's browser test
# (tests/integration/test_console.py), deploy/ha for the failover test
# (tests/integration/test_failover.py) and HAProxy in front of the fleet of engramd
# (tests/integration/test_fleet.py; haproxy is one of the HA packages), promtool (Debian's
# prometheus package: only its promtool is used) and PyYAML for the monitoring test
# (tests/integration/test_monitoring.py: /metrics and deploy/prometheus). deploy/test passes
# them to install_deps.
ENGRAM_TEST_PACKAGES=(chromium prometheus python3-yaml python3-jsonschema python3-mypy "${ENGRAM_HA_PACKAGES[@]}")

# install_deps [PACKAGE...]: installs missing Debian packages (ENGRAM_PACKAGES and those
# named). Skips apt entirely when all are present, so a second run starts in seconds.
install_deps() {
    local missing=() p
    for p in "${ENGRAM_PACKAGES[@]}" "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$p")
    done
    # Node (the client packages' tests): Debian's nodejs and npm unless a node with npm is
    # already installed (NodeSource's nodejs bundles npm and conflicts with Debian's npm)
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        missing+=(nodejs npm)
    fi
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null ||
        die "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" >/dev/null || die "apt-get install failed"
}

# faiss_opt_level: ENGRAM_FAISS_OPT when set (generic or avx2: a container image built for
# other machines), else avx2 when this CPU has AVX2 and FMA, generic otherwise.
faiss_opt_level() {
    if [ -n "${ENGRAM_FAISS_OPT:-}" ]; then
        echo "$ENGRAM_FAISS_OPT"
    elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
        echo avx2
    else
        echo generic
    fi
}

# fetch_faiss_source DIR: Debian's faiss source package, patches applied, into DIR.
# The deb-src list is derived from the machine's own apt sources and kept private to
# .deps so the system's apt configuration is left untouched.
fetch_faiss_source() {
    local dir=$1 apt="$ENGRAM_DEPS/apt" src
    mkdir -p "$apt/lists/partial" "$apt/etc"
    : >"$apt/etc/sources.list"
    for src in /etc/apt/sources.list.d/*.sources; do
        [ -f "$src" ] || continue
        sed 's/^Types:.*/Types: deb-src/' "$src" >"$apt/etc/$(basename "$src")"
    done
    if [ -f /etc/apt/sources.list ]; then
        sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$apt/etc/sources.list"
    fi
    local opts=(-o "Dir::Etc::SourceList=$apt/etc/sources.list"
        -o "Dir::Etc::SourceParts=$apt/etc" -o "Dir::State::Lists=$apt/lists"
        -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
    apt-get "${opts[@]}" update -q >/dev/null || die "apt-get update (deb-src) failed"
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && apt-get "${opts[@]}" source -q faiss >/dev/null) ||
        die "apt-get source faiss failed"
}

# build_faiss: FAISS with its C API, static, cached in .deps/faiss-<ver>-<opt>. Sets
# FAISS_PREFIX. Rebuilds only when the cache is missing or incomplete.
build_faiss() {
    local opt
    opt=$(faiss_opt_level)
    FAISS_PREFIX="$ENGRAM_DEPS/faiss-$FAISS_VERSION-$opt"
    export FAISS_PREFIX
    [ -f "$FAISS_PREFIX/.complete" ] && return 0
    log "building FAISS $FAISS_VERSION ($opt) with its C API; this takes a few minutes once"
    local work="$ENGRAM_DEPS/faiss-src"
    fetch_faiss_source "$work"
    local srcdir
    srcdir=$(find "$work" -maxdepth 1 -type d -name "faiss-$FAISS_VERSION*" | head -n 1)
    [ -n "$srcdir" ] || die "faiss source not found after apt-get source"
    local lib=faiss
    [ "$opt" = avx2 ] && lib=faiss_avx2
    # The C API links the generic library by default; point it at the one we use so
    # only one copy of FAISS is compiled.
    sed -i "s/target_link_libraries(faiss_c PRIVATE faiss)/target_link_libraries(faiss_c PRIVATE $lib)/" \
        "$srcdir/c_api/CMakeLists.txt"
    cmake -S "$srcdir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DFAISS_OPT_LEVEL="$opt" -DFAISS_ENABLE_C_API=ON -DFAISS_ENABLE_GPU=OFF \
        -DFAISS_ENABLE_PYTHON=OFF -DBUILD_TESTING=OFF -DBUILD_SHARED_LIBS=OFF \
        -DBLA_VENDOR=OpenBLAS -DCMAKE_POSITION_INDEPENDENT_CODE=ON >"$work/cmake.log" 2>&1 ||
        die "FAISS cmake failed, see $work/cmake.log"
    cmake --build "$work/build" --target "$lib" faiss_c -j "$(ncpu)" >"$work/build.log" 2>&1 ||
        die "FAISS build failed, see $work/build.log"
    rm -rf "$FAISS_PREFIX"
    mkdir -p "$FAISS_PREFIX/lib" "$FAISS_PREFIX/include/faiss/c_api"
    cp "$work/build/faiss/lib$lib.a" "$FAISS_PREFIX/lib/libfaiss.a"
    cp "$work/build/c_api/libfaiss_c.a" "$FAISS_PREFIX/lib/libfaiss_c.a"
    (cd "$srcdir/c_api" && find . -name '*.h' -exec cp --parents {} "$FAISS_PREFIX/include/faiss/c_api/" \;)
    echo "$opt" >"$FAISS_PREFIX/opt_level"
    touch "$FAISS_PREFIX/.complete"
    rm -rf "$work"
    log "FAISS ready in $FAISS_PREFIX"
}

# ---- Citus ----------------------------------------------------------------------------
# Citus (the scale-out extension, docs/scaling.md) is not in Debian 12: it is built from its
# release source, ../shared/vendor/citus-<ver>.tar.gz or ENGRAM_CITUS_TARBALL when present,
# otherwise the same release downloaded from GitHub. On a machine with Citus' own apt
# repository, its postgresql-15-citus-13.0 package installs the same files.
CITUS_VERSION=13.0.5
CITUS_URL="https://github.com/citusdata/citus/archive/refs/tags/v$CITUS_VERSION.tar.gz"
# Debian packages the build needs (PostgreSQL's server headers and what its pg_config links).
CITUS_BUILD_PACKAGES=(postgresql-server-dev-15 liblz4-dev libzstd-dev libkrb5-dev
    libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev curl ca-certificates)

# build_citus: builds Citus once into .deps/citus-<ver>/stage (make install DESTDIR=...),
# then copies the staged files into PostgreSQL's lib and extension directories unless the
# installed citus.so is already that build. A second run with both in place does nothing.
build_citus() {
    local dir="$ENGRAM_DEPS/citus-$CITUS_VERSION" pglib
    pglib=$("$PG_BINDIR/pg_config" --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
    if [ -f "$dir/.complete" ] && cmp -s "$dir/stage$pglib/citus.so" "$pglib/citus.so"; then
        return 0
    fi
    if [ ! -f "$dir/.complete" ]; then
        install_deps "${CITUS_BUILD_PACKAGES[@]}"
        log "building Citus $CITUS_VERSION; this takes a few minutes once"
        local tarball=${ENGRAM_CITUS_TARBALL:-$ENGRAM_ROOT/../shared/vendor/citus-$CITUS_VERSION.tar.gz}
        rm -rf "$dir" && mkdir -p "$dir"
        if [ ! -f "$tarball" ]; then
            log "no $tarball: downloading $CITUS_URL"
            tarball="$dir/citus-$CITUS_VERSION.tar.gz"
            curl -fsSL -o "$tarball" "$CITUS_URL" || die "cannot download Citus $CITUS_VERSION"
        fi
        tar -xzf "$tarball" -C "$dir" || die "cannot unpack $tarball"
        local src="$dir/citus-$CITUS_VERSION"
        [ -d "$src" ] || die "$tarball holds no citus-$CITUS_VERSION/"
        (cd "$src" && ./configure --without-libcurl PG_CONFIG="$PG_BINDIR/pg_config" \
            >"$dir/configure.log" 2>&1) || die "Citus configure failed, see $dir/configure.log"
        # with_llvm=no: no LLVM bitcode for PostgreSQL's JIT to inline (a clang compile of
        # every file, half the build's time; JIT still runs, without inlining Citus' code)
        make -C "$src" -j "$(ncpu)" with_llvm=no >"$dir/build.log" 2>&1 ||
            die "Citus build failed, see $dir/build.log"
        make -C "$src" install with_llvm=no DESTDIR="$dir/stage" >>"$dir/build.log" 2>&1 ||
            die "Citus staging failed, see $dir/build.log"
        rm -rf "$src"
        touch "$dir/.complete"
    fi
    log "installing Citus $CITUS_VERSION into $pglib"
    # cp leaves existing directories alone (tar, even with --no-overwrite-dir, makes each one
    # it passes, / and /usr included, mode 0700 for a moment: another user's initdb or
    # runuser failed with "Permission denied" meanwhile) and replaces each file with a new
    # one (a running server keeps its mapped citus.so)
    as_root cp -R --no-preserve=all --remove-destination "$dir/stage/." / ||
        die "cannot install Citus"
}

# ---- embedded PostgreSQL --------------------------------------------------------------
# A private cluster: unix socket only (listen_addresses = ''), socket in DIR/run, trust
# authentication on that socket (only its owner and root can reach the directory). As
# root the cluster belongs to the postgres user, since PostgreSQL refuses to run as root.

pg_owner() { if [ "$(id -u)" -eq 0 ]; then echo postgres; else id -un; fi; }

pg_as_owner() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# pg_cluster_init DIR: creates the cluster when DIR/data does not exist yet.
pg_cluster_init() {
    local dir=$1
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        log "creating PostgreSQL cluster in $dir"
        [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
        chmod 700 "$dir"
        pg_as_owner mkdir -p "$dir/run"
        pg_as_owner "$PG_BINDIR/initdb" -D "$dir/data" -U postgres --auth=trust \
            --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
            die "initdb failed, see $dir/initdb.log"
        pg_as_owner tee -a "$dir/data/postgresql.conf" >/dev/null <<CONF
# engram: private cluster, unix socket only
listen_addresses = ''
unix_socket_directories = '$dir/run'
max_connections = 300
shared_buffers = 256MB
max_wal_size = 4GB
fsync = on
synchronous_commit = on
log_min_messages = warning
CONF
    fi
}

# pg_cluster_start DIR [DBNAME]: starts the cluster (if not running), creates DBNAME, and
# sets PG_DSN. The postmaster runs in its own session so a terminal's Ctrl-C reaches
# engramd alone and the cluster is stopped in order afterwards.
pg_cluster_start() {
    local dir db=${2:-engram}
    dir=$(cd "$1" && pwd)
    if ! pg_as_owner "$PG_BINDIR/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        pg_as_owner setsid "$PG_BINDIR/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
            start >/dev/null || die "PostgreSQL did not start, see $dir/postgres.log"
    fi
    PG_DSN="host=$dir/run dbname=$db user=postgres"
    if ! pg_as_owner "$PG_BINDIR/psql" -h "$dir/run" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
        pg_as_owner "$PG_BINDIR/createdb" -h "$dir/run" -U postgres "$db" ||
            die "cannot create database $db"
    fi
    export PG_DSN
}

# pg_cluster_stop DIR: fast shutdown, waits for it.
pg_cluster_stop() {
    local dir
    dir=$(cd "$1" 2>/dev/null && pwd) || return 0
    [ -f "$dir/data/PG_VERSION" ] || return 0
    pg_as_owner "$PG_BINDIR/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}

# build_engram BUILDDIR MESON_ARGS...: configures (once) and builds.
build_engram() {
    local dir=$1
    shift
    if [ ! -f "$ENGRAM_ROOT/$dir/build.ninja" ]; then
        meson setup "$ENGRAM_ROOT/$dir" "$ENGRAM_ROOT" -Dfaiss_prefix="$FAISS_PREFIX" "$@" \
            >"$ENGRAM_ROOT/$dir.setup.log" 2>&1 ||
            { cat "$ENGRAM_ROOT/$dir.setup.log" >&2; die "meson setup failed"; }
        rm -f "$ENGRAM_ROOT/$dir.setup.log"
    fi
    ninja -C "$ENGRAM_ROOT/$dir" >/dev/null || { ninja -C "$ENGRAM_ROOT/$dir"; die "build failed"; }
}

# The runtime environment every engramd gets: one BLAS/OpenMP thread per query.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
