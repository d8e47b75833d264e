"""Starts the real engramd against the real PostgreSQL for integration tests.

Environment (set by meson / deploy/test):
  ENGRAM_BIN            path of the engramd binary under test
  ENGRAM_CLI            path of the engram CLI (optional)
  ENGRAM_TEST_PG_DSN    a libpq DSN of the throwaway cluster's maintenance database
  ENGRAM_TEST_PG_BINDIR PostgreSQL's binaries (initdb, pg_ctl) for tests that need their
                        own cluster
  ENGRAM_TEST_CITUS     1: every database new_database() makes lives on a Citus cluster
                        (deploy/citus: a coordinator and two workers) started once for the
                        test session, so the same tests run against Citus (meson suite citus)
  ENGRAM_TEST_CITUS_PORT with ENGRAM_TEST_CITUS=1: use the running deploy/citus cluster on
                        this port (ENGRAM_CITUS_DIR its directory) instead, and leave it running
A missing ENGRAM_TEST_PG_DSN is a failure, never a skip: these tests exist to run.
"""
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np

from rpc import Client, RpcError

BIN = os.environ.get("ENGRAM_BIN", "")
CLI = os.environ.get("ENGRAM_CLI", "")
PG_DSN = os.environ.get("ENGRAM_TEST_PG_DSN", "")
PG_BINDIR = os.environ.get("ENGRAM_TEST_PG_BINDIR", "/usr/lib/postgresql/15/bin")
CITUS = os.environ.get("ENGRAM_TEST_CITUS", "") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "Sanitizer:DEADLYSIGNAL", "WARNING: ThreadSanitizer")


def require_env():
    assert BIN and os.access(BIN, os.X_OK), "ENGRAM_BIN must name the engramd binary"
    assert PG_DSN, "ENGRAM_TEST_PG_DSN must name a PostgreSQL cluster (deploy/test sets it)"


def psql(dsn, sql):
    out = subprocess.run([os.path.join(PG_BINDIR, "psql"), dsn, "-v", "ON_ERROR_STOP=1",
                          "-tAqc", sql], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"psql failed: {out.stderr.strip()}")
    return out.stdout.strip()


def wait_for(pred, timeout=20.0, interval=0.05, what=None):
    """Polls pred until it returns something true, at most timeout seconds; returns that
    value. Without what, a timeout returns the last false value (for the caller to assert
    on); with what (a description: "the failed-reload counter at 2"), a timeout fails the
    test with a message naming it and the last value seen.

    Use it for everything the server writes after (or while) it answers: a counter, a log
    line, a row, a file. Waiting must still be able to fail: poll until the expected value
    appears, not until anything does."""
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v or time.time() >= deadline:
            break
        time.sleep(interval)
    if not v and what is not None:
        raise AssertionError(f"waited {timeout:g} s for {what}; last seen: {_short(v)}")
    return v


def store_retrying(c, args, retried, timeout=30.0):
    """memory.store of args through client c, tried again every 50 ms (with the same
    idempotency key in args) while it fails `unavailable` (each message appended to
    retried), for at most timeout seconds; returns its id. Any other error raises, as does
    running out of time."""
    deadline = time.time() + timeout
    while True:
        try:
            return c.call("memory.store", **args)["id"]
        except RpcError as e:
            if e.code != "unavailable":
                raise
            retried.append(e.message)
            if time.time() > deadline:
                raise AssertionError(f"store {args.get('idempotency_key')} never "
                                     f"acknowledged in {timeout:.0f} s: {e.message}")
            time.sleep(0.05)


