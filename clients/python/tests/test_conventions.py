"""What an integrator meets first: one argument style for every method (the old positional
style still working, with a DeprecationWarning), the parameter a validation error is about,
a refused connection raising at once, and the environment every Engram tool reads."""
import asyncio
import os
import socket
import time
import warnings

import pytest

from engram_client import AsyncClient, Client, ConnectionLost, InvalidArgument
from engram_client.errors import error_from_wire

V = [1.0] * 8


def compact_config():
    return {"model": "m", "compaction": {"keep_recent": 1}}


# ---- one argument style ----------------------------------------------------------------


def test_session_methods_take_the_session_first(client):
    """append and summarize both take the session by position, the rest by keyword (in
    0.1 summarize took summary, through_entry_id and messages_compacted by position and
    session_id by keyword only)."""
    sid = client.session.create(agent_id=1, config=compact_config())["session_id"]
    first = client.session.append(sid, role="user", content="one")["entry_id"]
    client.session.append(sid, role="assistant", content="two")
    client.session.append(sid, role="user", content="three")
    s = client.session.summarize(sid, summary="one, two", through_entry_id=first,
                                 messages_compacted=1)
    assert s["session_id"] == sid and s["compaction_count"] == 1
    gone = client.session.append(sid, role="user", content="four")["entry_id"]
    t = client.session.tombstone(sid, entry_id=gone)
    assert t["entry_id"] == gone and t["session_id"] == sid
    hits = client.memory.search(query="anything", top_k=1)
    assert hits["results"] == []


def test_everything_else_is_keyword_only(client):
    with pytest.raises(TypeError):
        client.session.append(1, "user", "x", 5)  # fits neither style
    with pytest.raises(TypeError):
        client.memory.search("a query")  # search never took positions


