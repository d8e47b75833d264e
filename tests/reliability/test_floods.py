"""Limits that keep one abusive client from hurting the rest.

- Connections per source address are capped; another address still gets in.
- A connection that does not authenticate in time is closed; until then it has a small
  budget of unsent answers, so pipelining requests without reading holds little memory.
- A client sending a message slower than the floor is closed after the grace period.
- Above the server-wide budget of buffered bytes, clients that read none of their large
  answers are closed, and a well-behaved client is served throughout.
- The descriptor limit is raised at start, and max_connections fitted to it.
"""
import os
import socket
import time

import msgpack

from harness import Server, new_database, wait_for


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


def closed_within(sock, seconds):
    """True when the server closes sock within seconds (reading and dropping any answers)."""
    sock.settimeout(0.2)

    def closed():
        try:
            return sock.recv(1 << 16) == b""
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True

    return wait_for(closed, timeout=seconds, interval=0)


def open_connections(srv):
    """Open connections other than the HTTP request asking (the gauge counts both ports)."""
    text = srv.http_get("/metrics")[1]
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("engram_connections ")) - 1


def connect_from(port, source):
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def frame(msgid, method, params=None):
    return msgpack.packb([0, msgid, method, [] if params is None else [params]],
                         use_bin_type=True)


def test_connections_per_address_auth_deadline_and_send_rate():
    srv = Server(new_database("lim"), extra=["--max-connections-per-address", "5",
                                             "--auth-timeout-s", "2"])
    try:
        srv.start()
        _, key = srv.create_tenant()
        # the set-up connections above have closed (and freed their address's slots)
        assert wait_for(lambda: open_connections(srv) == 0)
        held = [connect_from(srv.port, "127.0.0.1") for _ in range(5)]
        extra = connect_from(srv.port, "127.0.0.1")
        assert closed_within(extra, 3), "a sixth connection from one address was accepted"
        other = connect_from(srv.port, "127.0.0.2")  # another address is not affected
        other.sendall(frame(1, "ping"))
        other.settimeout(5)
        assert msgpack.unpackb(other.recv(100), raw=False)[3] == "pong"
        # none of the five authenticated: all are closed at the deadline
        for s in held:
            assert closed_within(s, 6), "an unauthenticated connection outlived auth_timeout_s"
        # an authenticated connection stays past the deadline
        with srv.client(key=key) as c:
            time.sleep(2.5)  # wall clock: past auth_timeout_s
            assert c.call("ping") == "pong"
        # a ping sent at one byte per second is cut after the grace period
        slow = connect_from(srv.port, "127.0.0.3")
        data = frame(9, "ping", {"pad": "x" * 20})
        t0 = time.time()
        cut = False
        for b in data:
            try:
                slow.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            if closed_within(slow, 1.0):
                cut = True
                break
        assert cut, "a one-byte-a-second sender was never closed"
        assert time.time() - t0 < 15
        other.close()
        status, text = srv.http_get("/metrics")
        assert status == 200
        refused = [l for l in text.splitlines() if l.startswith("engram_connections_refused_total")]
        closed = [l for l in text.splitlines()
                  if l.startswith("engram_connections_closed_slow_total")]
        assert float(refused[0].split()[-1]) >= 1 and float(closed[0].split()[-1]) >= 6
    finally:
        srv.stop()
        srv.cleanup()


def test_pipelining_without_reading_stays_within_budgets():
    # methods: a 12-byte request, an answer of several KiB
    srv = Server(new_database("flood"), extra=["--max-output-total-bytes", str(8 << 20),
                                               "--max-result-bytes", str(4 << 20),
                                               "--auth-timeout-s", "30"])
    try:
        srv.start()
        _, key = srv.create_tenant()
        pid = srv.proc.pid
        base = rss_mb(pid)
        burst = b"".join(frame(i, "methods") for i in range(2000))
        # unauthenticated: 64 KiB of unsent answers each, then nothing more is read
        pre = []
        for i in range(20):
            s = connect_from(srv.port, "127.0.0.1")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            try:
                for _ in range(20):
                    s.send(burst)
            except BlockingIOError:
                pass
            pre.append(s)
        # authenticated: large answers, never read, past the 8 MiB server-wide budget
        hogs = []
        for i in range(6):
            s = connect_from(srv.port, "127.0.0.1")
            s.sendall(frame(1, "auth", {"api_key": key}))
            s.settimeout(5)
            assert msgpack.unpackb(s.recv(4096), raw=False)[2] is None
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            try:
                for _ in range(50):
                    s.send(burst)
            except BlockingIOError:
                pass
            hogs.append(s)
        peak = 0.0
        for _ in range(20):
            status, text = srv.http_get("/metrics")
            for line in text.splitlines():
                if line.startswith("engram_client_buffered_bytes "):
                    peak = max(peak, float(line.split()[-1]))
            time.sleep(0.05)  # sampling the gauge while the hogs hold their buffers
        grown = rss_mb(pid) - base
        # a well-behaved client is served meanwhile
        with srv.client(key=key) as c:
            for _ in range(20):
                assert c.call("ping") == "pong"
        # the hogs that read nothing are closed (5 s without progress, over budget)
        closed = sum(closed_within(s, 12) for s in hogs)
        print(f"flood: buffered at most {peak / 2**20:.2f} MiB (budget 8 MiB); resident "
              f"memory grew {grown:.1f} MiB (sanitizer builds keep freed memory); {closed} of "
              f"{len(hogs)} hogs closed")
        # the budget, plus at most one answer per connection in flight when it was crossed
        assert 0 < peak <= (8 << 20) + 26 * 16384, peak
        assert closed >= 1
        for s in pre + hogs:
            s.close()
    finally:
        srv.stop()
        srv.cleanup()


def test_descriptor_limit_raised_and_connections_fitted():
    """Started under a soft descriptor limit of 256 (hard 512), engramd raises it to 512 and
    lowers max_connections to leave descriptors for the database and snapshots."""
    import harness
    srv = Server(new_database("nofile"), extra=["--max-connections", "100000"])
    orig = harness.BIN
    try:
        wrapper = os.path.join(srv.tmp, "engramd-limited")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec prlimit --nofile=256:512 -- {orig} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        harness.BIN = wrapper
        srv.start()
        log = srv.log_text()
        assert "descriptor limit raised from 256 to 512" in log, log[-2000:]
        assert "max_connections lowered from 100000" in log
        with open(f"/proc/{srv.proc.pid}/limits") as f:
            lim = [line for line in f if line.startswith("Max open files")][0].split()
        assert lim[3] == "512" and lim[4] == "512", lim  # exec kept the pid
        with srv.client() as c:
            assert c.call("ping") == "pong"
    finally:
        harness.BIN = orig
        srv.stop()
        srv.cleanup()
