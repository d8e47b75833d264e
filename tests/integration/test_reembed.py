"""Online re-embedding of a tenant (admin.tenant.update {embedding}, issue 33 item 4): a real
engramd and PostgreSQL, the mock OpenAI embeddings endpoint of test_embedder_openai (faults
included). The tenant serves searches and stores on its old model until the swap, then on
the new one everywhere; provider faults pause and resume the job; a kill -9 midway resumes
from the side table; stores, updates and deletes meanwhile all end with new-model vectors;
a second engramd drops and rebuilds its index on the swap's notification."""
import numpy as np
import pytest

from harness import Server, metric, new_database, psql, wait_for, wait_log
from test_embedder_openai import (DIM, KEY_ENV, Endpoint, endpoint_server, fake_embedding,
                                  provider_args)

WORDS = ("amber basil cedar delta ember fjord garnet harbor indigo juniper kelp lantern meadow "
         "nectar orchid pebble quartz raven saffron thistle umber violet willow xenon yarrow "
         "zephyr").split()


def texts(n, tag):
    """n distinct texts of three words each (and a tag), so bag-of-words neighbours differ."""
    rng = np.random.default_rng(sum(map(ord, tag)))
    return [" ".join(rng.choice(WORDS, 3, replace=False)) + f" {tag}{i}" for i in range(n)]


def reembed_args(interval_ms=50):
    """Small batches, quick looks and short pauses (the provider is not retried: openai_retries
    0 in endpoint_server / provider_args, so each fault is one failed batch)."""
    return ["--reembed-batch", "16", "--reembed-interval-ms", str(interval_ms),
            "--reembed-retry-min-ms", "200", "--reembed-retry-max-ms", "800"]


@pytest.fixture(scope="module")
def setup():
    with endpoint_server("reembed", retries=0, extra=reembed_args()) as found:
        yield found


def tenant_get(srv, tid):
    with srv.admin() as a:
        return a.call("admin.tenant.get", tenant_id=tid)


def wait_swapped(srv, tid, provider, gen, timeout=60):
    def done():
        t = tenant_get(srv, tid)
        return t if t["reembed"] is None and t["embedding"]["generation"] == gen else None
    t = wait_for(done, timeout=timeout, what=f"tenant {tid} swapped to generation {gen}")
    assert t["embedding"]["provider"] == provider
    return t


def new_model_sim(query, content):
    return float(fake_embedding(query) @ fake_embedding(content))


def top(c, query, k=1):
    return c.call("memory.search", query=query, top_k=k, similarity_weight=1.0,
                  include_archived=True)["results"]


def filled_tenant(srv, n, tag):
    """A new tenant of srv (built-in model) holding n memories of texts(n, tag): (tenant id,
    key, contents, ids)."""
    tid, key = srv.create_tenant()
    contents = texts(n, tag)
    with srv.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[
            {"content": t, "type": "fact", "importance": 0.5} for t in contents])["ids"]
    return tid, key, contents, ids


def assert_new_model(c, contents, ids, which):
    """Each memory which[k] is its own query's best match, at the new model's similarity 1."""
    for i in which:
        res = top(c, contents[i])
        assert res[0]["id"] == ids[i]
        assert res[0]["similarity"] == pytest.approx(1.0, abs=1e-4)