def test_old_positional_calls_still_work_with_a_warning(client):
    with pytest.warns(DeprecationWarning, match=r"memory.store: pass content=, type=, "
                                                r"importance= by keyword"):
        r = client.memory.store("old style", "fact", 0.5, embedding=V)
    assert client.memory.get([r["id"]])["memories"][0]["content"] == "old style"
    with pytest.warns(DeprecationWarning, match="session.create"):
        sid = client.session.create(1, compact_config())["session_id"]
    with pytest.warns(DeprecationWarning, match="session.append"):
        e = client.session.append(sid, "user", "a")["entry_id"]
    client.session.append(sid, role="user", content="b")
    with pytest.warns(DeprecationWarning, match="session.summarize"):
        s = client.session.summarize("a", e, 1, session_id=sid)  # 0.1's order
    assert s["session_id"] == sid
    with pytest.warns(DeprecationWarning, match="session.tombstone"):
        assert client.session.tombstone(e)["entry_id"] == e
    with pytest.warns(DeprecationWarning):
        f = client.pipeline.memory.store("old pipelined", "fact", 0.5, embedding=V)
    assert f.result(timeout=30)["id"] > r["id"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new style warns about nothing
        client.memory.store(content="new style", type="fact", importance=0.5, embedding=V)
        client.session.append(sid, role="user", content="c")


def test_asyncio_client_has_the_same_style(server, key):
    async def main():
        async with AsyncClient(server.host, server.port, api_key=key) as a:
            sid = (await a.session.create(agent_id=1, config=compact_config()))["session_id"]
            e = (await a.session.append(sid, role="user", content="x"))["entry_id"]
            await a.session.append(sid, role="user", content="y")
            s = await a.session.summarize(sid, summary="x", through_entry_id=e,
                                          messages_compacted=1)
            assert s["compaction_count"] == 1
            with pytest.warns(DeprecationWarning, match="memory.store"):
                r = await a.memory.store("async old style", "fact", 0.5, embedding=V)
            assert r["id"] > 0
    asyncio.run(main())


# ---- validation errors name their parameter --------------------------------------------


def test_invalid_argument_names_the_parameter(client):
    with pytest.raises(InvalidArgument) as e:
        client.memory.search(query="x", top_k=0)
    assert e.value.field == "top_k"
    with pytest.raises(InvalidArgument) as e:
        client.call("memory.search", {"query": "x", "colour": "red"})
    assert e.value.field == "colour"
    with pytest.raises(InvalidArgument) as e:
        client.call("memory.store", {"content": "x", "type": "fact"})
    assert e.value.field == "importance"
    with pytest.raises(InvalidArgument) as e:
        client.memory.store_batch(memories=[
            {"content": "ok", "type": "fact", "importance": 0.5, "embedding": V},
            {"content": "bad", "type": "fact", "importance": 7, "embedding": V}])
    assert e.value.field == "memories[1].importance"
    with pytest.raises(InvalidArgument) as e:
        client.memory.store(content="x", type="fact", importance=0.5, metadata={"colour": 1})
    assert e.value.field == "metadata.colour"


def test_the_servers_field_wins_over_the_message():
    err = error_from_wire({"code": "invalid_argument", "message": "parameter 'a' is bad",
                           "field": "b"}, "memory.search")
    assert isinstance(err, InvalidArgument) and err.field == "b"
    err = error_from_wire({"code": "invalid_argument", "message": "no name here"})
    assert err.field is None


def test_field_from_the_message_of_a_server_that_sends_none():
    cases = {
        "parameter 'top_k' must be between 1 and 1000": "top_k",
        "unknown parameter 'colour'": "colour",
        "missing required parameter 'content'": "content",
        "memories[3]: parameter 'importance' must be between 0 and 1": "memories[3].importance",
        "unknown field 'metadata.colour' (metadata holds tokens, ...)": "metadata.colour",
        "'memories[2]' must be a map": "memories[2]",
        "parameters 'type' and 'memory_type' name the same parameter and differ": "type",
    }
    for message, field in cases.items():
        err = error_from_wire({"code": "invalid_argument", "message": message})
        assert isinstance(err, InvalidArgument) and err.data == {}
        assert err.field == field, message


# ---- a refused connection raises at once ------------------------------------------------


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def blackhole():
    """A port whose listener never accepts and whose queue is full: SYNs get no answer."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(ls.getsockname())
        except BlockingIOError:
            pass
        fill.append(s)
    time.sleep(0.1)
    return ls, fill


def test_refused_connection_raises_within_a_second():
    """0.1 tried 16 times with backoff up to 2 s: about 18 s."""
    port = free_port()
    t = time.monotonic()
    with pytest.raises(ConnectionLost, match="cannot connect"):
        Client("127.0.0.1", port, api_key="egk_x").memory.stats()
    took = time.monotonic() - t
    print(f"sync client, refused port: raised after {took:.2f} s")
    assert took < 3

    async def main():
        t = time.monotonic()
        with pytest.raises(ConnectionLost, match="cannot connect"):
            await AsyncClient("127.0.0.1", port, api_key="egk_x").memory.stats()
        return time.monotonic() - t
    took = asyncio.run(main())
    print(f"asyncio client, refused port: raised after {took:.2f} s")
    assert took < 3


def test_unanswered_connect_gives_up_after_the_connect_timeout():
    ls, fill = blackhole()
    try:
        port = ls.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(ConnectionLost, match="no answer within 1 s"):
            Client("127.0.0.1", port, timeout=30).memory.stats()
        took = time.monotonic() - t
        print(f"sync client, unanswered connect: raised after {took:.2f} s")
        assert took < 3

        async def main():
            t = time.monotonic()
            with pytest.raises(ConnectionLost):
                await AsyncClient("127.0.0.1", port, timeout=30).memory.stats()
            return time.monotonic() - t
        took = asyncio.run(main())
        print(f"asyncio client, unanswered connect: raised after {took:.2f} s")
        assert took < 3
    finally:
        for s in fill:
            s.close()
        ls.close()


# ---- the environment --------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("ENGRAM_") and not k.startswith("ENGRAM_TEST_"):
            monkeypatch.delenv(k)
    return monkeypatch


def test_client_reads_url_and_key_file_from_the_environment(server, key, clean_env, tmp_path):
    kf = tmp_path / "tenant.key"
    kf.write_text(key + "\n")
    clean_env.setenv("ENGRAM_URL", f"engram://{server.host}:{server.port}")
    clean_env.setenv("ENGRAM_API_KEY_FILE", str(kf))
    with Client() as c:
        assert c.tenant.usage()["tier"] == "premium"

    async def main():
        async with AsyncClient() as a:
            return await a.tenant.usage()
    assert asyncio.run(main())["tier"] == "premium"
    # ENGRAM_API_KEY wins over the file; explicit options win over both
    clean_env.setenv("ENGRAM_API_KEY", "egk_not_a_key")
    with pytest.raises(Exception, match="unauthenticated"):
        Client().tenant.usage()
    with Client(api_key=key) as c:
        assert c.tenant.usage()["tier"] == "premium"
    clean_env.setenv("ENGRAM_URL", f"engram://{server.host}:{free_port()}")
    with Client(server.host, server.port, api_key=key) as c:
        assert c.tenant.usage()["tier"] == "premium"
    with Client(url=f"tcp://{server.host}:{server.port}", api_key=key) as c:
        assert c.tenant.usage()["tier"] == "premium"


def test_engrams_url_speaks_tls_with_the_tls_variables(server, tls_server, clean_env):
    t = tls_server
    with Client(t.host, t.port, api_key=t.admin_key, tls_ca_file=t.ca,
                tls_cert_file=t.client_cert, tls_key_file=t.client_key) as a:
        key = a.admin.tenant.create(name=f"py-env-{os.getpid()}-{time.time_ns()}",
                                    tier="standard")["api_key"]
    clean_env.setenv("ENGRAM_URL", f"engrams://127.0.0.1:{t.port}")
    clean_env.setenv("ENGRAM_API_KEY", key)
    clean_env.setenv("ENGRAM_TLS_CA", t.ca)
    with Client() as c:
        assert c.tenant.usage()["tier"] == "standard"
    clean_env.setenv("ENGRAM_URL", f"engram://127.0.0.1:{t.port}")  # plain, but a CA: TLS
    with Client() as c:
        assert c.tenant.usage()["tier"] == "standard"


def test_bad_urls_are_refused_without_echoing_secrets(clean_env):
    with pytest.raises(ValueError, match="HTTP/JSON"):
        Client(url="http://127.0.0.1:7421")
    with pytest.raises(ValueError) as e:
        Client(url="engram://user:hunter2@127.0.0.1:7420")
    assert "hunter2" not in str(e.value)
    clean_env.setenv("ENGRAM_URL", "ftp://x")
    with pytest.raises(ValueError, match="ENGRAM_URL: unknown scheme"):
        Client()
    with pytest.raises(ValueError, match="not both"):
        Client("h", url="engram://h:1")
    clean_env.setenv("ENGRAM_URL", "engram://127.0.0.1:7420")
    clean_env.setenv("ENGRAM_API_KEY_FILE", "/nonexistent/key")
    with pytest.raises(OSError, match="ENGRAM_API_KEY_FILE"):
        Client()
