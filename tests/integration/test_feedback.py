"""Provenance feedback (seed 003, "Memory citation mechanics"): memory.feedback counts,
their durability and visibility, the usefulness term of the composite (only when its weight
is set), memory.provenance's sentence-embedding fallback, and memory.context's
search_results format and stable order.

Two engramd processes share one database: `plain` runs with the defaults (usefulness weight
0, the seed's formula), `useful` with score_w_usefulness 0.5. Feedback recorded through
one process reaches the other's index through the change log."""
import numpy as np
import pytest

from harness import Server, new_database, psql, structured_vectors, vec_bin, wait_for
from memmodel import DAY_MS, now_ms

W_U = 0.5


@pytest.fixture(scope="module")
def pair():
    dsn = new_database("fb")
    plain = Server(dsn).start()
    useful = Server(dsn, extra=["--score-w-usefulness", str(W_U),
                                "--secret-file", plain.data_dir + "/secret.key",
                                "--admin-key-file", plain.admin_key_file])
    useful.admin_key_file = plain.admin_key_file
    try:
        useful.start()
    except Exception:
        plain.stop()
        plain.cleanup()
        raise
    plain.dsn_plain = dsn
    yield plain, useful
    try:
        useful.stop()
        plain.stop()
    finally:
        useful.cleanup()
        plain.cleanup()


def counts(c, ids):
    got = {m["id"]: m for m in c.call("memory.get", ids=list(ids))["memories"]}
    return {i: (got[i]["cited_count"], got[i]["injected_count"]) for i in ids}


def test_feedback_counts_persist_and_are_visible(pair):
    plain, _ = pair
    tid, key = plain.create_tenant()
    _, other_key = plain.create_tenant()
    with plain.client(key=other_key) as o:
        # the other tenant has more memories, so its highest id names nothing of ours
        other_ids = [o.call("memory.store", content=f"other {i}", type="fact", importance=0.5)["id"]
                     for i in range(6)]
    with plain.client(key=key) as c:
        a, b, d = (c.call("memory.store", content=f"memory {x}", type="fact", importance=0.5)["id"]
                   for x in "abd")
        before = {m["id"]: m for m in c.call("memory.get", ids=[a, b, d])["memories"]}
        assert all(m["cited_count"] == 0 and m["injected_count"] == 0 for m in before.values())
        r = c.call("memory.feedback", cited=[a], injected=[a, b, 999999, other_ids[-1]])
        assert r["unknown"] == [999999, other_ids[-1]]
        assert r["memories"] == [
            {"id": a, "cited": True, "cited_count": 1, "injected_count": 1},
            {"id": b, "cited": False, "cited_count": 0, "injected_count": 1}]
        assert counts(c, [a, b, d]) == {a: (1, 1), b: (0, 1), d: (0, 0)}
        # a cited id counts as injected even when the injected list leaves it out; an id
        # named twice (or in both lists) counts once; results in the order first named, cited first
        r = c.call("memory.feedback", cited=[d, d], injected=[b, b])
        assert [(m["id"], m["cited"]) for m in r["memories"]] == [(d, True), (b, False)]
        assert r["unknown"] == []
        assert counts(c, [a, b, d]) == {a: (1, 1), b: (0, 2), d: (1, 1)}
        # cited alone, injected alone
        c.call("memory.feedback", cited=[a])
        c.call("memory.feedback", injected=[a])
        assert counts(c, [a])[a] == (2, 3)
        # feedback is not a content change: updated_at and version stay
        after = {m["id"]: m for m in c.call("memory.get", ids=[a, b, d])["memories"]}
        for i in (a, b, d):
            assert after[i]["updated_at"] == before[i]["updated_at"]
            assert after[i]["version"] == before[i]["version"]
        # memory.list and memory.search report the counts too
        listed = {m["id"]: m for m in c.call("memory.list", limit=10)["memories"]}
        assert (listed[a]["cited_count"], listed[a]["injected_count"]) == (2, 3)
        found = {m["id"]: m for m in c.call("memory.search", query="memory a", top_k=10)["results"]}
        assert (found[a]["cited_count"], found[a]["injected_count"]) == (2, 3)
        # only unknown ids: nothing recorded, all reported
        r = c.call("memory.feedback", cited=[424242])
        assert r == {"memories": [], "unknown": [424242]}
    # the other tenant's memory was not touched
    with plain.client(key=other_key) as o:
        assert counts(o, [other_ids[-1]])[other_ids[-1]] == (0, 0)
    # in PostgreSQL, committed, and after a restart
    row = psql(plain.dsn_plain, f"SELECT cited_count, injected_count FROM memories "
                                f"WHERE tenant_id = {tid} AND id = {a}")
    assert row.split("|") == ["2", "3"]
    plain.restart()
    with plain.client(key=key) as c:
        assert counts(c, [a, b, d]) == {a: (2, 3), b: (0, 2), d: (1, 1)}


