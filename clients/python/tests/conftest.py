"""Fixtures: the live engramd that clients/run-tests started (ENGRAM_TEST_HOST/PORT and
ENGRAM_TEST_ADMIN_KEY_FILE), the second one serving TLS on the same database
(ENGRAM_TEST_TLS_PORT, its test PKI in ENGRAM_TEST_TLS_DIR), tenants made through the
admin API, and a TCP proxy that can cut connections. A missing server is a failure, never
a skip."""
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
            r = a.admin.tenant.create(name=name, tier=tier, embedding=emb)
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


class TLSServer:
    """The engramd serving TLS 1.3: its port, the admin key and the PKI's files (the CA of
    its certificate, an unrelated CA, the operators' client certificate, which it requires
    for the admin key, and a client certificate of the unrelated CA)."""

    def __init__(self, server):
        port, d = os.environ.get("ENGRAM_TEST_TLS_PORT"), os.environ.get("ENGRAM_TEST_TLS_DIR")
        assert port and d, ("ENGRAM_TEST_TLS_PORT and ENGRAM_TEST_TLS_DIR must name a running "
                            "engramd serving TLS: run clients/run-tests")
        self.host, self.port, self.admin_key = "127.0.0.1", int(port), server._admin_key
        f = lambda name: os.path.join(d, name)  # noqa: E731
        self.ca, self.other_ca = f("ca.pem"), f("other_ca.pem")
        self.client_cert, self.client_key = f("client.pem"), f("client.key")
        self.rogue_cert, self.rogue_key = f("rogue_client.pem"), f("rogue_client.key")
        for p in (self.ca, self.other_ca, self.client_cert, self.client_key, self.rogue_cert,
                  self.rogue_key):
            assert os.path.isfile(p), p


@pytest.fixture(scope="session")
def tls_server(server):
    return TLSServer(server)