def keyed_burst(c, contents, keys):
    """Sends memory.store of each content under its idempotency key, every one twice, and
    then the first key once more with other content, all at once on client c (pipelined,
    answered in any order). Asserts what a client must get however the server grouped them:
    the repeats replay the first stores' memories (one of each pair answered `replayed`), the
    reused key is refused `conflict`. Returns the ids of the first stores, in order."""
    body = [{"content": t, "type": "fact", "importance": 0.5, "idempotency_key": k}
            for t, k in zip(contents, keys)]
    n = len(body)
    sent = [c.send("memory.store", b) for b in body + body]
    sent.append(c.send("memory.store", dict(body[0], content=body[0]["content"] + " other")))
    answers = [c.wait(msgid) for msgid in sent]
    for err, _ in answers[:2 * n]:
        assert err is None, err
    first = [res["id"] for _, res in answers[:n]]
    assert first == [res["id"] for _, res in answers[n:2 * n]]
    assert sum(bool(res.get("replayed")) for _, res in answers[:2 * n]) == n
    assert answers[2 * n][0] and answers[2 * n][0]["code"] == "conflict", answers[2 * n]
    return first


def wait_value(get, ok, what, timeout=20.0, interval=0.05):
    """Polls get() until ok(value) holds, at most timeout seconds; returns the value. A
    timeout fails the test naming what it waited for and the last value get() returned."""
    box = []

    def check():
        box[:] = [get()]
        return ok(box[0])

    deadline = time.time() + timeout
    while not check():
        if time.time() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; last seen: "
                                 f"{_short(box[0])}")
        time.sleep(interval)
    return box[0]


def _short(v, limit=2000):
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def with_dbname(dsn, name):
    if re.search(r"\bdbname=\S+", dsn):
        return re.sub(r"\bdbname=\S+", f"dbname={name}", dsn)
    return f"{dsn} dbname={name}"


def new_database(prefix="t"):
    """Creates an empty database in the test cluster (with ENGRAM_TEST_CITUS=1: on every node
    of the session's Citus cluster, workers registered); returns its DSN."""
    require_env()
    name = f"engram_{prefix}_" + "".join(random.choices(string.ascii_lowercase, k=8))
    if CITUS:
        return citus_cluster().add_database(name)
    psql(PG_DSN, f"CREATE DATABASE {name}")
    return with_dbname(PG_DSN, name)