def test_builtin_to_openai_and_back(setup):
    srv, ep, dsn = setup
    tid, key, contents, ids = filled_tenant(srv, 60, "a")
    with srv.client(key=key) as c:
        c.call("memory.archive", ids=[ids[7]])
        before = top(c, contents[3])
        assert before[0]["id"] == ids[3]
        ep.take()
        ep.gate.clear()  # the provider holds every request: the job stays midway
        try:
            with srv.admin() as a:
                t = a.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "openai"})
            job = t["reembed"]
            assert job["state"] == "running" and job["provider"] == "openai"
            assert job["model"] == "test-embed-1" and job["dim"] == DIM
            assert job["total"] == 60 and job["done"] == 0 and job["failures"] == 0
            assert t["embedding"]["provider"] == "builtin" and t["embedding"]["generation"] == 0
            with srv.admin() as a:
                err = a.call_err("admin.tenant.update", tenant_id=tid,
                                 embedding={"provider": "builtin", "dim": 128})
            assert err["code"] == "conflict"
            # searches and writes go on with the old (built-in) model meanwhile
            res = top(c, contents[3])
            assert res[0]["id"] == ids[3] and res[0]["similarity"] == pytest.approx(
                before[0]["similarity"], abs=1e-6)
            added = c.call("memory.store", content="quartz lantern stored during the job",
                           type="fact", importance=0.5)["id"]
            c.call("memory.update", id=ids[5], content="violet harbor updated during the job")
            c.call("memory.delete", ids=[ids[9]])
            stats = c.call("memory.stats")
            assert stats["reembed"]["state"] == "running" and stats["reembed"]["total"] == 60
            assert all(r["body"]["input"] != ["quartz lantern stored during the job"]
                       for r in ep.take())  # the store embedded with the built-in model
        finally:
            ep.gate.set()
        t = wait_swapped(srv, tid, "openai", 1)
        assert t["embedding"]["dim"] == DIM and t["embedding"]["model"] == "test-embed-1"
        sent = [x for r in ep.take() for x in r["body"]["input"]]
        assert "quartz lantern stored during the job" in sent
        assert "violet harbor updated during the job" in sent
        # the same connection, authenticated before the swap, now embeds with the new model
        res = top(c, contents[3])
        assert res[0]["id"] == ids[3]
        assert res[0]["similarity"] == pytest.approx(new_model_sim(contents[3], contents[3]),
                                                     abs=1e-4)
        assert ep.take()[0]["body"]["input"] == [contents[3]]
        for q, want in ((contents[7], ids[7]), ("quartz lantern stored during the job", added),
                        ("violet harbor updated during the job", ids[5])):
            res = top(c, q)
            assert res[0]["id"] == want and res[0]["similarity"] == pytest.approx(
                new_model_sim(q, q), abs=1e-4)
        # the right neighbours under the new model, over every memory
        q = contents[11].split()[0] + " " + contents[12].split()[1]
        got = [r["id"] for r in top(c, q, k=5)]
        live = {i: t for i, t in zip(ids, contents) if i != ids[9]}
        live[ids[5]] = "violet harbor updated during the job"
        live[added] = "quartz lantern stored during the job"
        want = sorted(live, key=lambda i: -new_model_sim(q, live[i]))[:5]
        assert got[:3] == want[:3]
        assert ids[9] not in [r["id"] for r in top(c, contents[9], k=60)]
        stats = c.call("memory.stats")
        assert stats["total"] == 60 and stats["reembed"] is None
        ep.take()
        n = c.call("memory.store", content="after the swap", type="fact", importance=0.5)["id"]
        assert ep.take()[0]["body"]["input"] == ["after the swap"]
        assert top(c, "after the swap")[0]["id"] == n
        # and back to the built-in model
        with srv.admin() as a:
            a.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "builtin"})
        wait_swapped(srv, tid, "builtin", 2)
        ep.take()
        res = top(c, contents[3])
        assert res[0]["id"] == ids[3] and res[0]["similarity"] == pytest.approx(
            before[0]["similarity"], abs=1e-5)
        assert ep.take() == []  # the search embedded with the built-in model
    assert psql(dsn, f"SELECT count(*) FROM memory_reembed WHERE tenant_id = {tid}") == "0"
    assert metric(srv, "engram_reembed_swaps_total") >= 2


