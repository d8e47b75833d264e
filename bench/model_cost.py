#!/usr/bin/env python3
"""bench/model_cost.py: the tokens one consolidation call costs, measured end to end.

Starts engramd (the build's, ENGRAM_BIN) against PostgreSQL (ENGRAM_TEST_PG_DSN, a throwaway
database) and the scripted model server (tests/llm/mock_llm.py) on the Anthropic API, stores
candidate groups of 2, 4 and 8 agent-like memories (about 60 to 90 bytes each), has the mock
answer each group with one decision per neighbouring pair and a reason of about a dozen
words, runs memory.consolidate and reads the run record's tokens. The mock counts tokens as
len/4 of the prompt it received (system prompt and user message) and of its answer; the
request's tool definition (the schema) is not in that count, so it is added here the same
way (bytes/4), with the 313 tokens Anthropic documents for the tool-use system prompt of a
forced tool. Prints one line per group size and the cost table of bench/README.md.

Usage: ENGRAM_BIN=build-test/server/engramd ENGRAM_TEST_PG_DSN=... bench/model_cost.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "llm"))

import numpy as np  # noqa: E402

from harness import Server, new_database, vec_bin  # noqa: E402
from mockctl import MockLLM  # noqa: E402

DIM = 16
GROUPS = 10
TOOL_OVERHEAD = 313  # Anthropic: tool-use system prompt, tool_choice "tool" (Claude 4.x)
NAMES = ["Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Ginkgo", "Hazel", "Ivy", "Juniper",
         "Kapok", "Larch", "Maple", "Nutmeg", "Oak", "Pine", "Quince", "Rowan", "Spruce", "Teak"]
FACTS = ["wallet holds 12 ETH on Arbitrum after the last rebalance",
         "prefers concise answers with the numbers first and no preamble",
         "vault pays 3.5% base APY in USDC, rewards excluded, as of this week",
         "strategy returned 14% over the backtest window before fees and slippage",
         "pool has a fee tier of 0.05% and about $40,000 of liquidity",
         "agent must never bridge more than 2 ETH in one transaction",
         "team reviews the risk dashboard every Monday at 9am",
         "desk moved its treasury from Optimism to Base in March"]


def text(g, i):
    """Distinct names, so no two texts are the same but for values (the text rules leave
    them all to the model)."""
    return f"{NAMES[g % len(NAMES)]} {NAMES[(g + i + 1) % len(NAMES)]} {FACTS[(g + i) % len(FACTS)]}"


def run(size, dsn, mock):
    s = Server(dsn, extra=["--llm-provider", "anthropic", "--llm-url", mock.url("anthropic"),
                           "--llm-model", "mock-haiku", "--llm-api-key", "sk-mock-key",
                           "--premium-consolidation-hours", "0"]).start()
    try:
        _, key = s.create_tenant(tier="premium", embedding={"dim": DIM})
        rng = np.random.default_rng(size)
        rules = []
        with s.client(key=key) as c:
            for g in range(GROUPS):
                base = rng.standard_normal(DIM)
                base /= np.linalg.norm(base)
                ids = []
                for i in range(size):
                    v = base + 0.05 * rng.standard_normal(DIM)
                    ids.append(c.call("memory.store", content=text(g, i), type="fact",
                                      importance=0.5, embedding=vec_bin(v / np.linalg.norm(v)))["id"])
                decisions = [{"a": ids[i], "b": ids[i + 1], "relation": "distinct", "keep": None,
                              "text": None,
                              "reason": "different subjects and amounts, so both facts are kept"}
                             for i in range(size - 1)]
                rules.append({"match": text(g, 0), "reply": {"json": {"decisions": decisions}}})
            mock.reset()
            mock.script(rules)
            r = c.call("memory.consolidate")
            m = c.call("memory.consolidation.runs", limit=1)["runs"][0]["settings"]["model"]
        assert m["judged"] == m["calls"] > 0, m
        body = mock.calls()[0]["body"]
        schema_tokens = len(json.dumps(body["tools"])) // 4
        return (m["tokens_in"] / m["calls"] + schema_tokens + TOOL_OVERHEAD,
                m["tokens_out"] / m["calls"], r["model"]["calls"])
    finally:
        s.finish()


def main():
    dsn = new_database("mcost")
    mock = MockLLM()
    try:
        per = {}
        for size in (2, 4, 8):
            tin, tout, calls = run(size, dsn, mock)
            per[size] = (tin, tout)
            print(f"group of {size}: {tin:.0f} input tokens, {tout:.0f} output tokens per call "
                  f"({calls} calls)")
    finally:
        mock.stop()
    # the seed's tiers (memories per agent's store), Haiku 4.5's list prices ($1 / $5 per Mtok),
    # groups of 2 (the common case: one new memory near one old one)
    price_in, price_out = 1.0, 5.0
    tin, tout = per[2]
    call = (tin * price_in + tout * price_out) / 1e6
    print(f"\none call (group of 2): {tin + tout:.0f} tokens, USD {call:.5f}")
    print("\n| tier (memories) | first run: groups (2% / 10% of memories paired) | USD | "
          "a later day: new memories near an old one | USD per day |")
    print("|---|---|---|---|---|")
    for tier, n, new in (("free", 100, 1), ("standard", 5000, 5), ("premium", 50000, 20)):
        g2, g10 = min(200, int(n * 0.02 / 2)) or 1, min(200, int(n * 0.10 / 2))
        print(f"| {tier} ({n:,}) | {g2} / {g10} | {g2 * call:.4f} / {g10 * call:.4f} | {new} | "
              f"{new * call:.4f} |")

if __name__ == "__main__":
    main()
