"""TLS: the blocking and the asyncio client against the engramd that serves TLS 1.3 with a
throwaway PKI (made by clients/run-tests with the openssl command line). A tenant's work
over TLS; the server's certificate and name are verified by default (another CA, another
name and the system's CA store are refused, at once and without retries); the admin key
needs the operators' client certificate there; reconnects do a new handshake; large and
pipelined requests from many threads share one TLS session."""
import asyncio
import random
import ssl
import string
import threading

import pytest

from engram_client import AsyncClient, Client, TLSError, Unauthenticated
from proxy import Proxy

V = [0.1, 0.9, 0.2, 0.0, 0.3, 0.0, 0.5, 0.1]


def vec(i):
    return [float(i + 1)] + V[1:]


def tenant_name():
    return "py-tls-" + "".join(random.choices(string.ascii_lowercase, k=12))


def session_version(c):
    """The protocol version of the client's live TLS session."""
    return c._core.conn.sock.sock.version()


def test_tenant_stores_and_searches_over_tls(server, tls_server):
    t = tls_server
    key = server.tenant(dim=8)
    with Client(t.host, t.port, api_key=key, tls_ca_file=t.ca) as c:
        assert "tls=True" in repr(c) and key not in repr(c)
        r = c.memory.store(content="The user prefers metric units", type="preference",
                           importance=0.8, embedding=V)
        hits = c.memory.search(embedding=V, top_k=3)["results"]
        assert [h["id"] for h in hits] == [r["id"]]
        assert hits[0]["content"] == "The user prefers metric units"
        assert c.memory.search(query="metric", mode="text")["results"][0]["id"] == r["id"]
        assert session_version(c) == "TLSv1.3"
    # the same database behind the plain port: the memory is there
    with server.client(key) as c:
        assert c.memory.get([r["id"]])["memories"][0]["content"] == \
            "The user prefers metric units"
    # the name the certificate carries as a DNS name, with the connection to its address
    with Client(t.host, t.port, api_key=key, tls_ca_file=t.ca,
                tls_server_hostname="localhost") as c:
        assert c.memory.stats()["total"] == 1


def test_wrong_ca_is_refused(server, tls_server):
    t = tls_server
    key = server.tenant(dim=8)
    with Client(t.host, t.port, api_key=key, tls_ca_file=t.other_ca) as c:
        with pytest.raises(TLSError, match="certificate did not verify"):
            c.memory.stats()
    # tls=True alone trusts the system's CA store, which does not hold the test CA
    with Client(t.host, t.port, api_key=key, tls=True) as c:
        with pytest.raises(TLSError, match="certificate did not verify"):
            c.ping()


def test_wrong_host_name_is_refused(server, tls_server):
    t = tls_server
    key = server.tenant(dim=8)
    with Client(t.host, t.port, api_key=key, tls_ca_file=t.ca,
                tls_server_hostname="engram.invalid") as c:
        with pytest.raises(TLSError, match="engram.invalid"):
            c.memory.stats()
    # an SSLContext of the caller's is used as it is: its own name check applies
    ctx = ssl.create_default_context(cafile=t.ca)
    with Client(t.host, t.port, api_key=key, tls=ctx, tls_server_hostname="other.invalid") as c:
        with pytest.raises(TLSError, match="other.invalid"):
            c.connect()


def test_admin_needs_a_client_certificate(server, tls_server):
    t = tls_server
    with Client(t.host, t.port, api_key=t.admin_key, tls_ca_file=t.ca,
                tls_cert_file=t.client_cert, tls_key_file=t.client_key) as a:
        key = a.admin.tenant.create(name=tenant_name(), tier="premium")["api_key"]
        assert a.admin.tenant.list(limit=1)["tenants"]
    with server.client(key) as c:  # made over TLS, usable anywhere
        assert c.tenant.usage()["tier"] == "premium"
    # without a certificate the TLS session is fine, the admin key is not
    with Client(t.host, t.port, api_key=t.admin_key, tls_ca_file=t.ca) as a:
        with pytest.raises(Unauthenticated, match="client certificate"):
            a.admin.tenant.list()
    # a tenant key needs none
    with Client(t.host, t.port, api_key=key, tls_ca_file=t.ca) as c:
        assert c.tenant.usage()["tier"] == "premium"
    # a certificate the server's CA does not sign is refused in the handshake
    with Client(t.host, t.port, api_key=t.admin_key, tls_ca_file=t.ca,
                tls_cert_file=t.rogue_cert, tls_key_file=t.rogue_key) as a:
        with pytest.raises(TLSError):
            a.admin.tenant.list()
    # the caller's own SSLContext with the operator's certificate
    ctx = ssl.create_default_context(cafile=t.ca)
    ctx.load_cert_chain(t.client_cert, t.client_key)
    with Client(t.host, t.port, api_key=t.admin_key, tls=ctx) as a:
        assert a.admin.tenant.list(limit=1)["tenants"]


