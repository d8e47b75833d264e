"""The HTTP/JSON API on the HTTP port: POST /v1/rpc/{method} runs the same method table,
validation, tenancy, quotas and rate limits as MessagePack-RPC; /v1/openapi.json, /livez and
/readyz; HTTP framing limits (body size, slow clients, keep-alive)."""
import base64
import http.client
import json
import socket
import struct
import time

import pytest

from harness import PgCluster, Server, new_database, wait_for


def post(server, method, params=None, key=None, query="", raw=None, conn=None):
    """POSTs to /v1/rpc/{method}; returns (status, headers, decoded JSON body)."""
    own = conn is None
    if own:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    body = raw if raw is not None else (b"" if params is None else json.dumps(params).encode())
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request("POST", f"/v1/rpc/{method}{query}", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.headers, json.loads(data) if data else None
    finally:
        if own:
            conn.close()


def ok(server, method, params=None, key=None, **kw):
    status, _, body = post(server, method, params, key, **kw)
    assert status == 200, (method, status, body)
    return body


def b64(vec):
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()


@pytest.fixture(scope="module")
def key8(server):
    """A premium tenant with 8-dimensional embeddings: its API key."""
    with server.admin() as a:
        r = a.call("admin.tenant.create", name="http-api-8", tier="premium",
                   embedding={"provider": "builtin", "dim": 8})
    return r["api_key"]


def test_every_family_reachable(server, tenant):
    key = tenant[1]
    assert ok(server, "ping") == "pong"
    sid = ok(server, "memory.store", {"content": "the cat sat on the mat", "type": "fact",
                                     "importance": 0.7, "metadata": {"attrs": {"k": "x"}}}, key)["id"]
    got = ok(server, "memory.get", {"ids": [sid]}, key)["memories"][0]
    assert got["content"] == "the cat sat on the mat" and got["metadata"]["attrs"] == {"k": "x"}
    hits = ok(server, "memory.search", {"query": "cat on a mat", "top_k": 5}, key)
    assert sid in [h["id"] for h in hits["results"]]
    listed = ok(server, "memory.list", {"limit": 10}, key)
    assert [m["id"] for m in listed["memories"]] == [sid]
    sess = ok(server, "session.create", {"agent_id": 3, "config": {"model": "m"}}, key)
    ok(server, "session.append", {"session_id": sess["session_id"], "role": "user",
                                  "content": "hello over HTTP"}, key)
    msgs = ok(server, "session.messages", {"session_id": sess["session_id"]}, key)
    assert [m["content"] for m in msgs["messages"]] == ["hello over HTTP"]
    usage = ok(server, "tenant.usage", None, key)
    assert usage["tenant_id"] == tenant[0] and usage["memories"]["stored"] == 1
    assert ok(server, "memory.delete", {"ids": [sid]}, key)["deleted"] == [sid]
    assert ok(server, "memory.get", {"ids": [sid]}, key)["memories"] == []
    status, _, body = post(server, "session.get", {"session_id": 987654}, key)
    assert status == 404 and body["error"]["code"] == "not_found"
    # admin methods with the admin key; a tenant key gets 403, the admin key on a tenant 403
    t = ok(server, "admin.tenant.get", {"tenant_id": tenant[0]}, server.admin_key())
    assert t["tenant_id"] == tenant[0]
    status, _, body = post(server, "admin.tenant.get", {"tenant_id": tenant[0]}, key)
    assert status == 403 and body["error"]["code"] == "permission_denied"
    status, _, body = post(server, "memory.list", {}, server.admin_key())
    assert status == 403 and body["error"]["code"] == "permission_denied"


def test_same_validation_errors_as_rpc(server, tenant):
    key = tenant[1]
    cases = [
        ("memory.store", {"content": "x", "type": "fact"}),  # missing importance
        ("memory.store", {"content": "x", "type": "fact", "importance": 2}),
        ("memory.store", {"content": "x", "type": "nope", "importance": 0.5}),
        ("memory.search", {"query": "x", "top_k": 0}),
        ("memory.get", {"ids": [1], "colour": "red"}),
        ("memory.get", {"ids": "one"}),
        ("memory.store", {"content": "x", "type": "fact", "memory_type": "event",
                          "importance": 0.5}),
    ]
    with server.client(key=key) as c:
        for method, params in cases:
            rpc = c.call_err(method, **params)
            status, _, body = post(server, method, params, key)
            assert status == 400, (method, params, body)
            assert body["error"] == rpc, (method, params)
        # not_found maps to 404 with the same message
        rpc = c.call_err("session.get", session_id=987654)
    status, _, body = post(server, "session.get", {"session_id": 987654}, key)
    assert status == 404 and body["error"] == rpc


def test_status_mapping_and_auth(server, tenant):
    # no key, a malformed Authorization, a wrong key: 401 with WWW-Authenticate
    status, headers, body = post(server, "memory.list", {})
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    assert headers["WWW-Authenticate"].startswith("Bearer")
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("POST", "/v1/rpc/memory.list", body=b"{}",
                 headers={"Authorization": "Basic dTpw"})
    r = conn.getresponse()
    assert r.status == 401 and json.loads(r.read())["error"]["code"] == "unauthenticated"
    conn.close()
    status, _, body = post(server, "memory.list", {}, key="egk_" + "x" * 40)
    assert status == 401 and body["error"] == {"code": "unauthenticated",
                                               "message": "invalid API key"}
    # unknown method, and auth (the bearer key does its job): 404 unknown_method
    status, _, body = post(server, "memory.nope", {}, tenant[1])
    assert status == 404 and body["error"]["code"] == "unknown_method"
    status, _, body = post(server, "auth", {"api_key": tenant[1]})
    assert status == 404 and body["error"]["code"] == "unknown_method"
    # not JSON, not an object: 400 malformed_request
    status, _, body = post(server, "memory.list", raw=b"{nope", key=tenant[1])
    assert status == 400 and body["error"]["code"] == "malformed_request"
    status, _, body = post(server, "memory.list", raw=b"[1,2]", key=tenant[1])
    assert status == 400 and body["error"]["code"] == "malformed_request"
    # conflict: 409 (an ended session cannot be ended again)
    sid = ok(server, "session.create", {"agent_id": 1, "config": {"model": "m"}},
             tenant[1])["session_id"]
    ok(server, "session.end", {"session_id": sid}, tenant[1])
    status, _, body = post(server, "session.end", {"session_id": sid}, tenant[1])
    assert status == 409 and body["error"]["code"] == "conflict", body
    # GET on the API and POST on a GET endpoint: 405 with Allow; unknown path 404
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("GET", "/v1/rpc/ping")
    r = conn.getresponse()
    assert r.status == 405 and r.headers["Allow"] == "POST"
    r.read()
    conn.request("POST", "/healthz", body=b"")
    r = conn.getresponse()
    assert r.status == 405 and "GET" in r.headers["Allow"]
    r.read()
    conn.request("GET", "/v2/nothing")
    r = conn.getresponse()
    assert r.status == 404 and json.loads(r.read())["error"]["code"] == "not_found"
    conn.close()
    # no CORS: not even for a request that names an Origin
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("POST", "/v1/rpc/ping", body=b"", headers={"Origin": "http://evil.example"})
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    assert not [h for h in r.headers if h.lower().startswith("access-control-")]
    conn.close()


def test_embeddings_base64_and_arrays(server, key8):
    v1 = [0.5, -0.25, 1.0, 0.0, 2.0, -3.5, 0.125, 4.0]
    v2 = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    a = ok(server, "memory.store", {"content": "base64 vector", "type": "fact",
                                    "importance": 0.5, "embedding": b64(v1)}, key8)["id"]
    b = ok(server, "memory.store", {"content": "array vector", "type": "fact",
                                    "importance": 0.5, "embedding": v2}, key8)["id"]
    # default output: base64 of little-endian float32
    got = ok(server, "memory.list", {"include_embedding": True}, key8)["memories"]
    by_id = {m["id"]: m for m in got}
    assert by_id[a]["embedding"] == b64(v1) and by_id[b]["embedding"] == b64(v2)
    got = ok(server, "memory.list", {"include_embedding": True}, key8,
             query="?embeddings=array")["memories"]
    by_id = {m["id"]: m for m in got}
    assert by_id[a]["embedding"] == v1 and by_id[b]["embedding"] == v2
    # a search by either form finds the exact vector first
    for q in (v2, b64(v2)):
        hits = ok(server, "memory.search", {"embedding": q, "top_k": 2}, key8)["results"]
        assert hits[0]["id"] == b
    # store_batch carries embeddings inside its memories
    r = ok(server, "memory.store_batch", {"memories": [
        {"content": "batch b64", "type": "fact", "importance": 0.5, "embedding": b64(v2)},
        {"content": "batch array", "type": "fact", "importance": 0.5, "embedding": v1}]}, key8)
    assert len(r["ids"]) == 2
    # bad base64, wrong dimension: 400 invalid_argument naming the parameter
    status, _, body = post(server, "memory.store", {"content": "x", "type": "fact",
                                                    "importance": 0.5, "embedding": "!!!"}, key8)
    assert status == 400 and "'embedding'" in body["error"]["message"]
    status, _, body = post(server, "memory.store", {"content": "x", "type": "fact",
                                                    "importance": 0.5, "embedding": [1.0]}, key8)
    assert status == 400 and body["error"]["code"] == "invalid_argument"
    status, _, body = post(server, "memory.list", {}, key8, query="?embeddings=hex")
    assert status == 400


def test_keep_alive_and_pipelining(server, tenant):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    ids = []
    for i in range(5):
        status, headers, body = post(server, "memory.store", {
            "content": f"keep-alive {i}", "type": "fact", "importance": 0.5},
            tenant[1], conn=conn)
        assert status == 200 and headers.get("Connection") != "close"
        ids.append(body["id"])
    # a public method, an admin call and a tenant call again on the same connection: each
    # request runs as its own key
    assert post(server, "ping", conn=conn)[2] == "pong"
    status, _, _ = post(server, "admin.tenant.list", {}, server.admin_key(), conn=conn)
    assert status == 200
    status, _, _ = post(server, "memory.list", {}, conn=conn)
    assert status == 401
    got = post(server, "memory.get", {"ids": ids}, tenant[1], conn=conn)[2]
    assert [m["content"] for m in got["memories"]] == [f"keep-alive {i}" for i in range(5)]
    conn.close()
    # three requests in one write: three answers, in order
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    reqs = b""
    for i in range(3):
        body = json.dumps({"ids": [ids[i]]}).encode()
        reqs += (b"POST /v1/rpc/memory.get HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + tenant[1].encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    s.sendall(reqs)
    data = b""
    deadline = time.time() + 30
    while data.count(b"HTTP/1.1 200 OK") < 3 or not data.endswith(b"}\n"):
        assert time.time() < deadline, data
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    s.close()
    order = [data.index(f"keep-alive {i}".encode()) for i in range(3)]
    assert order == sorted(order)


def test_openapi_covers_the_live_methods(server):
    status, body = server.http_get("/v1/openapi.json")
    assert status == 200
    doc = json.loads(body)
    assert doc["openapi"].startswith("3.1")
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    live = {m["name"]: m for m in ok(server, "methods")}
    paths = {p[len("/v1/rpc/"):]: v for p, v in doc["paths"].items() if p.startswith("/v1/rpc/")}
    assert set(paths) == set(live) - {"auth"}
    for name, m in live.items():
        if name == "auth":
            continue
        op = paths[name]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        names = {p["name"] for p in m["params"]}
        for p in m["params"]:
            names.update(p.get("aliases", []))
        assert set(schema["properties"]) == names, name
        required = {p["name"] for p in m["params"] if p["required"]}
        assert set(schema.get("required", [])) == required, name
        assert (op.get("security") == []) == ("public" in m["flags"]), name
        for code in ("400", "401", "429", "503"):
            assert code in op["responses"]
    top_k = paths["memory.search"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["properties"]["top_k"]
    assert top_k["minimum"] == 1 and top_k["maximum"] >= 1000
    err = doc["components"]["schemas"]["Error"]["properties"]["error"]
    assert "rate_limited" in err["properties"]["code"]["enum"]


def test_livez_readyz_healthz(server):
    status, body = server.http_get("/livez")
    assert status == 200 and json.loads(body)["status"] == "alive"
    status, body = server.http_get("/readyz")
    assert status == 200 and json.loads(body)["status"] == "ready"
    status, body = server.http_get("/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.fixture(scope="module")
def tight():
    """An engramd with small limits: 64 KiB messages, free tier 2 queries a day and a
    1 request/s rate with a burst of 3, 1 s to finish a request."""
    srv = Server(new_database("httptight"), extra=[
        "--max-message-bytes", "65536", "--free-queries-per-day", "2",
        "--free-rate-per-s", "1", "--free-rate-burst", "3", "--frame-timeout-ms", "1000"])
    srv.start()
    yield srv
    try:
        srv.stop()
    finally:
        srv.cleanup()


def test_body_over_the_limit_is_413(tight):
    _, key = tight.create_tenant(tier="premium")
    big = {"content": "x" * 70000, "type": "fact", "importance": 0.5}
    status, headers, body = post(tight, "memory.store", big, key)
    assert status == 413 and headers["Connection"] == "close"
    assert "max_message_bytes" in body["error"]["message"]
    # a declared length over the limit is refused before the body is sent
    s = socket.create_connection(("127.0.0.1", tight.http_port), timeout=30)
    s.sendall(b"POST /v1/rpc/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 413")
    s.close()
    # a body under the limit whose MessagePack form is over it: also 413
    floats = json.dumps({"content": "x", "type": "fact", "importance": 0.5,
                         "metadata": {"v": [0.5] * 15000}}, separators=(",", ":")).encode()
    assert len(floats) < 65536
    status, _, body = post(tight, "memory.store", raw=floats, key=key)
    assert status == 413, body


def test_rate_limit_and_quota_are_429_with_retry_after(tight):
    _, key = tight.create_tenant(tier="free")
    # rate: a burst of 3, then rate_limited with Retry-After
    seen = []
    for _ in range(8):
        status, headers, body = post(tight, "memory.list", {}, key)
        seen.append(status)
        if status == 429:
            assert body["error"]["code"] == "rate_limited"
            assert int(headers["Retry-After"]) >= 1 and body["error"]["retry_after_ms"] > 0
            break
    assert 429 in seen, seen
    # quota: 2 queries a day, the third is quota_exceeded until 00:00 UTC
    _, key = tight.create_tenant(tier="free")
    statuses = []
    for _ in range(3):
        time.sleep(1.1)  # stay under the rate limit
        status, headers, body = post(tight, "memory.search", {"query": "q"}, key)
        statuses.append(status)
    assert statuses == [200, 200, 429], statuses
    assert body["error"]["code"] == "quota_exceeded"
    retry = int(headers["Retry-After"])
    assert 0 < retry <= 86400
    assert abs(body["error"]["resets_at"] / 1000 - time.time() - retry) < 5


def test_slow_client_closed_by_the_timeout(tight):
    # a head that never ends: 408, then the connection closes
    s = socket.create_connection(("127.0.0.1", tight.http_port), timeout=30)
    s.sendall(b"POST /v1/rpc/ping HTTP/1.1\r\nHost: x\r\n")
    t0 = time.time()
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 408"), data
    assert time.time() - t0 < 10
    s.close()
    # a body that stops short of its Content-Length: the same
    s = socket.create_connection(("127.0.0.1", tight.http_port), timeout=30)
    s.sendall(b"POST /v1/rpc/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 408"), data
    s.close()
    # the server is fine
    assert post(tight, "ping")[2] == "pong"


def test_malformed_heads(tight):
    for raw, want in [(b"GARBAGE\r\n\r\n", b"400"), (b"GET / HTTP/2.0\r\n\r\n", b"505"),
                      (b"GET /livez HTTP/1.1\r\n\r\n", b"400"),  # no Host
                      (b"POST /v1/rpc/ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                       b"\r\n\r\n0\r\n\r\n", b"411"),
                      (b"GET /livez HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
                       b"431")]:
        s = socket.create_connection(("127.0.0.1", tight.http_port), timeout=30)
        s.sendall(raw)
        assert s.recv(4096).startswith(b"HTTP/1.1 " + want), raw[:40]
        s.close()


def test_readyz_503_while_the_database_is_down():
    pg = PgCluster()
    pg.start()
    srv = None
    try:
        srv = Server(pg.create_db("engram_readyz"), extra=["--db-backoff-max-ms", "500"])
        srv.start()
        assert srv.http_get("/readyz")[0] == 200
        pg.stop()
        body = wait_for(lambda: (r := srv.http_get("/readyz"))[0] == 503 and r[1], timeout=30,
                        interval=0.2)
        assert body, "readyz still says ready"
        doc = json.loads(body)
        assert doc["status"] == "unavailable" and doc["reason"] == "database unreachable"
        assert srv.http_get("/livez")[0] == 200
        status, _, err = post(srv, "memory.list", {}, key=srv.admin_key())
        assert status in (403, 503)
        pg.start()
        assert wait_for(lambda: srv.http_get("/readyz")[0] == 200, timeout=30, interval=0.2)
        srv.stop()
    finally:
        if srv:
            srv.cleanup()
        pg.cleanup()


def test_revoked_key_fails_on_a_kept_alive_connection(server):
    tid, key = server.create_tenant()
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    assert post(server, "memory.list", {}, key, conn=conn)[0] == 200
    with server.admin() as a:
        kid = [k for k in a.call("admin.key.list", tenant_id=tid)["keys"]][0]["key_id"]
        a.call("admin.key.revoke", key_id=kid)
    status, _, body = post(server, "memory.list", {}, key, conn=conn)
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    status, _, body = post(server, "memory.list", {}, key, conn=conn)
    assert status == 401
    conn.close()


def test_connection_without_a_request_is_closed(tight):
    # like an RPC connection that never authenticates: auth_timeout_s (10 s by default)
    s = socket.create_connection(("127.0.0.1", tight.http_port), timeout=30)
    t0 = time.time()
    assert s.recv(4096) == b""
    assert 5 < time.time() - t0 < 25
    s.close()
