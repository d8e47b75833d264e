"""cors_allowed_origins on the HTTP port: a preflight (OPTIONS) from a listed origin is
answered with the methods and headers the port takes; every answer to a listed origin
echoes it in Access-Control-Allow-Origin (never '*', never with credentials) and says Vary:
Origin; other origins get no CORS header and a refused preflight; without the setting no
CORS header is sent at all; '*' and malformed origins are refused at start."""
import http.client
import json
import subprocess

import pytest

from harness import BIN, Server, new_database

ALLOWED = ("https://app.example", "http://localhost:3000")
REFUSED = ("https://evil.example", "https://app.example.evil", "http://localhost:3001",
           "null", "HTTPS://APP.EXAMPLE")


@pytest.fixture(scope="module")
def cors_server():
    srv = Server(new_database("cors"),
                 extra=["--cors-allowed-origins", f"{ALLOWED[0]}, {ALLOWED[1]}"])
    failed = True
    try:
        srv.start()
        yield srv
        failed = False
    finally:
        srv.finish(failed=failed)


def request(srv, method, path, headers=None, body=None, conn=None):
    own = conn is None
    if own:
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.headers, data
    finally:
        if own:
            conn.close()


def preflight(srv, origin, path="/v1/rpc/memory.search"):
    h = {"Access-Control-Request-Method": "POST",
         "Access-Control-Request-Headers": "authorization, content-type"}
    if origin is not None:
        h["Origin"] = origin
    return request(srv, "OPTIONS", path, h)


def no_wildcards(headers):
    for k, v in headers.items():
        if k.lower().startswith("access-control-"):
            assert "*" not in v, (k, v)
    assert headers.get("Access-Control-Allow-Credentials") is None


def test_preflight_of_allowed_origins(cors_server):
    for origin in ALLOWED:
        for path in ("/v1/rpc/memory.search", "/metrics"):
            status, h, body = preflight(cors_server, origin, path)
            assert status == 204, (origin, path, status, body)
            assert body == b"" and h.get("Content-Length") is None
            assert h["Access-Control-Allow-Origin"] == origin
            methods = {m.strip() for m in h["Access-Control-Allow-Methods"].split(",")}
            assert {"GET", "POST", "OPTIONS"} <= methods
            allowed = {x.strip().lower() for x in h["Access-Control-Allow-Headers"].split(",")}
            assert {"authorization", "content-type"} <= allowed
            assert int(h["Access-Control-Max-Age"]) > 0
            assert "Origin" in h["Vary"]
            no_wildcards(h)


def test_preflight_of_other_origins_is_refused(cors_server):
    for origin in REFUSED + (None,):
        status, h, body = preflight(cors_server, origin)
        assert status == 403, (origin, status, body)
        assert json.loads(body)["error"]["code"] == "permission_denied"
        assert h.get("Access-Control-Allow-Origin") is None, origin
        assert h.get("Access-Control-Allow-Methods") is None, origin
        assert "Origin" in h["Vary"]


def test_answers_echo_only_listed_origins(cors_server):
    _, key = cors_server.create_tenant()
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = json.dumps({"query": "anything"})
    for origin in ALLOWED:
        # a result, an error (no key: 401) and a GET endpoint: the page reads all of them
        status, h, _ = request(cors_server, "POST", "/v1/rpc/memory.search",
                               dict(auth, Origin=origin), body)
        assert status == 200 and h["Access-Control-Allow-Origin"] == origin
        assert "Retry-After" in h["Access-Control-Expose-Headers"]
        status, h, _ = request(cors_server, "POST", "/v1/rpc/memory.search",
                               {"Origin": origin, "Content-Type": "application/json"}, body)
        assert status == 401 and h["Access-Control-Allow-Origin"] == origin
        status, h, _ = request(cors_server, "GET", "/readyz", {"Origin": origin})
        assert status == 200 and h["Access-Control-Allow-Origin"] == origin
        no_wildcards(h)
    for origin in REFUSED:
        # served (CORS is the browser's to enforce), but nothing lets a page read it
        status, h, _ = request(cors_server, "POST", "/v1/rpc/memory.search",
                               dict(auth, Origin=origin), body)
        assert status == 200, origin
        assert not [k for k in h if k.lower().startswith("access-control-")], (origin, h)
        assert "Origin" in h["Vary"]


def test_origin_does_not_stick_to_the_connection(cors_server):
    conn = http.client.HTTPConnection("127.0.0.1", cors_server.http_port, timeout=30)
    try:
        _, h, _ = request(cors_server, "GET", "/livez", {"Origin": ALLOWED[0]}, conn=conn)
        assert h["Access-Control-Allow-Origin"] == ALLOWED[0]
        _, h, _ = request(cors_server, "GET", "/livez", {}, conn=conn)
        assert h.get("Access-Control-Allow-Origin") is None
        _, h, _ = request(cors_server, "GET", "/livez", {"Origin": REFUSED[0]}, conn=conn)
        assert h.get("Access-Control-Allow-Origin") is None
    finally:
        conn.close()


def test_without_the_setting_no_cors_headers(server):
    status, h, _ = preflight(server, ALLOWED[0])
    assert status == 405  # OPTIONS is no method of the port
    for method, path in (("GET", "/readyz"), ("POST", "/v1/rpc/ping")):
        status, h, _ = request(server, method, path, {"Origin": ALLOWED[0]})
        assert status == 200
        assert not [k for k in h if k.lower().startswith("access-control-")], h
        assert h.get("Vary") is None


@pytest.mark.parametrize("value", ["*", "https://app.example/", "app.example",
                                   "https://app.example, null", "ftp://app.example",
                                   "https://*.example"])
def test_bad_origin_lists_refused_at_start(value):
    r = subprocess.run([BIN, "--pg-dsn", "dbname=x", "--cors-allowed-origins", value,
                        "--check-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "cors_allowed_origins" in r.stderr, r.stderr