def test_feedback_validation(pair):
    plain, _ = pair
    _, key = plain.create_tenant()
    with plain.client(key=key) as c:
        for kw in ({}, {"cited": [], "injected": []}, {"cited": None}):
            err = c.call_err("memory.feedback", **kw)
            assert err["code"] == "invalid_argument", kw
        err = c.call_err("memory.feedback", injected=list(range(1, 1002)))
        assert err["code"] == "invalid_argument" and "injected" in err["message"]
        err = c.call_err("memory.feedback", cited=list(range(1, 1002)))
        assert err["code"] == "invalid_argument" and "cited" in err["message"]
        assert c.call_err("memory.feedback", cited=["1"])["code"] == "invalid_argument"
        assert c.call_err("memory.feedback", cited=[-1])["code"] == "invalid_argument"
        assert c.call_err("memory.feedback", cited=5)["code"] == "invalid_argument"
        assert c.call_err("memory.feedback", cited=[1], bogus=1)["code"] == "invalid_argument"
        # 1000 ids is the limit, not over it
        assert len(c.call("memory.feedback", injected=list(range(1, 1001)))["unknown"]) == 1000
    with plain.admin() as adm:
        assert adm.call_err("memory.feedback", cited=[1])["code"] in ("permission_denied",
                                                                       "invalid_argument")


def test_usefulness_changes_a_ranking_only_when_its_weight_is_set(pair):
    plain, useful = pair
    _, key = plain.create_tenant()
    v = structured_vectors(2, 384, seed=71)
    t0 = now_ms() - DAY_MS
    same = dict(type="fact", created_at=t0, embedding=vec_bin(v[0]))
    with plain.client(key=key) as c:
        # two memories as similar to the query, as old and as read; the one that will go
        # uncited is a little more important (0.52 against 0.5: 0.008 more composite), so
        # it ranks first under the seed's formula, in search and in list
        uncited = c.call("memory.store", content="uncited twin", importance=0.52, **same)["id"]
        cited = c.call("memory.store", content="cited twin", importance=0.5, **same)["id"]
        c.call("memory.store", content="far away", type="fact", importance=0.1, created_at=t0,
               embedding=vec_bin(v[1]))

        def search(cl):
            res = cl.call("memory.search", embedding=vec_bin(v[0]), top_k=2)["results"]
            return [r["id"] for r in res], {r["id"]: r["composite"] for r in res}

        def listed(cl):
            return [m["id"] for m in cl.call("memory.list", order_by="composite", limit=2)["memories"]]

        order, comp = search(c)
        assert order == [uncited, cited]
        assert comp[uncited] - comp[cited] == pytest.approx(0.008, abs=1e-6)
        c.call("memory.feedback", cited=[cited], injected=[uncited, cited])
        # weight 0: the same ranking and the same composites as the seed's formula gives
        order, comp = search(c)
        assert order == [uncited, cited]
        assert comp[uncited] - comp[cited] == pytest.approx(0.008, abs=1e-6)
        assert listed(c) == [uncited, cited]
    with useful.client(key=key) as u:
        # weight 0.5: the cited memory beats its injected-but-uncited twin, by
        # 0.5 * (2/3 - 1/3) - 0.5 * 0.008 in composite; the feedback was
        # recorded through the other process and reaches this index through the change log
        assert wait_for(lambda: search(u)[0] == [cited, uncited], timeout=10), search(u)
        order, comp = search(u)
        assert comp[cited] - comp[uncited] == pytest.approx(W_U / 3 - (1 - W_U) * 0.008, abs=1e-6)
        assert listed(u) == [cited, uncited]
    # the index of a restarted process (snapshot or database) keeps the counts
    useful.restart()
    with useful.client(key=key) as u:
        assert search(u)[0] == [cited, uncited]