class CitusCluster:
    """deploy/citus's coordinator and two workers, in a temporary directory on three
    consecutive loopback ports; stopped and removed when the test process exits."""

    def __init__(self, port=None):
        self.own = port is None
        if self.own:
            self.dir = tempfile.mkdtemp(prefix="engram-citus-")
            os.chmod(self.dir, 0o755)
            self.port = free_port_base(3)
        else:
            self.dir, self.port = os.environ["ENGRAM_CITUS_DIR"], port
        self.env = dict(os.environ, ENGRAM_CITUS_DIR=self.dir,
                        ENGRAM_CITUS_PORT=str(self.port), ENGRAM_BIN=BIN,
                        PG_BINDIR=PG_BINDIR)


    def run(self, *args):
        out = subprocess.run([os.path.join(ROOT, "deploy", "citus"), *args], env=self.env,
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, (f"deploy/citus {' '.join(args)} failed:\n"
                                     f"{out.stdout[-3000:]}{out.stderr[-3000:]}")
        return out.stdout.strip()

    def start(self):
        # each test's database gets the schema from its engramd
        self.run("start", "--no-schema")
        return self

    def add_database(self, name):
        return self.run("add-db", name).splitlines()[-1]

    def sql(self, node, sql, dbname="postgres"):
        """psql on node 0 (the coordinator), 1 or 2 (the workers)."""
        return psql(f"host=127.0.0.1 port={self.port + node} user=postgres dbname={dbname}",
                    sql)

    def stop(self):
        if not self.own:
            return
        try:
            self.run("stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


_citus = None


def citus_cluster():
    """The session's Citus cluster (ENGRAM_TEST_CITUS=1), started at the first call."""
    global _citus
    if _citus is None:
        import atexit
        port = os.environ.get("ENGRAM_TEST_CITUS_PORT")
        if port:
            _citus = CitusCluster(int(port))
        else:
            cluster = CitusCluster()
            atexit.register(cluster.stop)
            _citus = cluster.start()
    return _citus


def free_port_base(span=40):
    """A base port whose span ports are all free now (deploy/ha/common.sh's layout,
    deploy/citus's three nodes), below the kernel's ephemeral range: a port in it can be
    taken between this check and the server's bind by any outgoing connection (a clean CI
    run lost node1's port that way)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = max(low, 20000 + 4 * span)
    for _ in range(200):
        base = random.randrange(20000, top - span)
        socks = []
        try:
            for p in range(base, base + span):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One engramd process. start() waits until it answers; stop() checks a clean exit."""

    def __init__(self, dsn, workers=2, extra=None, data_dir=None, env=None):
        require_env()
        self.dsn = dsn
        self.workers = workers
        self.extra = list(extra or [])
        if CITUS and "--db-queue-timeout-ms" not in self.extra:
            # three PostgreSQL servers on the test machine's two cores, beside the other
            # suites: a pipelined burst (test_sessions' 256 session.spawn) waited past the
            # default 2 s for a connection in one deploy/test run; a cluster on machines of
            # its own does not share them
            self.extra += ["--db-queue-timeout-ms", "20000"]
        self.tmp = tempfile.mkdtemp(prefix="engram-it-")
        self.data_dir = data_dir or os.path.join(self.tmp, "data")
        self.admin_key_file = os.path.join(self.tmp, "admin.key")
        self.log_path = os.path.join(self.tmp, "engramd.log")
        self.port = free_port()
        self.http_port = free_port()
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.proc = None
        self.logs = []
        # an ssl.SSLContext when engramd serves TLS: the harness's own connections (readiness,
        # client(), http_get) use it
        self.client_tls = None

    def start(self, wait=True):
        # free_port() only finds a port free at that moment: another test may take it before
        # engramd binds it. An engramd that exits for that reason alone is started again on
        # other ports (at most 3 times); any other early exit fails at once.
        for attempt in range(3):
            log_from = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
            args = [BIN, "--pg-dsn", self.dsn, "--rpc-port", str(self.port),
                    "--http-port", str(self.http_port), "--workers", str(self.workers),
                    "--data-dir", self.data_dir, "--admin-key-file", self.admin_key_file,
                    "--log-level", "info"] + self.extra
            self.logf = open(self.log_path, "ab")
            self.proc = subprocess.Popen(args, stdout=self.logf, stderr=subprocess.STDOUT,
                                         env=self.env)
            if not wait:
                return self
            try:
                self.wait_ready()
                return self
            except AssertionError:
                lost_port = (self.proc.poll() is not None and
                             "Address already in use" in self.log_text()[log_from:])
                if not lost_port or attempt == 2:
                    raise
                self.port, self.http_port = free_port(), free_port()
        return self

    def wait_ready(self, timeout=None):
        # the first engramd on a new database applies the schema: on Citus that distributes
        # every table and function (33 s on the idle machine, past 60 s in a deploy/test run
        # beside the other Citus tests)
        timeout = timeout or (240 if CITUS else 60)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"engramd exited early ({self.proc.returncode}):\n"
                                     + self.log_text()[-4000:])
            try:
                with Client(self.port, timeout=2, ssl_context=self.client_tls) as c:
                    # answering RPC, and healthy: database connected, listener up
                    if c.call("ping") == "pong" and self.http_get("/healthz")[0] == 200:
                        return
            except (OSError, ConnectionError):
                pass
            time.sleep(0.05)
        raise AssertionError("engramd did not become ready:\n" + self.log_text()[-4000:])

    def log_text(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tail(self, lines=60):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def check_log_clean(self):
        text = self.log_text()
        for mark in SANITIZER_MARKS:
            assert mark not in text, f"sanitizer report in engramd log:\n{text[-6000:]}"

    def finish(self, failed=False, keep_as=None):
        """Ends this server's part in a test, whatever happened in it: stops it if it runs
        (SIGTERM: a sanitizer build writes its reports at exit), checks that it exited
        cleanly (0) and that its log holds no sanitizer report, and removes its files.
        failed says the test failed already: then nothing is raised here (the test's own
        failure is the one to read) but what went wrong is printed, and the log is kept
        (at keep_as, or in keep_dir()) with its path printed. Raises AssertionError when the
        test passed but the server did not stop cleanly (its log is kept then too)."""
        problems = []
        try:
            try:
                if self.proc is not None:
                    self.stop(timeout=30 if failed else 60)
                else:
                    self.check_log_clean()  # it may have been killed, or stopped earlier
            except AssertionError as e:
                problems.append(str(e))
            if failed or problems:
                kept = self.keep_log(keep_as)
                for p in problems:
                    print(f"engramd on port {self.port}: {p}", file=sys.stderr)
                print(f"engramd on port {self.port}: log kept at {kept}", file=sys.stderr)
        finally:
            self.cleanup()
        if problems and not failed:
            raise AssertionError("\n".join(problems))

    def keep_log(self, path=None):
        """Copies the log out of the directory cleanup() removes; returns the copy's path."""
        if path is None:
            path = os.path.join(keep_dir(), f"engramd-{os.getpid()}-{self.port}.log")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            shutil.copyfile(self.log_path, path)
        except OSError as e:
            return f"(not kept: {e})"
        return path

    def stop(self, timeout=60, expect_code=0):
        if not self.proc:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("engramd did not stop on SIGTERM:\n" + self.log_text()[-4000:])
        code = self.proc.returncode
        self.proc = None
        self.logf.close()
        self.check_log_clean()
        assert code == expect_code, f"engramd exited with {code}:\n" + self.log_text()[-4000:]

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self):
        self.stop()
        return self.start()

    def cleanup(self):
        self.kill()
        if getattr(self, "logf", None) is not None and not self.logf.closed:
            self.logf.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- clients -------------------------------------------------------------------------

    def client(self, key=None, timeout=30.0):
        return Client(self.port, timeout=timeout, key=key, ssl_context=self.client_tls)

    def admin_key(self):
        with open(self.admin_key_file) as f:
            return f.read().strip()

    def admin(self):
        return self.client(key=self.admin_key())

    def create_tenant(self, name=None, tier="premium", **kw):
        """Returns (tenant_id, api_key) of a new tenant."""
        name = name or "t-" + "".join(random.choices(string.ascii_lowercase, k=10))
        with self.admin() as a:
            r = a.call("admin.tenant.create", name=name, tier=tier, **kw)
        return r["tenant_id"], r["api_key"]

    def http_get(self, path):
        scheme = "https" if self.client_tls else "http"
        url = f"{scheme}://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10, context=self.client_tls) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


class PgCluster:
    """A private PostgreSQL cluster for tests that stop and start the database."""

    def __init__(self):
        self._make_dirs("engram-pg-")
        self._as_owner([os.path.join(PG_BINDIR, "initdb"), "-D", self.data, "-U", "postgres",
                        "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"])
        conf = (f"\nlisten_addresses = ''\nunix_socket_directories = '{self.run}'\n"
                "max_connections = 100\nfsync = off\n")
        self._as_owner(["sh", "-c", f"cat >> {self.data}/postgresql.conf"], conf)
        self.dsn = f"host={self.run} dbname=postgres user=postgres"

    def _make_dirs(self, prefix):
        """A directory of the cluster's own (owned by postgres when run as root) and its
        socket directory; data is where the cluster goes."""
        self.dir = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.dir, 0o755)
        self.data = os.path.join(self.dir, "data")
        self.run = os.path.join(self.dir, "run")
        self.root = os.geteuid() == 0
        if self.root:
            shutil.chown(self.dir, "postgres", "postgres")
        self._as_owner(["mkdir", "-p", self.run])

    def _as_owner(self, cmd, stdin=None):
        if self.root:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        subprocess.run(cmd, check=True, input=stdin, text=True, capture_output=True, timeout=120)

    def start(self):
        self._as_owner(["setsid", os.path.join(PG_BINDIR, "pg_ctl"), "-D", self.data, "-l",
                        os.path.join(self.dir, "pg.log"), "-w", "-t", "60", "start"])

    def stop(self):
        self._as_owner([os.path.join(PG_BINDIR, "pg_ctl"), "-D", self.data, "-m", "fast", "-w",
                        "stop"])

    def pids(self):
        """The postmaster and every process it started."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            pm = int(f.readline())
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pm)], capture_output=True,
                             text=True).stdout
        return [pm] + [int(x) for x in out.split()]

    def freeze(self):
        """SIGSTOP every process of the cluster: sockets stay open, nothing answers."""
        self.frozen = True
        for pid in self.pids():
            os.kill(pid, signal.SIGSTOP)

    def thaw(self):
        for pid in self.pids():
            os.kill(pid, signal.SIGCONT)
        self.frozen = False

    def create_db(self, name):
        psql(self.dsn, f"CREATE DATABASE {name}")
        return with_dbname(self.dsn, name)

    def cleanup(self):
        """Stops the cluster (thawed first if a test froze it) and removes its files."""
        if getattr(self, "frozen", False):
            try:
                self.thaw()
            except (OSError, ValueError):
                pass
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def keep_log(self):
        """Copies PostgreSQL's log out of the cluster's directory; returns the copy's path."""
        path = os.path.join(keep_dir(), f"pg-{os.getpid()}-{os.path.basename(self.dir)}.log")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            shutil.copyfile(os.path.join(self.dir, "pg.log"), path)
        except OSError as e:
            return f"(not kept: {e})"
        return path


