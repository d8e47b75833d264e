"""pytest fixtures shared by the integration and reliability suites (their conftest.py
imports them): one database and one engramd per test module."""
import pytest

from harness import Server, new_database


@pytest.fixture(scope="module")
def server():
    srv = Server(new_database("m")).start()
    yield srv
    try:
        srv.stop()
    finally:
        srv.cleanup()


@pytest.fixture
def tenant(server):
    """A fresh premium tenant: (tenant_id, api_key)."""
    return server.create_tenant()


@pytest.fixture
def client(server, tenant):
    with server.client(key=tenant[1]) as c:
        yield c
