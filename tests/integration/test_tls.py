"""TLS on the RPC and HTTP ports, with a throwaway PKI made by the openssl command line.

One engramd serves TLS 1.3 with a copy of the test CA's server certificate (so the reload
test can replace it), asks for client certificates of the operators' CA and requires one
for the admin key. Around it: the handshake and a tenant's work over TLS, HTTPS, clients
that must be refused (wrong CA, wrong name, TLS 1.2, plain text), the admin's certificate,
SIGHUP reloads (good and bad), the C CLI, an expired certificate on either side, and the
start-up refusals.
"""
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import msgpack
import pytest

from harness import BIN, CLI, Client, RpcError, Server, free_port, new_database, wait_log, wait_value
from tlsutil import OPENSSL, client_context, make_pki, metric, peer_der, tls_flags

AUTH_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def pki():
    d = tempfile.mkdtemp(prefix="engram-pki-")
    try:
        yield make_pki(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def srv(pki):
    s = Server(new_database("tls"))
    # the files engramd reads, in the server's directory so a test may replace them
    s.cert = os.path.join(s.tmp, "cert.pem")
    s.key = os.path.join(s.tmp, "key.pem")
    shutil.copy(pki["server"], s.cert)
    shutil.copy(pki["server_key"], s.key)
    os.chmod(s.key, 0o600)
    s.extra = ["--tls-cert-file", s.cert, "--tls-key-file", s.key,
               "--tls-ca-file", pki["client_ca"], "--tls-admin-require-client-cert", "1",
               "--auth-timeout-s", str(AUTH_TIMEOUT_S)]
    # the harness's own connections present the operator's certificate (it creates tenants)
    s.client_tls = client_context(pki["ca"], pki["client"], pki["client_key"])
    s.start()
    yield s
    try:
        s.stop()
    finally:
        s.cleanup()


def metrics(srv):
    status, body = srv.http_get("/metrics")
    assert status == 200
    return body


def closed_without_answer(sock, timeout=30):
    """Reads until the server closes sock; returns the bytes it sent. Fails on a timeout."""
    sock.settimeout(timeout)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except (ConnectionResetError, ssl.SSLError):
        return got
    except socket.timeout:
        raise AssertionError("the server kept the connection open")


def test_handshake_auth_store_search(srv, pki):
    _, key = srv.create_tenant()
    with Client(srv.port, key=key, ssl_context=client_context(pki["ca"])) as c:
        assert c.sock.version() == "TLSv1.3"
        stored = c.call("memory.store", content="the vault on Base pays 4.1% over TLS",
                        type="fact", importance=0.6)
        hits = c.call("memory.search", query="vault on Base", top_k=3)["results"]
        assert hits and hits[0]["id"] == stored["id"]
        got = c.call("memory.get", ids=[stored["id"]])["memories"]
        assert got[0]["content"] == "the vault on Base pays 4.1% over TLS"
    # and by name: the certificate carries DNS:localhost too
    with Client(srv.port, host="localhost", ssl_context=client_context(pki["ca"])) as c:
        assert c.call("ping") == "pong"


def test_json_api_over_https(srv, pki):
    """The HTTP/JSON API over TLS; the admin key needs the client certificate there too."""
    import json
    _, key = srv.create_tenant()

    def post(ctx, method, bearer):
        c = http.client.HTTPSConnection("127.0.0.1", srv.http_port, context=ctx, timeout=30)
        try:
            c.request("POST", f"/v1/rpc/{method}", body=b"{}",
                      headers={"Authorization": f"Bearer {bearer}"})
            r = c.getresponse()
            return r.status, json.loads(r.read())
        finally:
            c.close()

    no_cert = client_context(pki["ca"])
    status, body = post(no_cert, "memory.list", key)
    assert status == 200 and body["memories"] == []
    status, body = post(no_cert, "admin.tenant.list", srv.admin_key())
    assert status == 401 and "certificate" in body["error"]["message"]
    assert post(srv.client_tls, "admin.tenant.list", srv.admin_key())[0] == 200


def test_http_port_speaks_tls_only(srv, pki):
    status, body = srv.http_get("/healthz")
    assert status == 200 and '"status":"ok"' in body
    body = metrics(srv)
    assert metric(body, "engram_tls_handshake_failures_total") is not None
    # the certificate's expiry, for alerting: the test CA signs for 30 days
    expiry = metric(body, "engram_tls_certificate_expiry_timestamp_seconds")
    assert time.time() + 29 * 86400 < expiry < time.time() + 31 * 86400
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/healthz", timeout=10).read()
    # a client that does not trust the CA gets nothing either
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"https://127.0.0.1:{srv.http_port}/healthz", timeout=10,
                               context=client_context(pki["other_ca"]))


