"""pytest fixtures shared by the integration and reliability suites (their conftest.py
imports them): one database and one engramd per test module; engramd processes and a
private PostgreSQL cluster for a test that starts, stops or kills them itself.

Every server a fixture started is stopped after its test or module, however it ended: a
clean exit and a log without sanitizer reports are checked; after a failure its log is
kept (harness.keep_dir()) and the failure report shows its last lines."""
import os
import re

import pytest

from harness import PgCluster, Server, keep_dir, new_database


def _failures(request):
    return request.session.testsfailed


def _keep_path(request, srv, n):
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:120]
    return os.path.join(keep_dir(), f"{name}-{os.getpid()}-{n}.log")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report shows the last lines of every engramd its fixtures started."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not rep.failed:
        return
    for srv in getattr(item, "engram_servers", ()):
        rep.sections.append((f"engramd on port {srv.port}: last lines of its log (all of it "
                             f"kept at {srv.keep_as})", srv.log_tail()))
    cluster = getattr(item, "engram_pg", None)
    if cluster is not None:
        rep.sections.append(("PostgreSQL", f"its log kept at {cluster.keep_log()}"))


@pytest.fixture(scope="module")
def server(request):
    srv = Server(new_database("m"))
    failed_before = _failures(request)
    try:
        srv.start()
    except BaseException:
        srv.finish(failed=True)
        raise
    yield srv
    srv.finish(failed=_failures(request) > failed_before,
               keep_as=_keep_path(request, srv, "module"))


@pytest.fixture
def tenant(server):
    """A fresh premium tenant: (tenant_id, api_key)."""
    return server.create_tenant()


@pytest.fixture
def client(server, tenant):
    with server.client(key=tenant[1]) as c:
        yield c


@pytest.fixture
def engramd(request):
    """Starts engramd processes for one test: engramd(dsn, start=True, **kw) returns a
    harness.Server (kw as Server takes them: workers, extra, data_dir, env), started unless
    start=False. The test may stop, start, restart or kill it. After the test each one is
    ended by Server.finish: stopped, its exit and its log checked (a failure of its own when
    the test passed), its files removed, its log kept when the test failed. Request pg
    before engramd when the servers use a private cluster, so that they stop first."""
    servers = []
    request.node.engram_servers = servers
    failed_before = _failures(request)

    def start(dsn, start=True, **kw):
        srv = Server(dsn, **kw)
        srv.keep_as = _keep_path(request, srv, len(servers))
        servers.append(srv)
        if start:
            srv.start()
        return srv

    yield start
    failed = _failures(request) > failed_before
    problems = []
    for srv in reversed(servers):  # the last started first, as a test would
        try:
            srv.finish(failed=failed, keep_as=srv.keep_as)
        except AssertionError as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


@pytest.fixture
def pg(request):
    """A private PostgreSQL cluster (harness.PgCluster), started, for a test that stops,
    kills or freezes it. Removed after the test (thawed first when frozen); its log is kept
    when the test failed (the report says where)."""
    cluster = PgCluster()
    try:
        cluster.start()
        request.node.engram_pg = cluster
        yield cluster
    finally:
        cluster.cleanup()
