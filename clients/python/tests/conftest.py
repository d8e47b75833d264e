"""Fixtures: the live engramd that clients/run-tests started (ENGRAM_TEST_HOST/PORT and
ENGRAM_TEST_ADMIN_KEY_FILE), tenants made through the admin API, and a TCP proxy that can
cut connections. A missing server is a failure, never a skip."""
import os
import random
import string
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package from the source tree
sys.path.insert(0, HERE)

from engram_client import Client  # noqa: E402
from proxy import Proxy  # noqa: E402


def _server():
    port = os.environ.get("ENGRAM_TEST_PORT")
    key_file = os.environ.get("ENGRAM_TEST_ADMIN_KEY_FILE")
    assert port and key_file, ("ENGRAM_TEST_PORT and ENGRAM_TEST_ADMIN_KEY_FILE must name a "
                               "running engramd: run clients/run-tests")
    with open(key_file) as f:
        admin_key = f.read().strip()
    return os.environ.get("ENGRAM_TEST_HOST", "127.0.0.1"), int(port), admin_key


class Server:
    def __init__(self):
        self.host, self.port, self._admin_key = _server()

    def admin(self, **kw):
        return Client(self.host, self.port, api_key=self._admin_key, **kw)

    def tenant(self, tier="premium", dim=None):
        """Creates a tenant; returns its API key (never printed)."""
        name = "py-" + "".join(random.choices(string.ascii_lowercase, k=12))
        emb = {"provider": "builtin", "dim": dim} if dim else None
        with self.admin() as a:
            r = a.admin.tenant.create(name, tier, embedding=emb)
        return r["api_key"]

    def client(self, key, **kw):
        return Client(self.host, self.port, api_key=key, **kw)


@pytest.fixture(scope="session")
def server():
    return Server()


@pytest.fixture
def key(server):
    """A fresh premium tenant's key, with 8-dimensional embeddings."""
    return server.tenant(dim=8)


@pytest.fixture
def client(server, key):
    with server.client(key) as c:
        yield c


@pytest.fixture
def proxy(server):
    p = Proxy(server.host, server.port)
    yield p
    p.close()