def test_prune_uses_usefulness_only_with_its_weight(pair):
    plain, useful = pair
    tid, key = plain.create_tenant(embedding={"dim": 16})
    q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((16, 16)))
    t0 = now_ms()
    old = dict(type="episode", importance=0.1, created_at=t0 - 100 * DAY_MS)
    with plain.client(key=key) as c:
        helpful = c.call("memory.store", content="old but cited", embedding=vec_bin(q[:, 0]), **old)["id"]
        wasteful = c.call("memory.store", content="old and ignored", embedding=vec_bin(q[:, 1]), **old)["id"]
        for _ in range(5):
            c.call("memory.feedback", cited=[helpful], injected=[wasteful])
    # the seed's composite of both is 0.3 * exp(-100 / 30) + 0.4 * 0.1 ~ 0.051, under the
    # prune threshold 0.15; with weight 0.5 the cited one scores 0.5 * 0.051 + 0.5 * 6/7
    # ~ 0.45 and stays, the ignored one 0.5 * 0.051 + 0.5 * 1/7 ~ 0.097 and goes
    with useful.client(key=key) as u:
        r = u.call("memory.consolidate")
        assert r["status"] == "completed" and r["archived"] == 1
        got = {m["id"]: m for m in u.call("memory.get", ids=[helpful, wasteful])["memories"]}
        assert got[helpful]["archived_at"] is None
        assert got[wasteful]["archived_reason"] == "pruned"
        # the composite reads compute (nothing stores it) has the usefulness term too
        res = u.call("memory.search", embedding=vec_bin(q[:, 0]), top_k=1)["results"]
        assert res[0]["id"] == helpful
        assert res[0]["composite"] == pytest.approx(
            0.5 * (0.3 * np.exp(-100 / 30) + 0.04) + 0.5 * 6 / 7, abs=1e-3)
    # the same data under the seed's formula: both are pruned
    _, key2 = plain.create_tenant(embedding={"dim": 16})
    with plain.client(key=key2) as c:
        h2 = c.call("memory.store", content="old but cited", embedding=vec_bin(q[:, 0]), **old)["id"]
        w2 = c.call("memory.store", content="old and ignored", embedding=vec_bin(q[:, 1]), **old)["id"]
        for _ in range(5):
            c.call("memory.feedback", cited=[h2], injected=[w2])
        r = c.call("memory.consolidate")
        assert r["archived"] == 2


FACTS = ["The ETH gas price spikes every weekday at noon UTC.",
         "Uniswap v3 fee tiers are 0.05%, 0.30% and 1%.",
         "Never bridge more than 10k USDC in one transaction."]


def test_provenance_marks_the_matching_memory_and_records_it(pair):
    plain, _ = pair
    _, key = plain.create_tenant()
    with plain.client(key=key) as c:
        ids = [c.call("memory.store", content=f, type="fact", importance=0.5)["id"] for f in FACTS]
        response = ("Here is what I found.\n"
                    "The ETH gas price spikes every weekday at noon UTC. "
                    "So I would wait for the evening!  Shall I schedule it?")
        r = c.call("memory.provenance", response=response, injected=ids + [31337])
        assert r["sentences"] == 4
        assert r["unknown"] == [31337]
        got = {m["id"]: m for m in r["memories"]}
        assert set(got) == set(ids)
        hit = got[ids[0]]
        assert hit["cited"] is True and hit["similarity"] > 0.8
        assert hit["sentence"] == 1 and hit["matched_text"] == FACTS[0]
        for i in ids[1:]:
            assert got[i]["cited"] is False and got[i]["similarity"] <= 0.8
            assert got[i]["sentence"] is not None
        # recorded as feedback: cited = matched, every known injected memory injected
        assert counts(c, ids) == {ids[0]: (1, 1), ids[1]: (0, 1), ids[2]: (0, 1)}
        assert (hit["cited_count"], hit["injected_count"]) == (1, 1)
        # another response citing the second fact, with a CJK full stop ending a sentence
        r = c.call("memory.provenance", injected=[ids[1], ids[1]],
                   response="你好。Uniswap v3 fee tiers are 0.05%, 0.30% and 1%.")
        assert r["sentences"] == 2
        assert [(m["id"], m["cited"], m["sentence"]) for m in r["memories"]] == [(ids[1], True, 1)]
        assert counts(c, ids)[ids[1]] == (1, 2)
        # nothing known: nothing recorded
        r = c.call("memory.provenance", response="Anything.", injected=[99999])
        assert r == {"memories": [], "unknown": [99999], "sentences": 1}


def test_provenance_validation(pair):
    plain, _ = pair
    _, key = plain.create_tenant()
    with plain.client(key=key) as c:
        mid = c.call("memory.store", content="x marks the spot", type="fact", importance=0.5)["id"]
        for kw in ({"response": "hi"}, {"injected": [mid]}, {"response": "", "injected": [mid]},
                   {"response": "hi", "injected": []}, {"response": 5, "injected": [mid]},
                   {"response": "hi", "injected": [mid], "extra": 1},
                   {"response": "hi", "injected": list(range(1, 102))},
                   {"response": "x" * 65537, "injected": [mid]}):
            err = c.call_err("memory.provenance", **kw)
            assert err["code"] == "invalid_argument", kw
        err = c.call_err("memory.provenance", response=" \n\t \n ", injected=[mid])
        assert err["code"] == "invalid_argument" and "no sentence" in err["message"]
        err = c.call_err("memory.provenance", response="Yes. " * 257, injected=[mid])
        assert err["code"] == "invalid_argument" and "257 sentences" in err["message"]
        # at the limits: 256 sentences, 65536 bytes, 100 ids
        assert c.call("memory.provenance", response="Yes. " * 256, injected=[mid])["sentences"] == 256
        assert c.call("memory.provenance", response="y" * 65536, injected=[mid])["sentences"] == 1
        assert c.call("memory.provenance", response="Fine.",
                      injected=list(range(1, 101)))["sentences"] == 1
        assert counts(c, [mid])[mid] == (0, 3)