def test_client_refuses_wrong_ca_and_wrong_name(srv, pki):
    with pytest.raises(ssl.SSLCertVerificationError):
        Client(srv.port, ssl_context=client_context(pki["other_ca"]))
    with pytest.raises(ssl.SSLCertVerificationError):
        Client(srv.port, ssl_context=client_context(pki["ca"]), server_hostname="engram.example")
    with srv.client() as c:  # the server is unaffected
        assert c.call("ping") == "pong"


def test_tls12_client_refused_and_counted(srv, pki):
    before = metric(metrics(srv), "engram_tls_handshake_failures_total")
    ctx = client_context(pki["ca"], max_version=ssl.TLSVersion.TLSv1_2)
    with pytest.raises(ssl.SSLError) as e:
        Client(srv.port, ssl_context=ctx)
    assert "PROTOCOL_VERSION" in str(e.value).upper()
    # the server counts the handshake when it closes the connection, after the alert the
    # client has just read: wait for the count
    wait_value(lambda: metric(metrics(srv), "engram_tls_handshake_failures_total"),
               lambda v: v >= before + 1,
               f"engram_tls_handshake_failures_total at {before + 1:g} or more", timeout=10)


@pytest.mark.parametrize("msgid", [1, 9])
def test_plain_client_on_tls_port_is_closed(srv, msgid):
    # msgid 1 makes the request's first bytes look like an SSLv2 ClientHello header, which
    # OpenSSL waits to complete: the auth deadline closes that one
    s = socket.create_connection(("127.0.0.1", srv.port))
    try:
        s.sendall(msgpack.packb([0, msgid, "ping", []]))
        got = closed_without_answer(s, timeout=AUTH_TIMEOUT_S + 20)
        assert b"pong" not in got
        if got:  # at most a TLS alert record, never a MessagePack response
            assert got[0] == 0x15, got
    finally:
        s.close()
    with srv.client() as c:
        assert c.call("ping") == "pong"


def test_silent_connection_closed_by_auth_deadline(srv, pki):
    # no ClientHello at all, and a completed handshake followed by nothing: both closed
    raw = socket.create_connection(("127.0.0.1", srv.port))
    tls = Client(srv.port, ssl_context=client_context(pki["ca"]))
    try:
        assert closed_without_answer(raw, timeout=AUTH_TIMEOUT_S + 20) == b""
        assert closed_without_answer(tls.sock, timeout=AUTH_TIMEOUT_S + 20) == b""
    finally:
        raw.close()
        tls.close()


def test_admin_needs_a_client_certificate(srv, pki):
    admin_key = srv.admin_key()
    with Client(srv.port, ssl_context=client_context(pki["ca"])) as c:
        with pytest.raises(RpcError) as e:
            c.call("auth", api_key=admin_key)
        assert e.value.code == "unauthenticated" and "certificate" in e.value.message
        # the failed auth left it unauthenticated
        assert c.call_err("admin.tenant.list")["code"] == "unauthenticated"
        # a tenant key needs no certificate on the same connection
        _, key = srv.create_tenant()
        c.call("auth", api_key=key)
        assert c.call("memory.stats")["total"] == 0
    ctx = client_context(pki["ca"], pki["client"], pki["client_key"])
    with Client(srv.port, key=admin_key, ssl_context=ctx) as c:
        assert isinstance(c.call("admin.tenant.list")["tenants"], list)
    # a certificate of another CA does not get through the handshake (TLS 1.3: the client
    # learns it on its first read)
    rogue = client_context(pki["ca"], pki["rogue_client"], pki["rogue_client_key"])
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with Client(srv.port, ssl_context=rogue) as c:
            c.call("ping")


