"""PostgreSQL stopped and restarted under a running engramd: clear errors, then recovery."""
import time

from harness import free_port, metric, psql, wait_for, wait_value
from rpc import RpcError


def store_when_back(c, content, limit=30):
    """Stores content once the database answers again (within limit seconds); until then
    every failure must be 'unavailable'. Returns the result."""
    def attempt():
        try:
            return c.call("memory.store", content=content, type="fact", importance=0.5)
        except Exception as e:  # noqa: BLE001 - retrying until the pool reconnects
            assert "unavailable" in str(e), e
            return None

    r = wait_for(attempt, timeout=limit, interval=0.2)
    assert r, f"no recovery within {limit} s"
    return r


def test_database_outage_and_recovery(pg, engramd):
    dsn = pg.create_db("engram_outage")
    srv = engramd(dsn, extra=["--db-queue-timeout-ms", "1000", "--db-backoff-max-ms", "500"])
    _, key = srv.create_tenant()
    with srv.client(key=key) as c:
        a = c.call("memory.store", content="before the outage", type="fact", importance=0.5)
        assert c.call("memory.search", query="before the outage", top_k=1)["results"][0]["id"] == a["id"]
        status, _ = srv.http_get("/healthz")
        assert status == 200

        pg.stop()
        # a vector search whose rows are cached still answers from the index and the row
        # cache (a premium tenant needs no admission check in the database)
        res = c.call("memory.search", query="before the outage", top_k=1)["results"]
        assert [r["content"] for r in res] == ["before the outage"]
        # every request that needs the database gets a clear 'unavailable' within a
        # bounded time, never a hang
        for method, params in [("memory.store", {"content": "during", "type": "fact", "importance": 0.5}),
                               ("memory.get", {"ids": [a["id"]]}),
                               ("memory.search", {"query": "before the outage", "mode": "text"})]:
            t0 = time.time()
            err = c.call_err(method, **params)
            elapsed = time.time() - t0
            assert err["code"] == "unavailable", (method, err)
            assert elapsed < 10, f"{method} took {elapsed:.1f} s"
        assert c.call("ping") == "pong"  # the server itself is alive
        # the workers publish their pools' state on their tick (every 100 ms): /healthz says
        # the database is down from then on, not necessarily as the first request fails
        wait_value(lambda: srv.http_get("/healthz"),
                   lambda r: r[0] == 503 and '"database":"down"' in r[1],
                   "/healthz 503 with the database down", timeout=10)

        pg.start()
        b = store_when_back(c, "after the outage")
        got = c.call("memory.get", ids=[a["id"], b["id"]])["memories"]
        assert [m["content"] for m in got] == ["before the outage", "after the outage"]
        assert wait_for(lambda: srv.http_get("/healthz")[0] == 200, timeout=30, interval=0.2), \
            "healthz did not recover"


def test_hung_database_is_noticed_and_survived(pg, engramd):
    """PostgreSQL stopped with SIGSTOP: its sockets stay open and nothing answers. The
    heartbeat notices within seconds: requests fail with 'unavailable' instead of waiting for
    the statement timeout, /healthz and /readyz say the database is down, and all recovers by
    itself once PostgreSQL runs again."""
    dsn = pg.create_db("engram_hung")
    srv = engramd(dsn, extra=["--db-backoff-max-ms", "500"])
    _, key = srv.create_tenant()
    with srv.client(key=key) as c:
        a = c.call("memory.store", content="before", type="fact", importance=0.5)
        assert srv.http_get("/readyz")[0] == 200
        pg.freeze()  # thawed by the fixture should the test fail before it does
        t0 = time.time()
        worst = 0.0
        for i in range(6):
            t1 = time.time()
            err = c.call_err("memory.store", content=f"during {i}", type="fact",
                             importance=0.5)
            worst = max(worst, time.time() - t1)
            assert err["code"] == "unavailable", err
        # the first waits for the stall to be noticed (3 s of silence), later ones fail fast
        assert worst < 8, f"a request hung {worst:.1f} s"
        body = wait_for(lambda: (r := srv.http_get("/readyz"))[0] == 503 and r[1], timeout=10,
                        interval=0.2)
        assert body, "readyz still says ready"
        assert '"database":"down"' in body and srv.http_get("/healthz")[0] == 503
        noticed = time.time() - t0
        print(f"hung database: longest request {worst:.2f} s, reported down after "
              f"{noticed:.2f} s")
        assert c.call("ping") == "pong"
        pg.thaw()
        b = store_when_back(c, "after")
        got = c.call("memory.get", ids=[a["id"], b["id"]])["memories"]
        assert [m["content"] for m in got] == ["before", "after"]
        assert wait_for(lambda: srv.http_get("/readyz")[0] == 200, timeout=30, interval=0.2), \
            "readyz did not recover"
    assert "database not responding" in srv.log_text()


