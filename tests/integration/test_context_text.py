"""memory.context's <agent_memory> block, and the text and hybrid search modes, checked
against values computed independently in the test."""
import pytest

from harness import structured_vectors, vec_bin, wait_for
from memmodel import DAY_MS, Mem, context_block, now_ms, rank

AGES = [("30m", 30 * 60000), ("5h", 5 * 3600000), ("3d", 3 * DAY_MS), ("2w", 15 * DAY_MS),
        ("3mo", 95 * DAY_MS), ("2y", 800 * DAY_MS)]


def test_context_block_format_order_and_budget(server, tenant):
    t0 = now_ms()
    vecs = structured_vectors(len(AGES) + 1, 384, seed=61)
    q = vecs[-1]
    contents = ['Never LP in pools with < $100K TVL & "thin" books',
                "Morpho USDC vault's base APY: 2.3%",
                "DCA into ETH beat lump sum by 12%",
                "Prefer the 0.30% fee tier <stables>",
                "Lost 2.3% on an ETH short during the flash crash",
                "Gas is cheapest on Sundays"]
    types = ["constraint", "fact", "strategy_outcome", "preference", "episode", "fact"]
    with server.client(key=tenant[1]) as c:
        mems = []
        for i, (label, age) in enumerate(AGES):
            f = dict(type=types[i], importance=round(0.5 + i * 0.07, 2), created_at=t0 - age)
            mid = c.call("memory.store", content=contents[i], embedding=vec_bin(vecs[i]), **f)["id"]
            mems.append((Mem(mid, vecs[i], **f), contents[i]))
        full = c.call("memory.context", embedding=vec_bin(q), top_k=10, budget_tokens=100000,
                      similarity_weight=0.6)
        at = now_ms()
        ranked, _ = rank([m for m, _ in mems], q, {}, 0.6, 10, at)
        content_of = {m.id: s for m, s in mems}
        entries = [(m.type, m.importance, m.created_at, content_of[m.id]) for _, _, _, m in ranked]
        text, used, taken = context_block(entries, 100000, at)
        assert full["text"] == text
        assert full["tokens_used"] == used
        assert full["ids"] == [m.id for _, _, _, m in ranked]
        for label, _ in AGES:
            assert f'age="{label}"' in full["text"]
        assert "&lt; $100K TVL &amp; &quot;thin&quot;" in full["text"] and "&apos;s" in full["text"]
        # a tight budget: entries in rank order until the next one would not fit
        for m, _ in mems:
            m.access_count += 1  # the call above counted an access to every one
        budget = used // 2
        part = c.call("memory.context", embedding=vec_bin(q), top_k=10, budget_tokens=budget,
                      similarity_weight=0.6)
        at = now_ms()
        ranked, _ = rank([m for m, _ in mems], q, {}, 0.6, 10, at)
        entries = [(m.type, m.importance, m.created_at, content_of[m.id]) for _, _, _, m in ranked]
        text, used2, taken = context_block(entries, budget, at)
        assert 0 < taken < len(AGES)
        assert part["text"] == text and part["tokens_used"] == used2 <= budget
        assert part["ids"] == [m.id for _, _, _, m in ranked][:taken]
        # filters apply to the context too
        only = c.call("memory.context", embedding=vec_bin(q), type_filter=["constraint"])
        assert only["ids"] == [mems[0][0].id]
        assert only["text"].count("<memory ") == 1
        # nothing matches: an empty block
        none = c.call("memory.context", embedding=vec_bin(q), tokens=["nothing-has-this"])
        assert none == {"text": "<agent_memory>\n</agent_memory>", "ids": [], "tokens_used": 4}


def test_context_defaults_and_validation(server, client):
    client.call("memory.store", content="remember the defaults", type="fact", importance=0.5)
    r = client.call("memory.context", query="defaults")
    assert r["ids"] and r["text"].startswith("<agent_memory>\n") and r["text"].endswith("</agent_memory>")
    err = client.call_err("memory.context", query="x", budget_tokens=0)
    assert err["code"] == "invalid_argument" and "budget_tokens" in err["message"]
    assert client.call_err("memory.context")["code"] == "invalid_argument"


