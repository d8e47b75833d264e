"""Pipelining, reconnects, lost replies, timeouts, rate limits and quotas.

A proxy (tests/proxy.py) sits between the client and engramd so a test can cut the
connection, drop an answer or swallow answers."""
import asyncio
import threading
import time

import pytest

from engram_client import (NO_RETRY, AsyncClient, Client, ConnectionLost, EngramTimeout,
                           QuotaExceeded, RateLimited, RetryPolicy)

V = [0.5, 0.1, 0.2, 0.3, 0.0, 0.4, 0.1, 0.2]


def vec(i):
    return [float(i + 1)] + V[1:]


def test_pipeline_futures_match_answers(client):
    futs = [client.pipeline.memory.store(content=f"pipelined {i}", type="fact", importance=0.5,
                                         embedding=vec(i))
            for i in range(200)]
    ids = [f.result(timeout=30)["id"] for f in futs]
    assert len(set(ids)) == 200
    # reads and writes mixed in flight together; each answer reaches its own future
    gets = [client.pipeline.memory.get([i]) for i in ids]
    stats = client.pipeline.memory.stats()
    for i, g in zip(range(200), gets):
        assert g.result(timeout=30)["memories"][0]["content"] == f"pipelined {i}"
    assert stats.result(timeout=30)["total"] == 200


def test_threads_share_one_connection(client):
    errors = []

    def work(t):
        try:
            for i in range(20):
                r = client.memory.store(content=f"t{t}-{i}", type="fact", importance=0.5,
                                        embedding=vec(t * 20 + i))
                assert client.memory.get([r["id"]])["memories"][0]["content"] == f"t{t}-{i}"
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert client.memory.stats()["total"] == 160


def test_reconnect_and_reauthenticate(server, key, proxy):
    with Client("127.0.0.1", proxy.port, api_key=key) as c:
        assert c.memory.stats()["total"] == 0
        proxy.cut()
        # a tenant method succeeds: the client reconnected and sent auth again
        assert c.memory.stats()["total"] == 0
        proxy.refuse = 2  # the next connections are closed at once: backoff, then through
        proxy.cut()
        assert c.tenant.usage()["tier"] == "premium"
        assert proxy.accepted >= 5


def test_lost_reply_to_store_is_retried_without_storing_twice(server, key, proxy):
    with Client("127.0.0.1", proxy.port, api_key=key) as c:
        c.connect()
        proxy.drop_next_reply = True
        r = c.memory.store(content="stored once", type="fact", importance=0.5, embedding=V)
        assert r["replayed"] is True  # the retry carried the first try's idempotency key
    with server.client(key) as c:
        assert c.memory.stats()["total"] == 1


def test_lost_reply_to_unrepeatable_write_is_reported(server, key, proxy):
    with server.client(key) as direct:
        sid = direct.session.create(agent_id=1, config={"model": "m"})["session_id"]
    with Client("127.0.0.1", proxy.port, api_key=key) as c:
        c.connect()
        proxy.drop_next_reply = True
        with pytest.raises(ConnectionLost) as e:
            c.session.append(sid, role="user", content="maybe")
        assert e.value.maybe_committed is True
        # the client is usable again afterwards
        assert len(c.session.messages(sid)["messages"]) == 1


def test_timeout(server, key, proxy):
    with Client("127.0.0.1", proxy.port, api_key=key, timeout=0.5) as c:
        c.connect()
        proxy.blackhole = True
        t0 = time.monotonic()
        with pytest.raises(EngramTimeout):
            c.memory.stats()
        assert time.monotonic() - t0 < 2.0
        f = c.pipeline.memory.stats()
        with pytest.raises(EngramTimeout):
            f.result(timeout=5)  # the client fails the future at its deadline
        proxy.blackhole = False
        assert c.memory.stats()["total"] == 0


def test_rate_limited_raised_or_honoured(server):
    key = server.tenant(tier="free", dim=8)  # 2 requests/s, burst 3 (clients/run-tests)
    with server.client(key, retry=NO_RETRY) as c:
        with pytest.raises(RateLimited) as e:
            for _ in range(10):
                c.memory.stats()
        assert e.value.retry_after_ms > 0
    with server.client(key) as c:  # the default policy waits retry_after_ms and repeats
        for _ in range(4):
            c.memory.stats()
    with server.client(key, retry=RetryPolicy(max_rate_limit_wait=0.0)) as c:
        with pytest.raises(RateLimited):
            for _ in range(10):
                c.memory.stats()


def test_quota_exceeded_carries_limit_and_usage(server):
    key = server.tenant(tier="standard", dim=8)  # 3 memories (clients/run-tests)
    with server.client(key) as c:
        for i in range(3):
            c.memory.store(content=f"m{i}", type="fact", importance=0.5, embedding=vec(i))
        with pytest.raises(QuotaExceeded) as e:
            c.memory.store(content="one too many", type="fact", importance=0.5, embedding=V)
        assert (e.value.limit, e.value.usage, e.value.requested) == (3, 3, 1)


def test_async_reconnect_lost_reply_and_timeout(server, key, proxy):
    async def main():
        async with AsyncClient("127.0.0.1", proxy.port, api_key=key, timeout=5) as c:
            await c.connect()
            proxy.drop_next_reply = True
            r = await c.memory.store(content="async once", type="fact", importance=0.5, embedding=V)
            assert r["replayed"] is True
            proxy.cut()
            assert (await c.memory.stats())["total"] == 1
            sid = (await c.session.create(agent_id=1, config={"model": "m"}))["session_id"]
            proxy.drop_next_reply = True
            with pytest.raises(ConnectionLost) as e:
                await c.session.append(sid, role="user", content="maybe")
            assert e.value.maybe_committed
            proxy.blackhole = True
            with pytest.raises(EngramTimeout):
                await c.with_options(timeout=0.3).memory.stats()
            proxy.blackhole = False
            results = await asyncio.gather(*[c.memory.get([r["id"]]) for _ in range(100)])
            assert all(x["memories"][0]["content"] == "async once" for x in results)
    asyncio.run(main())


def test_answers_out_of_order_reach_their_callers():
    """A stand-in server that answers a burst of requests in reverse order: each future
    must still get its own answer (msgid matching, not arrival order)."""
    import socket

    import msgpack

    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)

    def serve():
        conn, _ = ls.accept()
        up = msgpack.Unpacker(raw=False)
        reqs = []
        while len(reqs) < 20:
            up.feed(conn.recv(65536))
            reqs.extend(up)
        for _, msgid, method, params in reversed(reqs):
            conn.sendall(msgpack.packb([1, msgid, None, {"echo": params[0]["ids"][0]}]))
        conn.recv(1)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with Client("127.0.0.1", ls.getsockname()[1], timeout=10) as c:
        futs = [c.pipeline.memory.get([i]) for i in range(20)]
        assert [f.result(timeout=10)["echo"] for f in futs] == list(range(20))
    ls.close()


def test_sync_with_options_timeout(server, key, proxy):
    with Client("127.0.0.1", proxy.port, api_key=key) as c:
        c.connect()
        proxy.blackhole = True
        with pytest.raises(EngramTimeout):
            c.with_options(timeout=0.3).memory.stats()
