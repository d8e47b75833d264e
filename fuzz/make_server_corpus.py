#!/usr/bin/python3
"""fuzz/make_server_corpus.py: writes the seed corpus of fuzz/server into fuzz/corpus/server.

Each seed is an input of fuzz/server.c: 4 header bytes (the port, who the connection is
first, the reserved slot, whether the client reads, tenant_admit's answer, whether the
database holds its answers; the size of the pieces the bytes are sent in and whether a
second client sends them too; the database's answers), then the client's bytes: MessagePack-RPC requests of the test method table
(tests/fakes/fake_hooks.h) or HTTP/1.1 requests of the JSON API and the GET endpoints.
Rerun after changing it and commit the files; the fuzzer itself never writes there.
(A small MessagePack encoder of its own: python3-msgpack is not a build dependency.)
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "server")


def pack(o):
    if o is None:
        return b"\xc0"
    if o is True:
        return b"\xc3"
    if o is False:
        return b"\xc2"
    if isinstance(o, int):
        if 0 <= o < 128:
            return bytes([o])
        if 0 <= o < 2**32:
            return b"\xce" + struct.pack(">I", o)
        if -32 <= o < 0:
            return struct.pack("b", o)
        return b"\xd3" + struct.pack(">q", o)
    if isinstance(o, float):
        return b"\xcb" + struct.pack(">d", o)
    if isinstance(o, str):
        b = o.encode()
        if len(b) < 32:
            return bytes([0xA0 | len(b)]) + b
        return b"\xd9" + bytes([len(b)]) + b if len(b) < 256 else b"\xda" + struct.pack(">H", len(b)) + b
    if isinstance(o, bytes):
        return b"\xc4" + bytes([len(o)]) + o
    if isinstance(o, list):
        head = bytes([0x90 | len(o)]) if len(o) < 16 else b"\xdc" + struct.pack(">H", len(o))
        return head + b"".join(pack(x) for x in o)
    if isinstance(o, dict):
        head = bytes([0x80 | len(o)]) if len(o) < 16 else b"\xde" + struct.pack(">H", len(o))
        return head + b"".join(pack(k) + pack(v) for k, v in o.items())
    raise TypeError(type(o))


def req(msgid, method, args=None):
    return pack([0, msgid, method, [] if args is None else [args]])


def note(method, args=None):
    return pack([2, method, [] if args is None else [args]])


# header byte 0
HTTP, TENANT, ADMIN, DBTENANT, RESERVED, READS, RATE, REVOKED, HOLD = (
    1, 1 << 1, 2 << 1, 3 << 1, 8, 0x10, 2 << 5, 3 << 5, 0x80)
# database answers, two bits per job: ok, error, unavailable, lock timeout
OK, ERR, DOWN, LOCK = 0, 1, 2, 3


def header(flags, piece=0, answers=(), twin=False):
    script = 0
    for i, a in enumerate(answers[:8]):
        script |= a << (2 * i)
    assert piece < 128
    return bytes([flags, piece | (0x80 if twin else 0), script & 0xFF, script >> 8])


def post(method, body="", headers=""):
    b = body.encode()
    return (f"POST /v1/rpc/{method} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(b)}\r\n"
            f"{headers}\r\n").encode() + b


def get(path, method="GET", headers=""):
    return f"{method} {path} HTTP/1.1\r\nHost: t\r\n{headers}\r\n".encode()


SEEDS = {
    # MessagePack-RPC, not authenticated
    "rpc_public": header(READS) + req(1, "echo", {"value": [1, "two", {"3": None}]})
    + req(2, "whoami") + req(3, "query") + req(4, "no.such") + note("echo", {"value": 1}),
    "rpc_auth_in_stream": header(READS) + req(1, "auth", {"api_key": "tenant:9"})
    + req(2, "query") + req(3, "store", {"n": 5}) + req(4, "auth", {"api_key": "nobody"})
    + req(5, "query"),
    "rpc_auth_db": header(READS, 0, (OK, ERR, LOCK, LOCK)) + req(1, "auth", {"api_key": "db:tenant:2"})
    + req(2, "store", {"n": 1}) + req(3, "store", {"n": 2}) + req(4, "whoami"),
    "rpc_bad_params": header(READS) + req(1, "big", {"bytes": "many"})
    + req(2, "echo", {"colour": "red"}) + req(3, "big") + req(4, "auth", {"api_key": ""}),
    # authenticated first
    "rpc_tenant_writes": header(TENANT | READS, 0, (OK, LOCK, OK, LOCK, LOCK, ERR, DOWN, OK))
    + b"".join(req(i, "store", {"n": i}) for i in range(1, 9)),
    "rpc_tenant_slow": header(TENANT | READS, 7) + req(1, "later", {"tag": 1})
    + req(2, "echo", {"value": 2}) + req(3, "later", {"tag": 3}) + req(4, "query"),
    "rpc_budget": header(TENANT) + b"".join(req(i, "big", {"bytes": 30000, "fill": i})
                                             for i in range(1, 7)) + req(7, "big", {"bytes": 70000}),
    "rpc_admin": header(ADMIN | READS) + req(1, "admin.only") + req(2, "query")
    + req(3, "store", {"n": 1}),
    "rpc_reserved": header(ADMIN | RESERVED | READS) + req(1, "admin.only"),
    "rpc_rate_limited": header(TENANT | RATE | READS) + req(1, "query") + req(2, "whoami"),
    "rpc_revoked": header(TENANT | REVOKED | READS) + req(1, "query") + req(2, "query"),
    "rpc_db_held": header(DBTENANT | HOLD | READS, 3) + req(1, "store", {"n": 1})
    + req(2, "query"),
    "rpc_bytewise": header(READS, 1) + req(1, "echo", {"value": "split"}) + req(2, "whoami"),
    "rpc_malformed_after": header(READS) + req(1, "echo", {"value": 5}) + b"\xc1",
    "rpc_malformed_method": header(READS) + b"\x94\x00\x09\x07\x90",
    "rpc_oversize": header(READS) + req(1, "echo", {"value": 1})[:-1] + b"\xdb\x00\x10\x00\x01",
    # the HTTP port
    "http_get": header(HTTP | READS) + get("/livez") + get("/livez", "HEAD") + get("/metrics")
    + get("/readyz") + get("/healthz") + get("/nope") + get("/livez", "POST"),
    "http_console": header(HTTP | READS) + get("/console") + get("/console/console.js")
    + get("/console/x", headers='If-None-Match: "x"\r\n'),
    "http_json": header(HTTP | READS) + post("echo", '{"value": {"a": [1, 2.5, null, true]}}')
    + post("whoami") + post("echo", "[1]") + post("echo", '{"value": ') + post("no.such", "{}")
    + post("auth", '{"api_key": "admin"}'),
    "http_bearer": header(HTTP | READS, 0, (ERR, OK, LOCK))
    + post("query", "", "Authorization: Bearer tenant:5\r\n")
    + post("store", '{"n": 3}', "Authorization: Bearer tenant:5\r\n")
    + post("store", '{"n": 4}', "Authorization: Bearer tenant:6\r\n")
    + post("query", "", "Authorization: Basic eDp5\r\n")
    + post("query", "", "Authorization: Bearer db:tenant:7\r\n"),
    "http_pipelined_slow": header(HTTP | READS, 11) + post("later", '{"tag": 1}')
    + post("echo", '{"value": 2}') + post("big", '{"bytes": 9, "fill": 66}')
    + post("big", '{"bytes": 70000}'),
    "http_continue": header(HTTP | READS)
    + b"POST /v1/rpc/echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 12\r\n\r\n"
    + b'{"value":42}',
    "http_embeddings": header(HTTP | READS)
    + post("echo", '{"value": {"embedding": "AACAPwAAAEA="}}').replace(
        b"/v1/rpc/echo", b"/v1/rpc/echo?embeddings=array"),
    "http_refused": header(HTTP | READS) + get("/livez")
    + b"POST /v1/rpc/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
    "http_close": header(HTTP | READS) + get("/livez", headers="Connection: close\r\n")
    + get("/livez"),
    "http_10": header(HTTP | READS) + b"GET /livez HTTP/1.0\r\n\r\n",
    "http_reserved": header(HTTP | RESERVED | READS) + get("/livez") + post("echo", "{}"),
    "http_unread": header(HTTP) + b"".join(post("big", '{"bytes": 30000}') for _ in range(4)),
    # two clients of one tenant: its writes share the lane
    "twin_rpc_writes": header(TENANT | READS, 5, (LOCK, OK, LOCK, LOCK, OK, ERR, OK, OK), True)
    + b"".join(req(i, "store", {"n": i}) for i in range(1, 5)) + req(5, "later", {"tag": 5}),
    "twin_http_writes": header(HTTP | READS, 9, (LOCK, LOCK, OK, OK), True)
    + post("store", '{"n": 1}', "Authorization: Bearer tenant:5\r\n")
    + post("store", '{"n": 2}', "Authorization: Bearer tenant:5\r\n"),
    "twin_unread": header(TENANT, 0, (), True)
    + b"".join(req(i, "big", {"bytes": 40000}) for i in range(1, 5)),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds in {OUT}")


if __name__ == "__main__":
    main()