WORDS = ["liquidity", "oracle", "slippage", "bridge", "validator", "governance"]


def test_text_mode_filters_and_ranks(server, tenant):
    with server.client(key=tenant[1]) as c:
        ids = {}
        for i, w in enumerate(WORDS):
            for j in range(4):
                content = f"{w} note {j} " + ("with extra " + w if j == 0 else "")
                ids[(w, j)] = c.call("memory.store", content=content, type="fact" if j % 2 else "episode",
                                     importance=0.5, metadata={"tokens": [f"T{j}"]})["id"]
        res = c.call("memory.search", query="oracle", mode="text", top_k=10)["results"]
        assert {r["id"] for r in res} == {ids[("oracle", j)] for j in range(4)}
        assert res[0]["id"] == ids[("oracle", 0)]  # the word twice ranks first
        assert [r["score"] for r in res] == sorted([r["score"] for r in res], reverse=True)
        assert all(r["similarity"] is not None for r in res)
        res = c.call("memory.search", query="oracle", mode="text", type_filter=["fact"])["results"]
        assert {r["id"] for r in res} == {ids[("oracle", 1)], ids[("oracle", 3)]}
        res = c.call("memory.search", query="oracle OR bridge", mode="text", tokens=["T2"])["results"]
        assert {r["id"] for r in res} == {ids[("oracle", 2)], ids[("bridge", 2)]}
        res = c.call("memory.search", query="oracle", mode="text", top_k=2)["results"]
        assert len(res) == 2
        assert c.call("memory.search", query="nonexistentword", mode="text")["results"] == []
        err = c.call_err("memory.search", embedding=[0.1] * 384, mode="text")
        assert err["code"] == "invalid_argument" and "query" in err["message"]
        assert c.call_err("memory.search", query="x", mode="fuzzy")["code"] == "invalid_argument"


def test_hybrid_is_reciprocal_rank_fusion(server, tenant):
    with server.client(key=tenant[1]) as c:
        for i, w in enumerate(WORDS * 3):
            c.call("memory.store", content=f"{w} item {i} {'slippage' if i % 4 == 0 else ''}",
                   type="fact", importance=0.5)
        q = "slippage"
        # similarity alone so the vector ranking does not move with access counts
        vec = c.call("memory.search", query=q, top_k=50, similarity_weight=1.0)["results"]
        txt = c.call("memory.search", query=q, mode="text", top_k=50)["results"]
        hyb = c.call("memory.search", query=q, mode="hybrid", top_k=8, similarity_weight=1.0)["results"]
        fused = {}
        for lst in (vec, txt):
            for rnk, r in enumerate(lst, start=1):
                fused[r["id"]] = fused.get(r["id"], 0.0) + 1.0 / (60 + rnk)
        want = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
        assert [r["id"] for r in hyb] == [k for k, _ in want]
        assert [r["score"] for r in hyb] == pytest.approx([v for _, v in want], abs=1e-12)


def test_context_counts_only_the_entries_it_includes(server, tenant):
    e = structured_vectors(5, 384, seed=66)
    with server.client(key=tenant[1]) as c:
        ids = [c.call("memory.store", content="word " * 40, type="fact", importance=0.5,
                      embedding=vec_bin(v))["id"] for v in e]
        r = c.call("memory.context", embedding=vec_bin(e[0]), top_k=5, budget_tokens=120,
                   similarity_weight=1.0)
        assert 0 < len(r["ids"]) < 5

        def counts():
            return {m["id"]: m["access_count"] for m in c.call("memory.get", ids=ids)["memories"]}

        # the access log is written about once a second
        assert wait_for(lambda: all(counts()[i] >= 1 for i in r["ids"]))
        got = counts()
        assert {i for i, n in got.items() if n == 1} == set(r["ids"])
        assert all(n == 0 for i, n in got.items() if i not in r["ids"])