def test_multi_host_dsn_and_a_read_only_primary(pg, engramd):
    """engramd on a multi-host DSN whose first host is dead (connection refused) with
    target_session_attrs=read-write: it finds the live one. When that server stops taking
    writes (as a primary demoted by a failover does; here default_transaction_read_only), a
    write fails with 'unavailable' (SQLSTATE 25006 is not an internal error), the connection
    is dropped, and libpq refuses read-only servers until one takes writes again; then
    writes resume by themselves."""
    dsn = pg.create_db("engram_multihost")
    dead = free_port()
    multi = (f"host=127.0.0.1,{pg.run} port={dead},5432 dbname=engram_multihost "
             "user=postgres target_session_attrs=read-write")
    srv = engramd(multi, extra=["--db-queue-timeout-ms", "1000", "--db-backoff-max-ms", "500"])
    _, key = srv.create_tenant()
    with srv.client(key=key) as c:
        a = c.call("memory.store", content="written before", type="fact", importance=0.5)
        psql(dsn, "ALTER SYSTEM SET default_transaction_read_only = on")
        psql(dsn, "SELECT pg_reload_conf()")
        t0 = time.time()
        errs = []
        # the reload reaches each backend at its next command: the first stores may
        # still commit; then every one fails with 'unavailable', none hangs
        while time.time() - t0 < 10 and len(errs) < 3:
            t1 = time.time()
            try:
                c.call("memory.store", content="during", type="fact", importance=0.5)
            except RpcError as e:
                assert e.code == "unavailable", e
                errs.append(e.message)
            assert time.time() - t1 < 8, "a store hung on a read-only primary"
        assert len(errs) == 3, "stores did not fail on a read-only server"
        psql(dsn, "ALTER SYSTEM RESET default_transaction_read_only")
        psql(dsn, "SELECT pg_reload_conf()")
        b = store_when_back(c, "written after")
        got = c.call("memory.get", ids=[a["id"], b["id"]])["memories"]
        assert [m["content"] for m in got] == ["written before", "written after"]
    log = srv.log_text()
    assert "read-only (not the primary); reconnecting" in log or \
        "session is read-only" in log, log[-3000:]


def test_idle_connections_are_kept(pg, engramd):
    """Idle pool connections are pinged every second and must stay: a ping is never mistaken
    for a statement that ran too long (the tick read the clock before stamping the ping, and
    the unsigned difference wrapped), which dropped and re-made connections every few
    seconds."""
    dsn = pg.create_db("engram_idle")
    srv = engramd(dsn, extra=["--pg-pool-size", "4"])
    _, key = srv.create_tenant()
    with srv.client(key=key) as c:
        c.call("memory.store", content="one memory", type="fact", importance=0.5)
    # 2 workers x 4 connections, about 80 pings; the old check dropped one in ten
    time.sleep(10)
    assert metric(srv, "engram_db_reconnects_total") == 0
    assert "did not answer in time" not in srv.log_text(), srv.log_text()[-3000:]
