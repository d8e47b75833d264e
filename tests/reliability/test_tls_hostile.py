"""Hostile input over TLS while a TLS bystander keeps working.

engramd serves TLS 1.3 with a throwaway certificate. All at once, each on its own
connection: garbage where a ClientHello belongs (plain MessagePack, random bytes, an HTTP
request, a ClientHello capped at TLS 1.2, half a ClientHello then silence, a bare TCP
connection that sends nothing), then after a real handshake: silence, random application
data, MessagePack length bombs and deep nesting inside TLS records, a forged record (bad
MAC), an oversized record, and a record cut short (before and after auth, the latter only
caught by the send-rate floor since OpenSSL delivers nothing of a record until it is
whole). Meanwhile a bystander pings over TLS without pause. Every hostile connection must be
closed, never left hanging, and the bystander must never fail. Prints the slowest close, the
handshake failures counted, and the bystander's latency (docs/reliability.md).
"""
import os
import shutil
import socket
import ssl
import struct
import tempfile
import threading
import time

import msgpack

from harness import Bystander, Server, new_database
from tlsutil import client_context, make_pki, metric, tls_flags

AUTH_TIMEOUT_S = 3
WAIT_S = 40  # far beyond every deadline involved (auth 3 s, send-rate grace 5 s), far
             # below the idle timeout (600 s) that would otherwise end a hung connection


def handshake(port, ctx):
    """A TLS 1.3 handshake over a raw socket through MemoryBIOs, so that raw bytes can be
    sent afterwards. Returns (sock, sslobj, incoming, outgoing)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(WAIT_S)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            pending = out.read()
            if pending:
                sock.sendall(pending)
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed during the handshake")
            inc.write(data)
    pending = out.read()
    if pending:
        sock.sendall(pending)
    return sock, obj, inc, out


def tls_send(conn, payload):
    sock, obj, _, out = conn
    obj.write(payload)
    sock.sendall(out.read())


def tls_call(conn, request):
    """Sends one request over the handshaken connection and returns its response."""
    sock, obj, inc, _ = conn
    tls_send(conn, msgpack.packb(request, use_bin_type=True))
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    while True:
        try:
            up.feed(obj.read(65536))
            for msg in up:
                return msg
        except ssl.SSLWantReadError:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            inc.write(data)


def client_hello(ctx):
    """The bytes of a ClientHello for ctx."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def wait_closed(sock):
    """'closed' when the server closes sock (anything it sends before is read and dropped:
    TLS alerts, tickets, never an answer), 'hung' when it stays open for WAIT_S."""
    sock.settimeout(WAIT_S)
    try:
        while sock.recv(65536):
            pass
        return "closed"
    except (ConnectionResetError, BrokenPipeError):
        return "closed"
    except socket.timeout:
        return "hung"


def raw_case(data):
    def run(port, ctx, key):
        s = socket.create_connection(("127.0.0.1", port))
        try:
            if data:
                s.sendall(data)
            return wait_closed(s)
        finally:
            s.close()
    return run


def tls_case(payload=b"", raw_after=b"", auth=False):
    def run(port, ctx, key):
        conn = handshake(port, ctx)
        try:
            if auth:
                r = tls_call(conn, [0, 1, "auth", [{"api_key": key}]])
                assert r[2] is None, r
            if payload:
                tls_send(conn, payload)
            if raw_after:
                conn[0].sendall(raw_after)
            return wait_closed(conn[0])
        finally:
            conn[0].close()
    return run