def test_options_are_checked(tls_server):
    t = tls_server
    with pytest.raises(ValueError):
        Client(t.host, t.port, tls=False, tls_ca_file=t.ca)
    with pytest.raises(ValueError):
        Client(t.host, t.port, tls_ca_file=t.ca, tls_key_file=t.client_key)
    with pytest.raises(ValueError):
        Client(t.host, t.port, tls=ssl.create_default_context(), tls_ca_file=t.ca)
    with pytest.raises(TypeError):
        Client(t.host, t.port, tls="yes")
    with pytest.raises(FileNotFoundError):
        Client(t.host, t.port, tls_ca_file=t.ca + ".missing")
    with pytest.raises(ValueError):
        AsyncClient(t.host, t.port, tls=False, tls_cert_file=t.client_cert)
    # plain stays plain: no TLS option, no TLS
    assert "tls" not in repr(Client(t.host, t.port))


def test_reconnect_does_a_new_handshake(server, tls_server):
    t = tls_server
    key = server.tenant(dim=8)
    p = Proxy(t.host, t.port)  # TCP only: the TLS session runs through it end to end
    try:
        with Client("127.0.0.1", p.port, api_key=key, tls_ca_file=t.ca) as c:
            c.memory.store(content="before the cut", type="fact", importance=0.5, embedding=V)
            p.cut()
            assert c.memory.stats()["total"] == 1  # reconnected, handshake, auth again
            assert p.accepted == 2
            assert session_version(c) == "TLSv1.3"
    finally:
        p.close()


def test_large_and_pipelined_requests_share_the_session(server, tls_server):
    t = tls_server
    key = server.tenant(dim=8)
    with Client(t.host, t.port, api_key=key, tls_ca_file=t.ca) as c:
        # a 4 MB request: far more than a socket buffer, so writes wait while answers
        # to the pipelined requests below are read on the same session
        futs = [c.pipeline.memory.store(content=f"pipelined {i}", type="fact", importance=0.5,
                                        embedding=vec(i))
                for i in range(100)]
        big = c.pipeline.memory.store_batch(memories=[
            {"content": f"{i} " + "x" * 60000, "type": "fact", "importance": 0.5,
             "embedding": vec(i)} for i in range(64)])
        futs += [c.pipeline.memory.store(content=f"pipelined {i}", type="fact", importance=0.5,
                                         embedding=vec(i))
                 for i in range(100, 200)]
        assert len(big.result(timeout=60)["ids"]) == 64
        ids = [f.result(timeout=60)["id"] for f in futs]
        assert len(set(ids)) == 200
        errors = []

        def work(n):
            try:
                for i in range(20):
                    r = c.memory.store(content=f"t{n}-{i}", type="fact", importance=0.5,
                                       embedding=vec(i))
                    assert c.memory.get([r["id"]])["memories"][0]["content"] == f"t{n}-{i}"
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors
        assert c.memory.stats()["total"] == 200 + 64 + 160
        got = c.memory.get(big.result()["ids"][:1])["memories"][0]["content"]
        assert got == "0 " + "x" * 60000


def test_asyncio_client_over_tls(server, tls_server):
    t = tls_server
    key = server.tenant(dim=8)

    async def main():
        async with AsyncClient(t.host, t.port, api_key=key, tls_ca_file=t.ca) as c:
            assert "tls=True" in repr(c)
            r = await c.memory.store(content="async over TLS", type="fact", importance=0.5,
                                     embedding=V)
            hits = (await c.memory.search(embedding=V, top_k=1))["results"]
            assert [h["id"] for h in hits] == [r["id"]]
            stored = await asyncio.gather(*(c.memory.store(content=f"a{i}", type="fact",
                                                           importance=0.5,
                                                           embedding=vec(i))
                                            for i in range(100)))
            assert len({s["id"] for s in stored}) == 100
            big = await c.memory.store_batch(memories=[
                {"content": f"{i} " + "y" * 60000, "type": "fact", "importance": 0.5,
                 "embedding": vec(i)} for i in range(64)])
            assert len(big["ids"]) == 64
            assert (await c.memory.stats())["total"] == 165
            ssl_obj = c._conn.writer.get_extra_info("ssl_object")
            assert ssl_obj is not None and ssl_obj.version() == "TLSv1.3"
        async with AsyncClient(t.host, t.port, api_key=key, tls_ca_file=t.other_ca) as c:
            with pytest.raises(TLSError, match="certificate did not verify"):
                await c.memory.stats()
        async with AsyncClient(t.host, t.port, api_key=key, tls=True) as c:
            with pytest.raises(TLSError, match="certificate did not verify"):
                await c.ping()
        async with AsyncClient(t.host, t.port, api_key=key, tls_ca_file=t.ca,
                               tls_server_hostname="engram.invalid") as c:
            with pytest.raises(TLSError, match="engram.invalid"):
                await c.memory.stats()
        async with AsyncClient(t.host, t.port, api_key=t.admin_key, tls_ca_file=t.ca,
                               tls_cert_file=t.client_cert,
                               tls_key_file=t.client_key) as a:
            created = await a.admin.tenant.create(name=tenant_name(), tier="standard")
            assert created["api_key"]
        async with AsyncClient(t.host, t.port, api_key=t.admin_key, tls_ca_file=t.ca) as a:
            with pytest.raises(Unauthenticated, match="client certificate"):
                await a.admin.tenant.list()
        async with AsyncClient(t.host, t.port, api_key=t.admin_key, tls_ca_file=t.ca,
                               tls_cert_file=t.rogue_cert, tls_key_file=t.rogue_key) as a:
            with pytest.raises(TLSError):
                await a.admin.tenant.list()

    asyncio.run(main())
