"""The HTTP side port: /healthz and /metrics."""


def test_healthz(server):
    status, body = server.http_get("/healthz")
    assert status == 200
    assert '"status":"ok"' in body and '"database":"up"' in body


def test_metrics_count_requests_and_errors(server, tenant):
    with server.client(key=tenant[1]) as c:
        c.call("ping")
        c.call("memory.store", content="metrics", type="fact", importance=0.5)
        c.call_err("memory.store", content="metrics", type="nope", importance=0.5)
    status, body = server.http_get("/metrics")
    assert status == 200
    lines = body.splitlines()

    def value(prefix):
        for line in lines:
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
        return None

    assert value('engram_requests_total{method="ping",code="ok"}') >= 1
    assert value('engram_requests_total{method="memory.store",code="ok"}') >= 1
    assert value('engram_errors_total{method="memory.store",code="invalid_argument"}') >= 1
    assert value('engram_request_duration_seconds_count{method="memory.store"}') >= 2
    assert value('engram_request_duration_seconds_bucket{method="ping",le="+Inf"}') >= 1
    assert value("engram_connections") is not None
    assert value("engram_db_pool_ready") >= 1
    assert "# TYPE engram_request_duration_seconds histogram" in body


def test_unknown_path_404(server):
    assert server.http_get("/nope")[0] == 404