def test_provider_failures_back_off_and_complete(setup):
    srv, ep, dsn = setup
    tid, key, contents, ids = filled_tenant(srv, 40, "f")
    failures0 = metric(srv, "engram_reembed_failures_total")
    ep.take()
    ep.faults = ["429", "500", "wrongdim", "timeout"]
    with srv.admin() as a:
        a.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "openai"})
    # the 429's Retry-After (1 s) is waited at least, above reembed_retry_max_ms (800 ms)
    first = wait_for(lambda: (lambda j: j if j and j["failures"] >= 1 else None)(
        tenant_get(srv, tid)["reembed"]), interval=0.02, what="the first failure recorded")
    assert first["failures"] == 1 and first["state"] == "backoff"
    assert "429" in first["last_error"] and "Retry-After: 1 s" in first["last_error"]
    assert first["retry_at"] - first["last_error_at"] >= 999
    seen = wait_for(lambda: (lambda j: j if j and j["failures"] == 2 else None)(
        tenant_get(srv, tid)["reembed"]), what="two failures recorded")
    assert "500" in seen["last_error"] and seen["retry_at"] - seen["last_error_at"] <= 800
    wait_swapped(srv, tid, "openai", 1)
    assert metric(srv, "engram_reembed_failures_total") - failures0 == 4
    reqs = ep.take()
    assert len(reqs) >= 4 + 3  # four failed attempts, then the three batches of 16, 16, 8
    with srv.client(key=key) as c:
        assert_new_model(c, contents, ids, (0, 17, 39))


def test_kill_midway_resumes(setup):
    srv, ep, dsn = setup
    tid, key, contents, ids = filled_tenant(srv, 120, "k")
    ep.take()
    ep.gate.clear()
    ep.hold_after = 2  # two batches of 16 go through, the third is held: the kill comes midway
    try:
        with srv.admin() as a:
            a.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "openai"})
        wait_for(lambda: psql(dsn, "SELECT count(*) FROM memory_reembed "
                                   f"WHERE tenant_id = {tid}") == "32", what="32 side vectors")
        wait_for(lambda: ep.hold_after < 0, what="the third batch held")
        srv.kill()  # kill -9 while a batch is with the provider
        kept = int(psql(dsn, f"SELECT count(*) FROM memory_reembed WHERE tenant_id = {tid}"))
        assert 32 <= kept < 120
        batches = ep.take()
    finally:
        ep.hold_after = None
        ep.gate.set()
    srv.start()
    wait_swapped(srv, tid, "openai", 1)
    after = [x for r in ep.take() for x in r["body"]["input"]]
    # resumed from the side table: what was kept is not sent again (the held batch may be)
    assert len(after) <= 120 - kept + 16
    assert {x for r in batches for x in r["body"]["input"]} | set(after) >= set(contents)
    with srv.client(key=key) as c:
        assert c.call("memory.stats")["total"] == 120
        got = c.call("memory.get", ids=ids)["memories"]
        assert [m["content"] for m in got] == contents
        assert_new_model(c, contents, ids, (0, 40, 119))


