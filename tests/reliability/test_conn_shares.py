"""Fair connection shares (issue: no tenant can exhaust the server).

One tenant key from 20 loopback addresses used to hold all 10,000 connection slots; new
clients were refused, and /readyz could not be reached because HTTP shared the limit. Now a
tenant holds at most its tier's max_connections (per engramd), the slots past
max_connections are the admin's, and the HTTP port counts apart with slots of its own for
the probes.
"""
import socket

import msgpack

from harness import Server, metric, new_database, wait_for

CAP, SLOTS, RESERVED, HTTP_SLOTS = 12, 30, 3, 8


def frame(msgid, method, params=None):
    return msgpack.packb([0, msgid, method, [] if params is None else [params]],
                         use_bin_type=True)


def open_auth(port, key, source):
    """A connection from source that authenticates with key: (socket, error or None)."""
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.settimeout(10)
    s.sendall(frame(1, "auth", {"api_key": key}))
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    while True:
        data = s.recv(4096)
        if not data:
            return s, {"code": "closed"}
        up.feed(data)
        for m in up:
            return s, m[2]


def closed(s):
    s.settimeout(3)
    try:
        while s.recv(4096):
            pass
        return True
    except (socket.timeout, ConnectionResetError):
        return False


def test_a_tenant_gets_its_share_and_probes_and_the_admin_get_in():
    srv = Server(new_database("shares"), extra=[
        "--premium-max-connections", str(CAP), "--max-connections", str(SLOTS),
        "--admin-reserved-connections", str(RESERVED), "--http-max-connections",
        str(HTTP_SLOTS), "--max-connections-per-address", "0", "--auth-timeout-s", "60"]).start()
    held = []
    try:
        _, hog = srv.create_tenant()
        _, other = srv.create_tenant()
        admin_key = srv.admin_key()
        assert wait_for(lambda: metric(srv, "engram_connections") <= 1)
        # the hog, from 20 addresses: CAP connections authenticate, the rest are refused
        refused = 0
        for i in range(20):
            s, err = open_auth(srv.port, hog, f"127.0.0.{2 + i % 20}")
            held.append(s)
            if err:
                assert err["code"] == "quota_exceeded" and err["quota"] == "connections", err
                assert err["limit"] == CAP
                refused += 1
        assert refused == 20 - CAP
        # another tenant is served
        s, err = open_auth(srv.port, other, "127.0.0.40")
        assert err is None, err
        held.append(s)
        # fill every slot (unauthenticated connections from many addresses hold them too)
        while len(held) < SLOTS:
            s = socket.create_connection(("127.0.0.1", srv.port))
            held.append(s)
            s.sendall(frame(1, "ping"))
            s.settimeout(5)
            assert s.recv(100)
        # past max_connections: only the admin key authenticates on the reserved slots
        s, err = open_auth(srv.port, other, "127.0.0.41")
        assert err and err["code"] == "unavailable" and "admin" in err["message"], err
        assert closed(s), "a tenant's connection stayed in an admin slot"
        s, err = open_auth(srv.port, admin_key, "127.0.0.42")
        assert err is None, err
        s.sendall(frame(2, "admin.tenant.list", {}))
        assert msgpack.unpackb(s.recv(1 << 16), raw=False)[2] is None
        held.append(s)
        # the HTTP port counts apart: /readyz answers while the RPC slots are full, and while
        # its own are full too
        hs = [socket.create_connection(("127.0.0.1", srv.http_port)) for _ in range(HTTP_SLOTS)]
        status, body = srv.http_get("/readyz")
        assert status == 200, body
        assert metric(srv, "engram_connections_refused_total") >= 0
        # a probe slot serves probes only
        p = socket.create_connection(("127.0.0.1", srv.http_port))
        p.sendall(b"POST /v1/rpc/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        p.settimeout(5)
        assert b" 503 " in p.recv(4096).split(b"\r\n")[0] + b" "
        for x in hs + [p]:
            x.close()
        print(f"\nconnection shares: a tenant from 20 addresses got {CAP} of 20 (its cap), "
              f"another tenant served, {SLOTS} slots filled, a tenant refused and closed on an "
              f"admin slot, the admin served there; /readyz 200 with the HTTP port full")
    finally:
        for s in held:
            s.close()
        srv.stop()
        srv.cleanup()