def wait_reloads(srv, result, at_least, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = metric(metrics(srv), f'engram_tls_reloads_total{{result="{result}"}}')
        if v is not None and v >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {result} reload counted:\n" + srv.log_text()[-3000:])


def pem_der(path):
    with open(path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def test_sighup_reloads_the_certificate(srv, pki):
    _, key = srv.create_tenant()
    body = metrics(srv)
    ok0 = metric(body, 'engram_tls_reloads_total{result="ok"}')
    failed0 = metric(body, 'engram_tls_reloads_total{result="failed"}')
    assert peer_der(srv.port, pki["ca"]) == pem_der(pki["server"])
    old = Client(srv.port, key=key, ssl_context=client_context(pki["ca"]))
    try:
        shutil.copy(pki["server2"], srv.cert)
        shutil.copy(pki["server2_key"], srv.key)
        srv.proc.send_signal(signal.SIGHUP)
        wait_reloads(srv, "ok", ok0 + 1)
        assert peer_der(srv.port, pki["ca"]) == pem_der(pki["server2"])
        assert pem_der(pki["server2"]) != pem_der(pki["server"])
        # the connection opened before the reload keeps its session and its identity
        assert old.sock.getpeercert(binary_form=True) == pem_der(pki["server"])
        assert old.call("ping") == "pong"
        old.call("memory.store", content="stored after a reload", type="fact", importance=0.5)

        # a key that is not the certificate's: refused, the current certificate stays
        shutil.copy(pki["server_key"], srv.key)
        srv.proc.send_signal(signal.SIGHUP)
        wait_reloads(srv, "failed", failed0 + 1)
        assert peer_der(srv.port, pki["ca"]) == pem_der(pki["server2"])
        # an expired certificate: refused too
        shutil.copy(pki["expired"], srv.cert)
        srv.proc.send_signal(signal.SIGHUP)
        wait_reloads(srv, "failed", failed0 + 2)
        assert peer_der(srv.port, pki["ca"]) == pem_der(pki["server2"])
        # a failed reload is counted, then logged: the second one's line may still be coming
        log = wait_log(srv, "expired on")
        assert "is not the key of the certificate" in log and "expired on" in log
        assert "still serving the previous certificate" in log
        # never a line of the key in the log
        with open(pki["server_key"]) as f:
            body_lines = [ln for ln in f.read().splitlines() if ln and not ln.startswith("-----")]
        assert body_lines and not any(ln in log for ln in body_lines)
        assert old.call("memory.stats")["total"] == 1
    finally:
        old.close()
        shutil.copy(pki["server"], srv.cert)
        shutil.copy(pki["server_key"], srv.key)
        srv.proc.send_signal(signal.SIGHUP)
    wait_reloads(srv, "ok", ok0 + 2)
    assert peer_der(srv.port, pki["ca"]) == pem_der(pki["server"])


def cli(srv, *args, key_file=None, env=None, check=True):
    assert CLI and os.access(CLI, os.X_OK), "ENGRAM_CLI must name the engram binary"
    e = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    e.update(env or {})
    argv = [CLI, "--port", str(srv.port), "--timeout-ms", "30000"] + list(args)
    if key_file:
        argv += ["--key-file", key_file]
    r = subprocess.run(argv, capture_output=True, text=True, env=e, timeout=60)
    if check:
        assert r.returncode == 0, (args, r.returncode, r.stderr)
    return r


def test_cli_over_tls(srv, pki):
    ca = pki["ca"]
    assert cli(srv, "--tls-ca", ca, "ping").stdout.strip() == "pong"
    assert cli(srv, "--host", "localhost", "--tls-ca", ca, "ping").stdout.strip() == "pong"
    assert cli(srv, "ping", env={"ENGRAM_TLS_CA": ca}).stdout.strip() == "pong"
    r = cli(srv, "--tls-ca", pki["other_ca"], "ping", check=False)
    assert r.returncode == 1 and "tls_failed" in r.stderr and "certificate" in r.stderr
    r = cli(srv, "--tls-ca", ca, "ping", env={"ENGRAM_TLS_SERVERNAME": "engram.invalid"},
            check=False)  # the name the certificate must carry: not the certificate's
    assert r.returncode == 1 and "tls_failed" in r.stderr
    r = cli(srv, "--tls-ca", os.path.join(os.path.dirname(ca), "missing.pem"), "ping", check=False)
    assert r.returncode == 1 and "tls_failed" in r.stderr and "missing.pem" in r.stderr
    # plain text against the TLS port: refused, never answered
    r = cli(srv, "ping", check=False)
    assert r.returncode == 1 and "pong" not in r.stdout
    # a tenant's work
    _, key = srv.create_tenant()
    keyf = os.path.join(srv.tmp, "tenant.key")
    with open(keyf, "w") as f:
        f.write(key + "\n")
    cli(srv, "--tls-ca", ca, "store", "rotated the signer key on Tuesday", key_file=keyf)
    r = cli(srv, "--tls-ca", ca, "--json", "search", "signer key", key_file=keyf)
    assert "rotated the signer key" in r.stdout
    # engrams:// in ENGRAM_URL means TLS (the CA from ENGRAM_TLS_CA), as for every client
    r = subprocess.run([CLI, "--json", "search", "signer key"], capture_output=True, text=True,
                       timeout=60, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                        "ENGRAM_URL": f"engrams://127.0.0.1:{srv.port}",
                                        "ENGRAM_TLS_CA": ca, "ENGRAM_API_KEY_FILE": keyf})
    assert r.returncode == 0 and "rotated the signer key" in r.stdout, r.stderr
    # the admin: with the operator's certificate, and refused without it
    r = cli(srv, "--tls-ca", ca, "--tls-cert", pki["client"], "--tls-key", pki["client_key"],
            "--json", "admin", "tenant", "list", key_file=srv.admin_key_file)
    assert '"tenants"' in r.stdout
    r = cli(srv, "--tls-ca", ca, "admin", "tenant", "list", key_file=srv.admin_key_file,
            check=False)
    assert r.returncode == 1 and "unauthenticated" in r.stderr and "certificate" in r.stderr
    r = cli(srv, "--tls-ca", ca, "--tls-key", pki["client_key"], "ping", check=False)
    assert r.returncode == 2 and "--tls-cert" in r.stderr


class ExpiredTlsServer:
    """A TLS 1.3 listener on loopback presenting the expired certificate; it completes
    handshakes (when the client lets it) and answers nothing."""

    def __init__(self, pki):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        self.ctx.load_cert_chain(pki["expired"], pki["expired_key"])
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.stop = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.lsock.accept()
            except socket.timeout:
                continue
            conn.settimeout(5)
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as t:
                    t.recv(1)
            except (ssl.SSLError, OSError):
                pass
            finally:
                conn.close()

    def close(self):
        self.stop.set()
        self.th.join(10)
        self.lsock.close()


def test_clients_refuse_an_expired_server_certificate(pki):
    fake = ExpiredTlsServer(pki)
    try:
        with pytest.raises(ssl.SSLCertVerificationError) as e:
            Client(fake.port, ssl_context=client_context(pki["ca"]))
        assert "expired" in str(e.value)
        assert CLI and os.access(CLI, os.X_OK)
        r = subprocess.run([CLI, "--port", str(fake.port), "--tls-ca", pki["ca"], "ping"],
                           capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")})
        assert r.returncode == 1 and "tls_failed" in r.stderr and "expired" in r.stderr, r.stderr
    finally:
        fake.close()


def test_cli_survives_a_server_that_hangs_up_mid_request(pki):
    # a TLS peer that completes the handshake and closes: writing 8 MiB to it fails with
    # EPIPE, which must come back as an error, not as SIGPIPE killing the process
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["server"], pki["server_key"])
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(30)

    def hang_up():
        try:
            conn, _ = lsock.accept()
            ctx.wrap_socket(conn, server_side=True).close()
        except (OSError, ssl.SSLError):
            pass

    th = threading.Thread(target=hang_up, daemon=True)
    th.start()
    try:
        big = '{"content": "' + "x" * (8 << 20) + '"}'
        r = subprocess.run([CLI, "--port", str(lsock.getsockname()[1]), "--tls-ca", pki["ca"],
                            "call", "ping", "-"], input=big, capture_output=True, text=True,
                           timeout=60,
                           env={k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")})
        assert r.returncode == 1 and "connection_closed" in r.stderr, (r.returncode, r.stderr)
    finally:
        th.join(30)
        lsock.close()


def start_and_fail(flags, timeout=60):
    """Runs engramd with flags that must stop it before it serves; returns (code, log)."""
    dsn = new_database("tlsbad")
    d = tempfile.mkdtemp(prefix="engram-tlsbad-")
    try:
        r = subprocess.run([BIN, "--pg-dsn", dsn, "--rpc-port", str(free_port()), "--http-port", "0",
                            "--data-dir", os.path.join(d, "data")] + flags,
                           capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL,
                           env={k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")})
        return r.returncode, r.stdout + r.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_engramd_refuses_bad_certificates_at_start(pki):
    code, log = start_and_fail(tls_flags(pki, "server2")[:2] + ["--tls-key-file", pki["server_key"]])
    assert code != 0 and "is not the key of the certificate" in log, log
    code, log = start_and_fail(tls_flags(pki, "expired"))
    assert code != 0 and "expired on" in log, log
    code, log = start_and_fail(["--tls-cert-file", pki["server"]])
    assert code == 2 and "tls_cert_file and tls_key_file go together" in log, log
    code, log = start_and_fail(tls_flags(pki) + ["--tls-admin-require-client-cert", "1"])
    assert code == 2 and "needs tls_ca_file" in log, log
    code, log = start_and_fail(["--tls-cert-file", "/nonexistent/cert.pem",
                                "--tls-key-file", pki["server_key"]])
    assert code != 0 and "cannot read tls_cert_file /nonexistent/cert.pem" in log, log
    # an encrypted key fails at once instead of asking for a passphrase
    enc = os.path.join(os.path.dirname(pki["server_key"]), "encrypted.key")
    subprocess.run([OPENSSL, "pkey", "-in", pki["server_key"], "-aes256", "-passout",
                    "pass:secret", "-out", enc], check=True, capture_output=True, timeout=60)
    code, log = start_and_fail(["--tls-cert-file", pki["server"], "--tls-key-file", enc])
    assert code != 0 and "encrypted keys are not supported" in log, log
    # a CA file without a certificate in it
    empty = os.path.join(os.path.dirname(pki["server_key"]), "empty.pem")
    open(empty, "w").close()
    code, log = start_and_fail(tls_flags(pki, ca_file=empty))
    assert code != 0 and "tls_ca_file" in log, log