def test_invalid_requests_and_cancel(setup):
    srv, ep, dsn = setup
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        c.call("memory.store", content="one memory", type="fact", importance=0.5)
    with srv.admin() as a:
        def err(**kw):
            return a.call_err("admin.tenant.update", tenant_id=tid, **kw)
        e = err(embedding={"provider": "builtin"})  # the model it has
        assert e["code"] == "invalid_argument" and "already" in e["message"]
        for bad, word in (({"provider": "cohere"}, "provider"),
                          ({"provider": "openai", "dim": 32}, "dim"),
                          ({"provider": "builtin", "dim": 3}, "dim"),
                          ({"provider": "openai", "model": "other-model"}, "model"),
                          ({"provider": "openai", "colour": "red"}, "colour")):
            e = err(embedding=bad)
            assert e["code"] == "invalid_argument" and word in e["message"], (bad, e)
        e = a.call_err("admin.tenant.update", tenant_id=999999, embedding={"provider": "openai"})
        assert e["code"] == "not_found"
        e = a.call_err("admin.tenant.update", tenant_id=tid, embedding="openai")
        assert e["code"] == "invalid_argument"
        ep.gate.clear()
        try:
            t = a.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "openai"},
                       tier="standard")
            assert t["tier"] == "standard" and t["reembed"]["state"] == "running"
            e = err(embedding={"provider": "builtin", "dim": 64})
            assert e["code"] == "conflict"
            assert a.call("admin.tenant.get", tenant_id=tid)["tier"] == "standard"
            t = a.call("admin.tenant.update", tenant_id=tid, cancel_reembed=True)
            assert t["reembed"] is None and t["embedding"]["provider"] == "builtin"
        finally:
            ep.gate.set()
        assert psql(dsn, f"SELECT count(*) FROM memory_reembed WHERE tenant_id = {tid}") == "0"
        t = a.call("admin.tenant.update", tenant_id=tid, cancel_reembed=True)  # none: fine
        assert t["reembed"] is None
        # a write embedded under the generation the tenant left is refused, whatever the path
        a.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "builtin", "dim": 64})
    wait_swapped(srv, tid, "builtin", 1)
    mid = psql(dsn, f"SELECT min(id) FROM memories WHERE tenant_id = {tid}")
    with pytest.raises(RuntimeError, match="embedding model changed"):
        psql(dsn, f"SELECT * FROM engram_memory_update({tid}, {mid}, 'x', NULL, NULL, NULL, "
                  f"'\\x00'::bytea, NULL, false, NULL, '{{0,0,0}}', 0)")
    # so are an extraction run's facts embedded under it (same dimension: only the
    # generation its claim read tells), and the run changes nothing
    with srv.client(key=key) as c:
        sid = c.call("session.create", agent_id=1, config={"model": "sonnet"})["session_id"]
    psql(dsn, f"INSERT INTO session_extraction (tenant_id, session_id, running_by, "
              f"running_since) VALUES ({tid}, {sid}, 'h', now())")
    vec = "'\\x" + "00" * 64 * 4 + "'::bytea"
    finish = (f"SELECT engram_extract_finish({tid}, {sid}, 'h', 'on_demand', '{{0,0,0}}', 64, 0, "
              f"1, ARRAY['fact'], ARRAY['an extracted fact'], ARRAY[0.5], ARRAY['{{}}'], {vec}, "
              f"NULL, NULL, NULL, NULL, 'm', 0, 0, 0, '{{}}'::jsonb, %d)")
    with pytest.raises(RuntimeError, match="embedding model changed"):
        psql(dsn, finish % 0)
    assert psql(dsn, f"SELECT count(*) FROM memories WHERE tenant_id = {tid} "
                     f"AND content = 'an extracted fact'") == "0"
    assert '"added": 1' in psql(dsn, finish % 1)  # the tenant's generation: stored
    with srv.client(key=key) as c:
        assert c.call("memory.stats")["total"] == 2
        c.call("memory.store", content="stored at dimension 64", type="fact", importance=0.5)
        assert top(c, "stored at dimension 64")[0]["similarity"] == pytest.approx(1.0, abs=1e-4)


def test_second_process_rebuilds_on_the_swap():
    """b runs the job (a looks for jobs every 10 minutes, the first time 10 minutes after its
    start); a, whose index of the tenant is loaded, learns of the swap by NOTIFY engram_admin,
    drops its index and searches the new model."""
    ep = Endpoint()
    dsn = new_database("reembed2")
    a = Server(dsn, extra=provider_args(ep, 0) + reembed_args(600000), env=KEY_ENV)
    b = Server(dsn, extra=provider_args(ep, 0) + reembed_args() + [
        "--secret-file", a.data_dir + "/secret.key", "--admin-key-file", a.admin_key_file],
        env=KEY_ENV)
    b.admin_key_file = a.admin_key_file
    try:
        a.start()
        b.start()
        tid, key, contents, ids = filled_tenant(a, 30, "p")
        with a.client(key=key) as ca:
            old = top(ca, contents[4])  # a loads its index, on the built-in model
            assert old[0]["id"] == ids[4]
            since_a, since_b = len(a.log_text()), len(b.log_text())
            with a.admin() as adm:
                adm.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "openai"})
            wait_swapped(a, tid, "openai", 1)
            wait_log(a, "embedding model now openai", since=since_a)
            assert "re-embedding done" in b.log_text()[since_b:]
            assert "re-embedding done" not in a.log_text()[since_a:]
            ep.take()
            assert_new_model(ca, contents, ids, (4,))
            assert ep.take()[0]["body"]["input"] == [contents[4]]
    finally:
        for s in (a, b):
            s.finish()
        ep.close()
