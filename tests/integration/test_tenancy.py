"""Tenants, API keys, tiers and exact quota enforcement (one engramd; see
test_multiprocess.py for two)."""
import concurrent.futures
import datetime
import os
import subprocess
import time

import pytest

from harness import CITUS, PG_BINDIR, RpcError, Server, new_database, psql, wait_for

LIMITS = ["--free-max-memories", "20", "--free-queries-per-day", "30",
          "--standard-rate-per-s", "5", "--standard-rate-burst", "5",
          "--free-rate-per-s", "1000", "--free-rate-burst", "1000",
          # 64 writers of a free tenant at once (its tier's default is 16 connections)
          "--free-max-connections", "128"]


def counts(memories):
    """tenant.usage's memory counts (its byte figures are tested in test_field_limits)."""
    return {k: memories[k] for k in ("stored", "archived", "limit")}


@pytest.fixture(scope="module")
def srv():
    dsn = new_database("ten")
    s = Server(dsn, extra=LIMITS).start()
    s.dsn_plain = dsn
    yield s
    try:
        s.stop()
    finally:
        s.cleanup()


def admin_call(s, method, **kw):
    with s.admin() as a:
        return a.call(method, **kw)


def test_admin_tenant_lifecycle(srv):
    with srv.admin() as a:
        t = a.call("admin.tenant.create", name="acme", tier="standard", embedding={"dim": 128})
        got = a.call("admin.tenant.get", tenant_id=t["tenant_id"])
        assert got["name"] == "acme" and got["tier"] == "standard" and got["embedding"]["dim"] == 128
        assert got["memories"] == 0 and got["keys"] == 1 and got["created_at"] > 0
        assert a.call("admin.tenant.get", name="acme")["tenant_id"] == t["tenant_id"]
        up = a.call("admin.tenant.update", name="acme", new_name="acme-2", tier="premium")
        assert up["name"] == "acme-2" and up["tier"] == "premium"
        assert a.call_err("admin.tenant.get", name="acme")["code"] == "not_found"
        assert a.call_err("admin.tenant.create", name="acme-2", tier="free")["code"] == "already_exists"
        assert a.call_err("admin.tenant.create", name="x", tier="gold")["code"] == "invalid_argument"
        err = a.call_err("admin.tenant.get", tenant_id=1, name="acme-2")
        assert err["code"] == "invalid_argument"
        assert a.call_err("admin.tenant.update", tenant_id=t["tenant_id"])["code"] == "invalid_argument"
        # listing pages through every tenant in id order
        made = [a.call("admin.tenant.create", name=f"page-{i}", tier="free")["tenant_id"] for i in range(7)]
        seen, cursor = [], None
        while True:
            page = a.call("admin.tenant.list", limit=3, **({"cursor": cursor} if cursor else {}))
            seen += [x["tenant_id"] for x in page["tenants"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == sorted(seen) and set(made) <= set(seen)
        assert a.call("admin.tenant.delete", name="page-0")["deleted"] is True
        assert a.call_err("admin.tenant.delete", name="page-0")["code"] == "not_found"
    with srv.client(key=t["api_key"]) as c:
        assert c.call("tenant.usage")["tier"] == "premium"


def test_admin_methods_need_the_admin_key(srv):
    _, key = srv.create_tenant()
    with srv.client(key=key) as c:
        for m, p in [("admin.tenant.list", {}), ("admin.key.list", {"tenant_id": 1}),
                     ("admin.key.revoke", {"key_id": 1}), ("admin.tenant.delete", {"tenant_id": 1}),
                     ("admin.tenant.move", {"tenant_id": 1, "node": "127.0.0.1:5432"})]:
            assert c.call_err(m, **p)["code"] == "permission_denied"
    with srv.admin() as a:
        assert a.call_err("memory.stats")["code"] == "permission_denied"


def test_tenant_move_needs_citus(srv):
    """admin.tenant.move moves a tenant between Citus workers (test_citus); on one PostgreSQL
    there is nowhere to move it to, and it says so."""
    tid, _ = srv.create_tenant()
    with srv.admin() as a:
        e = a.call_err("admin.tenant.move", tenant_id=tid, node="127.0.0.1:1")
    assert e["code"] == "invalid_argument"
    if CITUS:
        assert "not an active primary worker" in e["message"]
    else:
        assert "not a Citus cluster" in e["message"]


def test_keys_several_named_and_revocable(srv):
    tid, k1 = srv.create_tenant(tier="premium")
    with srv.admin() as a:
        k2 = a.call("admin.key.create", tenant_id=tid, name="ci")
        assert k2["api_key"].startswith("egk_") and k2["name"] == "ci" and k2["created_at"] > 0
    c1, c2 = srv.client(key=k1), srv.client(key=k2["api_key"])
    try:
        c1.call("memory.store", content="one", type="fact", importance=0.5)
        assert c2.call("memory.stats")["total"] == 1  # the same tenant through either key
        keys = admin_call(srv, "admin.key.list", tenant_id=tid)["keys"]
        assert [k["name"] for k in keys] == ["default", "ci"]
        # last_used_at is written after the auth answer, nothing waiting for it (m_sys.c):
        # a clean CI run once listed the keys before the second key's write had landed
        assert wait_for(lambda: all(
            k["last_used_at"] is not None
            for k in admin_call(srv, "admin.key.list", tenant_id=tid)["keys"]), timeout=10)
        keys = admin_call(srv, "admin.key.list", tenant_id=tid)["keys"]
        assert all(k["last_used_at"] is not None and k["revoked_at"] is None for k in keys)
        assert all(k["prefix"].startswith("egk_") and len(k["prefix"]) == 16 for k in keys)
        r = admin_call(srv, "admin.key.revoke", key_id=k2["key_id"])
        assert r["revoked"] is True and r["tenant_id"] == tid
        # the connection already authenticated with it fails on its very next request
        err = c2.call_err("memory.stats")
        assert err["code"] == "unauthenticated" and "revoked" in err["message"]
        assert c2.call_err("memory.stats")["code"] == "unauthenticated"
        assert c2.call_err("auth", api_key=k2["api_key"])["code"] == "unauthenticated"
        assert c1.call("memory.stats")["total"] == 1  # the other key is untouched
        keys = admin_call(srv, "admin.key.list", tenant_id=tid)["keys"]
        assert keys[1]["revoked_at"] is not None
        with srv.admin() as a:
            assert a.call_err("admin.key.revoke", key_id=k2["key_id"])["code"] == "not_found"
    finally:
        c1.close()
        c2.close()


def test_delete_removes_everything(srv):
    tid, key = srv.create_tenant(tier="premium")
    with srv.client(key=key) as c:
        c.call("memory.store_batch", memories=[{"content": f"d{i}", "type": "fact", "importance": 0.5}
                                              for i in range(10)])
        sid = c.call("session.create", agent_id=1, config={"model": "m"})["session_id"]
        c.call("session.append", session_id=sid, role="user", content="hi")
        c.call("memory.search", query="d1")
        # no model here: both record why they did nothing (session_extraction, dream_state)
        assert c.call("session.extract", session_id=sid)["status"] == "skipped"
        assert c.call("tenant.dream", run=True)["state"]["last_status"] == "no_model"
        admin_call(srv, "admin.tenant.delete", tenant_id=tid)
        assert c.call_err("memory.stats")["code"] == "unauthenticated"
    for table in ["memories", "memory_changes", "api_keys", "sessions", "session_entries",
                  "tenant_usage", "memory_versions", "idempotency_keys", "session_extraction",
                  "dream_state"]:
        assert psql(srv.dsn_plain, f"SELECT count(*) FROM {table} WHERE tenant_id = {tid}") == "0", table
    assert psql(srv.dsn_plain, f"SELECT count(*) FROM tenants WHERE id = {tid}") == "0"
    with srv.client() as c:
        assert c.call_err("auth", api_key=key)["code"] == "unauthenticated"


def test_keys_never_reach_logs_or_database(srv):
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        c.call("memory.store", content="secret test", type="fact", importance=0.5)
        c.call_err("memory.store", content="x", type="nope", importance=0.5)
    with srv.client() as c:
        c.call_err("auth", api_key=key + "x")
    secret = key.split("_", 2)[2]
    dump = subprocess.run([os.path.join(PG_BINDIR, "pg_dump"), srv.dsn_plain], capture_output=True,
                          text=True, timeout=120)
    assert dump.returncode == 0 and "api_keys" in dump.stdout
    assert key not in dump.stdout and secret not in dump.stdout
    log = srv.log_text()
    assert key not in log and secret not in log
    assert srv.admin_key() not in log


def test_memory_limit_exact_under_200_writers(srv):
    tid, key = srv.create_tenant(tier="free")  # 20 memories
    with srv.client(key=key) as c:
        c.call("memory.store_batch", memories=[{"content": f"f{i}", "type": "fact", "importance": 0.1}
                                              for i in range(15)])
        err = c.call_err("memory.store_batch", memories=[{"content": "x", "type": "fact",
                                                          "importance": 0.1}] * 6)
        assert err["code"] == "quota_exceeded"
        assert (err["limit"], err["usage"], err["requested"]) == (20, 15, 6)
        assert c.call("memory.stats")["total"] == 15  # the batch was refused whole

    def one(i):
        with srv.client(key=key) as w:
            try:
                w.call("memory.store", content=f"race {i}", type="fact", importance=0.1)
                return "ok"
            except RpcError as e:
                return e.code

    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as ex:
        results = list(ex.map(one, range(200)))
    assert results.count("ok") == 5, results
    assert set(results) <= {"ok", "quota_exceeded"}
    assert psql(srv.dsn_plain, f"SELECT count(*) FROM memories WHERE tenant_id = {tid}") == "20"


def test_downgrade_keeps_data_and_blocks_writes(srv):
    tid, key = srv.create_tenant(tier="premium")
    with srv.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[{"content": f"p{i}", "type": "fact",
                                                      "importance": 0.1} for i in range(25)])["ids"]
        admin_call(srv, "admin.tenant.update", tenant_id=tid, tier="free")
        assert c.call("tenant.usage")["tier"] == "free"
        assert c.call("memory.stats")["total"] == 25  # kept
        err = c.call_err("memory.store", content="more", type="fact", importance=0.1)
        assert err["code"] == "quota_exceeded" and err["limit"] == 20 and err["usage"] == 25
        c.call("memory.delete", ids=ids[:6])  # 19 left: below the limit
        c.call("memory.store", content="fits now", type="fact", importance=0.1)
        assert c.call_err("memory.store", content="no more", type="fact", importance=0.1)["code"] == "quota_exceeded"


def test_daily_query_limit_exact_and_reset_time(srv):
    tid, key = srv.create_tenant(tier="free")  # 30 queries a day
    with srv.client(key=key) as c:
        c.call("memory.store", content="query me", type="fact", importance=0.5)
        # invalid calls cost nothing
        for _ in range(5):
            c.call_err("memory.search", query="x", top_k=0)

        def one(i):
            with srv.client(key=key) as w:
                try:
                    if i % 3 == 0:
                        w.call("memory.context", query="query me")
                    else:
                        w.call("memory.search", query="query me")
                    return "ok"
                except RpcError as e:
                    return e

        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as ex:
            results = list(ex.map(one, range(80)))
        assert sum(1 for r in results if r == "ok") == 30
        errs = [r for r in results if r != "ok"]
        assert all(e.code == "quota_exceeded" for e in errs)
        tomorrow = datetime.datetime.now(datetime.timezone.utc).date() + datetime.timedelta(days=1)
        midnight = datetime.datetime.combine(tomorrow, datetime.time(), datetime.timezone.utc)
        e = errs[0].error
        assert e["limit"] == 30 and e["usage"] == 30 and e["resets_at"] == int(midnight.timestamp() * 1000)
        # other methods are not queries
        assert c.call("memory.stats")["total"] == 1
        u = c.call("tenant.usage")
        assert u["queries"] == {"today": 30, "limit": 30, "resets_at": e["resets_at"]}
        # the day's count lives in the database: a new day starts afresh
        psql(srv.dsn_plain, f"UPDATE tenant_usage SET day = day - 1 WHERE tenant_id = {tid}")
        assert c.call("memory.search", query="query me")["results"]


def test_unlimited_tiers_are_counted_for_usage(srv):
    _, key = srv.create_tenant(tier="premium")
    with srv.client(key=key) as c:
        c.call("memory.store", content="abc", type="fact", importance=0.5)
        for _ in range(7):
            c.call("memory.search", query="abc")
        assert wait_for(lambda: c.call("tenant.usage")["queries"]["today"] >= 7, timeout=10, interval=0.2), \
            "query counts never written"
        u = c.call("tenant.usage")
        assert u["queries"]["today"] == 7 and u["queries"]["limit"] is None
        assert counts(u["memories"]) == {"stored": 1, "archived": 0, "limit": 50000}
        assert u["storage_bytes"] > 0 and u["rate"]["per_second"] > 0


def test_request_rate_limit(srv):
    _, key = srv.create_tenant(tier="standard")  # 5 per second, burst 5
    with srv.client(key=key) as c:
        ids = [c.send("memory.stats", {}) for _ in range(30)]
        outcomes = [c.wait(i) for i in ids]
        limited = [e for e, _ in outcomes if e is not None]
        assert 20 <= len(limited) <= 25
        assert all(e["code"] == "rate_limited" and e["retry_after_ms"] > 0 for e in limited)
        # wall clock: the bucket refills after retry_after_ms
        time.sleep(max(e["retry_after_ms"] for e in limited[:1]) / 1000 + 0.05)
        assert c.call("memory.stats")["total"] == 0


# On Citus a session-level SET engram.tenant_id stays on the coordinator: only SET LOCAL in a
# transaction block is passed to the workers (citus.propagate_set_commands = local, which is
# what engramd uses there), so the last check sees no row. The policies themselves hold.
@pytest.mark.xfail(CITUS, strict=True, reason="a session SET is not passed to Citus workers")
def test_database_role_is_bound_by_policies(srv):
    q = "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = 'engram_app'"
    assert psql(srv.dsn_plain, q) == "f|f"
    owned = psql(srv.dsn_plain, "SELECT count(*) FROM pg_tables WHERE tableowner = 'engram_app'")
    assert owned == "0"
    missing = psql(srv.dsn_plain, """
        SELECT string_agg(c.relname, ',') FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
        WHERE c.relkind = 'r' AND a.attname = 'tenant_id' AND c.relnamespace = 'public'::regnamespace
          AND NOT (c.relrowsecurity AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid))""")
    assert missing == "", f"tables without row-level security: {missing}"
    # as the server's role with no tenant set, nothing is visible
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        c.call("memory.store", content="rls", type="fact", importance=0.5)
    out = psql(srv.dsn_plain, "SET ROLE engram_app; SELECT count(*) FROM memories")
    assert out.splitlines()[-1] == "0"
    out = psql(srv.dsn_plain, f"SET ROLE engram_app; SET engram.tenant_id = '{tid}'; SELECT count(*) FROM memories")
    assert out.splitlines()[-1] == "1"


def test_create_tenant_command_uses_the_admin_functions(srv, tmp_path):
    """`engramd create-tenant` creates the tenant with its first key through the function
    admin.tenant.create calls, and gives an existing tenant a further key through the one
    admin.key.create calls; an existing key file is left alone."""
    from harness import BIN
    name = "cli-made-" + os.urandom(4).hex()

    def run(path):
        r = subprocess.run([BIN, "create-tenant", name, "standard", str(path), "--pg-dsn", srv.dsn,
                            "--data-dir", srv.data_dir, "--admin-key-file", srv.admin_key_file],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout + r.stderr

    first, second = tmp_path / "first.key", tmp_path / "second.key"
    run(first)
    run(second)
    out = run(first)  # exists: nothing is created
    assert "exists" in out
    keys = [first.read_text().strip(), second.read_text().strip()]
    assert keys[0] != keys[1] and all(k.startswith("egk_") for k in keys)
    got = admin_call(srv, "admin.tenant.get", name=name)
    assert got["tier"] == "standard" and got["embedding"]["provider"] == "builtin"
    listed = admin_call(srv, "admin.key.list", tenant=name)["keys"]
    assert [k["name"] for k in listed] == ["bootstrap", "bootstrap"]
    for key in keys:
        with srv.client(key=key) as c:
            assert c.call("memory.store", content="hello", type="fact", importance=0.5)["id"] >= 1
    assert int(psql(srv.dsn_plain, f"SELECT count(*) FROM tenants WHERE name = '{name}'")) == 1