class PgStandby(PgCluster):
    """A hot standby of a running PgCluster: pg_basebackup -R (streaming replication, the
    primary_conninfo it writes) into a directory of its own, with its own socket
    directory. start() waits until it accepts read-only connections; create_db is not
    possible (read-only): use dsn_for(name) for a database of the primary."""

    def __init__(self, primary):
        self._make_dirs("engram-pgsb-")
        self._as_owner([os.path.join(PG_BINDIR, "pg_basebackup"), "-D", self.data, "-h",
                        primary.run, "-U", "postgres", "-R", "-X", "stream", "-c", "fast"])
        # the copied postgresql.conf names the primary's socket directory: the last line wins
        conf = f"\nunix_socket_directories = '{self.run}'\nhot_standby = on\n"
        self._as_owner(["sh", "-c", f"cat >> {self.data}/postgresql.conf"], conf)
        self.dsn = f"host={self.run} dbname=postgres user=postgres"

    def start(self):
        super().start()
        assert wait_for(lambda: self._accepts(), timeout=60), "the standby never accepted reads"

    def _accepts(self):
        try:
            return psql(self.dsn, "SELECT pg_is_in_recovery()") == "t"
        except RuntimeError:
            return False

    def dsn_for(self, name):
        return with_dbname(self.dsn, name)

    def pause(self):
        psql(self.dsn, "SELECT pg_wal_replay_pause()")
        assert wait_for(lambda: psql(self.dsn, "SELECT pg_get_wal_replay_pause_state()") == "paused",
                        timeout=30), "replay did not pause"

    def resume(self):
        psql(self.dsn, "SELECT pg_wal_replay_resume()")

    def caught_up(self, primary):
        """True once the standby has replayed everything the primary has written."""
        lsn = psql(primary.dsn, "SELECT pg_current_wal_lsn()")
        return psql(self.dsn, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") == "t"


def server_pair(dsn, extra=()):
    """Two engramd processes on one database, sharing the secret and the admin key (as the
    processes of one deployment do); returns them started. Stop and clean up both."""
    a = Server(dsn, extra=list(extra))
    b = Server(dsn, extra=list(extra) + ["--secret-file", a.data_dir + "/secret.key",
                                         "--admin-key-file", a.admin_key_file])
    b.admin_key_file = a.admin_key_file
    try:
        a.start()
        b.start()
    except BaseException:
        a.finish(failed=True)
        b.finish(failed=True)
        raise
    return a, b


@contextlib.contextmanager
def running_pair(prefix, extra=()):
    """A server_pair on a new database (named from prefix), yielded as (a, b, dsn); both
    are ended after the block by Server.finish (a test's end fails if one does not stop
    cleanly; their logs are kept when the block raised)."""
    dsn = new_database(prefix)
    a, b = server_pair(dsn, extra)
    try:
        yield a, b, dsn
    except BaseException:
        a.finish(failed=True)
        b.finish(failed=True)
        raise
    problems = []
    for s in (a, b):
        try:
            s.finish()
        except AssertionError as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


def keep_dir():
    """Where the logs of a failed test's servers are kept: ENGRAM_TEST_KEEP_DIR, else
    engram-test-logs in the temporary directory."""
    return os.environ.get("ENGRAM_TEST_KEEP_DIR") or os.path.join(tempfile.gettempdir(),
                                                                  "engram-test-logs")


@contextlib.contextmanager
def engramd_server(dsn, start=True, **kw):
    """An engramd (Server's arguments) on dsn, started unless start=False, for the block:
    the block may stop, start, restart or kill it. Leaving the block always ends it
    (Server.finish): stopped, its clean exit and its log checked, its files removed; when
    the block raised, its log is kept and the block's exception is the one that counts."""
    srv = Server(dsn, **kw)
    try:
        if start:
            srv.start()
        yield srv
    except BaseException:
        srv.finish(failed=True)
        raise
    srv.finish()


@contextlib.contextmanager
def pg_cluster():
    """A private PostgreSQL cluster (PgCluster), started, for the block; stopped (thawed
    first when frozen) and removed after it, whatever happened; its log is kept when the
    block raised."""
    pg = PgCluster()
    try:
        pg.start()
        yield pg
    except BaseException:
        print(f"PostgreSQL log kept at {pg.keep_log()}", file=sys.stderr)
        raise
    finally:
        pg.cleanup()


def metric(srv, name, labels=None, default=None):
    """A sample of srv's /metrics: name{labels}; with labels None the unlabelled sample, or
    the sum of every labelled one. default when absent (None: the test fails)."""
    status, text = srv.http_get("/metrics")
    assert status == 200
    want = name + ("{" + labels + "}" if labels else "")
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(want + " ") or (labels is None and line.startswith(name + "{")):
            total += float(line.split()[-1])
            found = True
    assert found or default is not None, f"{want} missing from /metrics"
    return total if found else default


def wait_metric(srv, name, ok, what, labels=None, default=None, timeout=20.0):
    """Polls the sample name{labels} of srv's /metrics (see metric) until ok(value); returns
    the value. A timeout fails naming what was expected and the last value."""
    want = name + ("{" + labels + "}" if labels else "")
    return wait_value(lambda: metric(srv, name, labels, default), ok, f"{want} {what}",
                      timeout=timeout)


def wait_log(srv, pattern, since=0, timeout=20.0):
    """Polls srv's log, from character since on, until pattern (a substring, or a compiled
    regular expression) is in it; returns that text. engramd writes each line whole, but
    often after the answer or the counter a test saw. A timeout fails naming the pattern,
    with the log's last lines."""
    regex = hasattr(pattern, "search")

    def found():
        text = srv.log_text()[since:]
        return text if (pattern.search(text) if regex else pattern in text) else None

    deadline = time.time() + timeout
    while True:
        text = found()
        if text is not None:
            return text
        if time.time() >= deadline:
            shown = pattern.pattern if regex else pattern
            raise AssertionError(f"waited {timeout:g} s for {shown!r} in the engramd log; its "
                                 f"last lines:\n{srv.log_tail()}")
        time.sleep(0.05)


def server_fleet(dsn, n, extra=()):
    """n engramd processes on one database sharing the secret and the admin key (the first
    one's); returns them started. Stop and clean up every one."""
    first = Server(dsn, extra=list(extra)).start()
    fleet = [first]
    try:
        for _ in range(n - 1):
            s = Server(dsn, extra=list(extra) + ["--secret-file", first.data_dir + "/secret.key",
                                                 "--admin-key-file", first.admin_key_file])
            s.admin_key_file = first.admin_key_file
            fleet.append(s.start())
    except BaseException:
        for s in fleet:
            s.cleanup()
        raise
    return fleet


HAPROXY = os.environ.get("ENGRAM_HAPROXY", "/usr/sbin/haproxy")


class HAProxy:
    """HAProxy in TCP mode in front of engramd processes (Debian's haproxy package): one
    frontend port, round robin over the servers' RPC ports, each checked with GET /readyz
    on its HTTP port (a process that is not ready, or whose database is down, is taken out
    of rotation). start() waits until the frontend accepts connections."""

    def __init__(self, servers, inter_ms=500):
        assert os.access(HAPROXY, os.X_OK), f"{HAPROXY} missing: install Debian's haproxy"
        self.tmp = tempfile.mkdtemp(prefix="engram-haproxy-")
        self.port = free_port()
        self.cfg = os.path.join(self.tmp, "haproxy.cfg")
        self.log_path = os.path.join(self.tmp, "haproxy.log")
        lines = ["global", "    maxconn 2000", "defaults", "    mode tcp",
                 "    timeout connect 2s", "    timeout client 10m", "    timeout server 10m",
                 "frontend engram", f"    bind 127.0.0.1:{self.port}",
                 "    default_backend engramd", "backend engramd", "    balance roundrobin",
                 "    option httpchk", "    http-check send meth GET uri /readyz",
                 "    http-check expect status 200"]
        for i, s in enumerate(servers):
            lines.append(f"    server e{i} 127.0.0.1:{s.port} check port {s.http_port} "
                         f"inter {inter_ms} fall 2 rise 1")
        with open(self.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = None

    def start(self):
        out = subprocess.run([HAPROXY, "-c", "-f", self.cfg], capture_output=True, text=True)
        assert out.returncode == 0, f"haproxy rejects its configuration:\n{out.stdout}{out.stderr}"
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", self.cfg], stdout=self.logf,
                                     stderr=subprocess.STDOUT)

        def up():
            assert self.proc.poll() is None, "haproxy exited:\n" + open(self.log_path).read()
            try:
                with Client(self.port, timeout=2) as c:
                    return c.call("ping") == "pong"
            except (OSError, ConnectionError, RpcError):
                return False

        assert wait_for(up, timeout=30), "haproxy never forwarded a ping"
        return self

    def client(self, key=None, timeout=30.0):
        return Client(self.port, timeout=timeout, key=key)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Bystander:
    """A client that pings in a loop on its own thread while a test does something else:
    start(), then stop() (joins the thread, at most 10 s). lat holds each ping's round trip in
    seconds, failures the first exception (the loop ends at it), for the test to assert on."""

    def __init__(self, port, key=None, ssl_context=None):
        self.port, self.key, self.ssl_context = port, key, ssl_context
        self.lat, self.failures = [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with Client(self.port, key=self.key, ssl_context=self.ssl_context) as c:
            while not self._stop.is_set():
                t0 = time.time()
                try:
                    assert c.call("ping") == "pong"
                except Exception as e:  # noqa: BLE001 - recorded for the test to assert on
                    self.failures.append(repr(e))
                    return
                self.lat.append(time.time() - t0)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        return self


def structured_vectors(n, dim, seed=1, latent=32, noise=0.3):
    """Rows x = W z + noise * e, z in R^latent, L2-normalized, as float32 (numpy array).

    Low intrinsic dimension like real embeddings: i.i.d. random vectors would make
    nearest-neighbour questions meaningless."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((dim, latent)) / np.sqrt(latent)
    z = rng.standard_normal((n, latent))
    x = z @ w.T + noise * rng.standard_normal((n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def vec_bin(v):
    """A vector as the wire's bin of little-endian float32."""
    return np.asarray(v, dtype="<f4").tobytes()


__all__ = ["Server", "PgCluster", "Client", "RpcError", "new_database", "psql",
           "structured_vectors", "vec_bin", "free_port", "CLI", "wait_for", "wait_value",
           "wait_metric", "wait_log", "engramd_server", "pg_cluster", "PG_BINDIR",
           "Bystander", "server_pair"]
