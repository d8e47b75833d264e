"""Query admission from blocks of the day's quota reserved per worker (server/domain/qadmit.h).

Two engramd processes share one database. N searches from both, on many connections at
once, against a daily limit L admit exactly L: never more (the blocks are granted under the
day's counter row lock only while used + held <= L), never fewer (a search that finds no
quota waits while the other process still holds some, so the last units are used or given
back). Searches in the common case make no database round trip: many searches cost only a
few reservations. Unused blocks are given back at shutdown."""
import concurrent.futures

import pytest

from harness import RpcError, metric, psql, running_pair, wait_for

LIMIT = 137
LIMITS = ["--free-queries-per-day", str(LIMIT), "--free-rate-per-s", "100000",
          "--free-rate-burst", "100000", "--premium-rate-per-s", "0"]


@pytest.fixture(scope="module")
def pair():
    with running_pair("qblocks", LIMITS) as p:
        yield p


def search_many(srv, key, n):
    out = []
    with srv.client(key=key) as c:
        for _ in range(n):
            try:
                c.call("memory.search", query="shared", top_k=1)
                out.append("ok")
            except RpcError as e:
                out.append(e.code)
    return out


def reservations(srv):
    return int(metric(srv, "engram_query_reservations_total", default=0))


def test_searches_from_two_processes_admit_exactly_the_limit(pair):
    a, b, dsn = pair
    tid, key = a.create_tenant(tier="free")
    with a.client(key=key) as c:
        c.call("memory.store", content="shared", type="fact", importance=0.5)
    # 8 connections per process, 40 searches each: 640 searches for 137 places
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
        futs = [ex.submit(search_many, srv, key, 40) for srv in (a, b) for _ in range(8)]
        out = [o for f in futs for o in f.result()]
    assert len(out) == 640
    assert out.count("ok") == LIMIT, (out.count("ok"), set(out))
    assert set(out) == {"ok", "quota_exceeded"}
    # every used query is reported: usage says the limit on both processes, nothing held
    for srv in (a, b):
        with srv.client(key=key) as c:
            u = c.call("tenant.usage")["queries"]
            assert (u["today"], u["limit"]) == (LIMIT, LIMIT)
            err = c.call_err("memory.search", query="shared")
            assert (err["code"], err["limit"], err["usage"]) == ("quota_exceeded", LIMIT, LIMIT)
    assert psql(dsn, f"SELECT COALESCE(sum(held), 0) FROM tenant_query_blocks "
                     f"WHERE tenant_id = {tid}") == "0"


def test_common_case_makes_no_round_trip_and_blocks_come_back(pair):
    a, b, dsn = pair
    tid, key = a.create_tenant(tier="free")
    with a.client(key=key) as c:
        c.call("memory.store", content="shared", type="fact", importance=0.5)
        before = reservations(a)
        for _ in range(100):
            c.call("memory.search", query="shared", top_k=1)
        # blocks of 8, 16, 32, 64 (growing while the tenant is busy): a handful of round
        # trips for 100 searches, not one each
        assert reservations(a) - before <= 8, reservations(a) - before
    # an idle block is given back (reported used, the rest returned) within a few seconds
    assert wait_for(lambda: psql(dsn, f"SELECT COALESCE(sum(held), 0) FROM tenant_query_blocks "
                                      f"WHERE tenant_id = {tid}") == "0", timeout=10, interval=0.2)
    assert psql(dsn, f"SELECT queries FROM tenant_usage WHERE tenant_id = {tid}") == "100"
    # a held block is returned at shutdown
    with b.client(key=key) as c:
        c.call("memory.search", query="shared", top_k=1)
    held = int(psql(dsn, f"SELECT COALESCE(sum(held), 0) FROM tenant_query_blocks "
                         f"WHERE tenant_id = {tid}"))
    assert held > 0
    b.stop()
    assert psql(dsn, f"SELECT COALESCE(sum(held), 0) FROM tenant_query_blocks "
                     f"WHERE tenant_id = {tid}") == "0"
    assert psql(dsn, f"SELECT queries FROM tenant_usage WHERE tenant_id = {tid}") == "101"
    b.start()