def cases(pki, ctx):
    hello = client_hello(ctx)
    tls12 = client_context(pki["ca"], max_version=ssl.TLSVersion.TLSv1_2)
    bombs = b"".join([b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01",
                      b"\xdf\xff\xff\xff\xff"])
    return [
        # before or instead of a handshake
        ("plain MessagePack ping (msgid 1: an SSLv2 header)", raw_case(msgpack.packb([0, 1, "ping", []]))),
        ("plain MessagePack ping (msgid 9)", raw_case(msgpack.packb([0, 9, "ping", []]))),
        ("plain MessagePack length bomb", raw_case(b"\x94\x00\x07\xa4ping\xdd\xff\xff\xff\xff")),
        ("random bytes instead of a ClientHello", raw_case(os.urandom(8192))),
        ("an HTTP request", raw_case(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")),
        ("a ClientHello capped at TLS 1.2", raw_case(client_hello(tls12))),
        ("half a ClientHello, then silence", raw_case(hello[: len(hello) // 2])),
        ("a ClientHello record claiming 16 KiB, then silence", raw_case(b"\x16\x03\x01\x40\x00" + hello[5:40])),
        ("TCP connection, then silence", raw_case(b"")),
        # after a completed handshake
        ("handshake, then silence", tls_case()),
        ("handshake, then random application data", tls_case(os.urandom(8192))),
        ("handshake, then length bombs of str/bin/ext/map 32", tls_case(bombs)),
        ("handshake, then 100,000-deep nesting", tls_case(b"\x91" * 100_000)),
        ("handshake, then a forged record (bad MAC)", tls_case(raw_after=b"\x17\x03\x03\x00\x40" + os.urandom(64))),
        ("handshake, then an oversized record", tls_case(raw_after=b"\x17\x03\x03\x48\x01" + os.urandom(64))),
        ("handshake, then a record cut short", tls_case(raw_after=b"\x17\x03\x03\x40\x00" + os.urandom(100))),
        ("auth, then a record cut short", tls_case(raw_after=b"\x17\x03\x03\x40\x00" + os.urandom(100), auth=True)),
        ("auth, then a length bomb", tls_case(b"\x94\x00\x07\xa4ping\xdd\xff\xff\xff\xff", auth=True)),
        ("auth, then a 64 MiB declaration", tls_case(b"\x94\x00\x09\xa4ping\x91\x81\xa1x\xdb" +
                                                     struct.pack(">I", 64 << 20), auth=True)),
    ]


def test_hostile_tls_while_a_bystander_works():
    d = tempfile.mkdtemp(prefix="engram-pki-")
    srv = Server(new_database("tlshostile"))
    try:
        pki = make_pki(d)
        srv.extra = tls_flags(pki) + ["--auth-timeout-s", str(AUTH_TIMEOUT_S)]
        srv.client_tls = client_context(pki["ca"])
        srv.start()
        _, key = srv.create_tenant()
        ctx = client_context(pki["ca"])
        failures0 = metric(srv.http_get("/metrics")[1], "engram_tls_handshake_failures_total")
        by = Bystander(srv.port, key=key, ssl_context=client_context(pki["ca"])).start()
        results = []
        lock = threading.Lock()

        def one(name, fn):
            t0 = time.time()
            try:
                outcome = fn(srv.port, ctx, key)
            except Exception as e:  # noqa: BLE001 - a case that cannot even start is a failure
                outcome = f"error: {e!r}"
            with lock:
                results.append((name, outcome, time.time() - t0))

        all_cases = cases(pki, ctx)
        senders = [threading.Thread(target=one, args=c) for c in all_cases]
        for th in senders:
            th.start()
        for th in senders:
            th.join(WAIT_S + 30)
        by.stop()
        lat, failures = by.lat, by.failures
        body = srv.http_get("/metrics")[1]
        failed_handshakes = metric(body, "engram_tls_handshake_failures_total") - failures0
        lat.sort()
        slowest = max(results, key=lambda r: r[2])
        print(f"\nhostile TLS: {len(results)} kinds at once, "
              f"{sum(r[1] == 'closed' for r in results)} closed; slowest closed after "
              f"{slowest[2] * 1e3:.0f} ms ({slowest[0]}); {failed_handshakes:.0f} handshake "
              f"failures counted; bystander {len(lat)} pings over TLS, "
              f"p50 {lat[len(lat) // 2] * 1e3:.2f} ms, p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms, "
              f"max {lat[-1] * 1e3:.1f} ms, failures {len(failures)}")
        for name, outcome, secs in sorted(results, key=lambda r: r[2]):
            print(f"  {secs * 1e3:8.0f} ms  {outcome:7s} {name}")
        assert len(results) == len(all_cases)
        bad = [r for r in results if r[1] != "closed"]
        assert not bad, bad
        assert not failures, failures
        assert len(lat) > 100
        # the nine that never completed a handshake are counted
        assert failed_handshakes >= 9, body
        with srv.client(key=key) as c:  # and the server is whole
            assert c.call("memory.stats")["total"] == 0
        srv.stop()
    finally:
        srv.cleanup()
        shutil.rmtree(d, ignore_errors=True)