def test_context_search_results_format(pair):
    plain, _ = pair
    tid, key = plain.create_tenant()
    vecs = structured_vectors(4, 384, seed=73)
    types = ["fact", "strategy_outcome", "constraint"]
    with plain.client(key=key) as c:
        ids = [c.call("memory.store", content=f"entry {i} <b>&\"q\"", type=types[i], importance=0.5,
                      embedding=vec_bin(vecs[i]))["id"] for i in range(3)]
        args = dict(embedding=vec_bin(vecs[3]), top_k=10, similarity_weight=1.0, budget_tokens=100000)
        xml = c.call("memory.context", **args)
        sr = c.call("memory.context", format="search_results", **args)
        assert set(sr) == {"items", "ids", "tokens_used"}
        assert sr["ids"] == xml["ids"] and sorted(sr["ids"]) == sorted(ids)
        by_id = {i: t for i, t in zip(ids, types)}
        used = 0
        for item, i in zip(sr["items"], sr["ids"]):
            assert set(item) == {"source", "title", "content"}
            assert item["source"] == f"engram://{tid}/{by_id[i]}/{i}"
            assert item["title"] == f"[{by_id[i].upper()}] memory {i}"
            assert item["content"] == f"entry {ids.index(i)} <b>&\"q\""  # not XML-escaped
            used += (len(item["source"]) + len(item["title"]) + len(item["content"].encode())) // 4
        assert sr["tokens_used"] == used
        # a budget that holds the first two items only
        first_two = sum((len(x["source"]) + len(x["title"]) + len(x["content"])) // 4 for x in sr["items"][:2])
        part = c.call("memory.context", format="search_results", **dict(args, budget_tokens=first_two))
        assert part["ids"] == sr["ids"][:2] and part["tokens_used"] == first_two
        assert c.call("memory.context", format="xml", **args)["ids"] == xml["ids"]
        none = c.call("memory.context", format="search_results", tokens=["nothing-has-this"], **args)
        assert none == {"items": [], "ids": [], "tokens_used": 0}
        for bad in ({"format": "html"}, {"format": 1}, {"order": "random"}, {"order": ""}):
            err = c.call_err("memory.context", **dict(args, **bad))
            assert err["code"] == "invalid_argument", bad


def test_context_stable_order(pair):
    plain, _ = pair
    _, key = plain.create_tenant()
    vecs = structured_vectors(5, 384, seed=79)
    with plain.client(key=key) as c:
        ids = [c.call("memory.store", content=f"stable {i}", type="fact", importance=0.5,
                      embedding=vec_bin(vecs[i]))["id"] for i in range(4)]
        # the first one changes last
        c.call("memory.update", id=ids[0], importance=0.6)
        args = dict(embedding=vec_bin(vecs[4]), top_k=3, similarity_weight=1.0, budget_tokens=100000)
        ranked = c.call("memory.context", **args)["ids"]
        assert c.call("memory.context", order="rank", **args)["ids"] == ranked
        mems = {m["id"]: m for m in c.call("memory.get", ids=ids)["memories"]}
        want = sorted(ranked, key=lambda i: (mems[i]["updated_at"], i))
        stable = c.call("memory.context", order="stable", **args)
        # the same memories (chosen by rank), oldest change first
        assert stable["ids"] == want and sorted(want) == sorted(ranked)
        assert [stable["text"].find(f"stable {ids.index(i)}") for i in want] == \
            sorted(stable["text"].find(f"stable {ids.index(i)}") for i in want)
        sr = c.call("memory.context", order="stable", format="search_results", **args)
        assert sr["ids"] == want
        assert [x["source"].rsplit("/", 1)[1] for x in sr["items"]] == [str(i) for i in want]
        if ids[0] in want:
            assert want[-1] == ids[0]
        # an update moves a memory to the end; the prefix before it stays
        c.call("memory.update", id=want[0], importance=0.7)
        again = c.call("memory.context", order="stable", **args)["ids"]
        assert again == want[1:] + want[:1]
