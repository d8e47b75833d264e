"""memory.provenance finds what an answer cited (issue 32, item 7): the report was 0 of 10
injected memories matched, and an answer holding a memory word for word scoring 0.75 against
the 0.8 cosine threshold. Now the response's word overlap with each memory's text counts
beside the cosine (server/domain/provenance.h).

Against the real engramd and PostgreSQL: ten memories injected, an answer that quotes them
inside longer sentences finds all ten (by overlap: the cosine of those sentences stays under
0.8 for most); an answer about other things finds none; an answer that states another value
for a memory's number does not cite it; the memory's text comes from PostgreSQL or the row
cache alike, its current version after an update; a memory stored with a vector of its own
(another embedder's) is found by its words all the same; the threshold is a setting."""
import pytest

from harness import new_database, structured_vectors, vec_bin

MEMORIES = [
    "Morpho USDC vault on Base has 2.3% base APY",
    "Agent 7 wallet holds 10 ETH on Arbitrum",
    "The ETH gas price spikes every weekday at noon UTC.",
    "Never bridge more than 10k USDC in one transaction.",
    "Uniswap v3 fee tiers are 0.05%, 0.30% and 1%.",
    "The user prefers dark mode in every editor.",
    "The staging database runs PostgreSQL 15 on port 5433.",
    "The user is allergic to penicillin.",
    "Acme's contract renews on March 1 with a 30-day notice period.",
    "The user's passport expires on 2026-08-14.",
]

# what a model answers with those memories in its prompt: each quoted inside a longer
# sentence, some with small edits (inflection, a reformatted number or date)
QUOTING = (
    "Here is the plan. Since the Morpho USDC vault on Base has 2.3% base APY, I would rather "
    "park the stablecoins there than on mainnet, and agent 7's wallet holds 10 ETH on "
    "Arbitrum, which covers the gas. The ETH gas price spikes every weekday at noon UTC, so I "
    "scheduled the swap for the evening; I also split the transfer because you never bridge "
    "more than 10,000 USDC in one transaction. For the LP position, remember that Uniswap v3 "
    "fee tiers are 0.05%, 0.30% and 1%, and the stable pair belongs in the lowest.\n"
    "Other notes: the dashboard is in dark mode, since you prefer dark mode in every editor. "
    "The migration will target the staging database, which runs PostgreSQL 15 on port 5433. "
    "I flagged the prescription because the user is allergic to penicillin. Acme's contract "
    "renews on 1 March with a 30-day notice period, so send the letter this week. Finally, "
    "your passport expires on August 14, 2026, which is fine for the trip.")

OTHER = (
    "The weather in Lisbon will be sunny all week, with highs around 24 degrees. The museum "
    "opens at ten and the tram stops right outside. For dinner, the seafood place near the "
    "river takes reservations until eight. Bring comfortable shoes: the old town is hilly.")


def provenance(c, response, ids):
    r = c.call("memory.provenance", response=response, injected=ids)
    return r, {m["id"]: m for m in r["memories"]}


def test_ten_injected_memories_quoted_are_all_found(client):
    ids = [client.call("memory.store", content=m, type="fact", importance=0.5)["id"]
           for m in MEMORIES]
    r, got = provenance(client, QUOTING, ids)
    assert r["unknown"] == [] and set(got) == set(ids)
    assert [i for i in ids if not got[i]["cited"]] == []
    for i, text in zip(ids, MEMORIES):
        m = got[i]
        assert m["match"] in ("overlap", "both"), (text, m)
        assert m["overlap"] >= 0.5 and m["conflict"] is False
        assert 0 <= m["sentence"] < r["sentences"]
        assert m["matched_text"] in QUOTING
    # the finding: the cosine alone (the built-in embedder, threshold 0.8) misses
    # most of them, a sentence being longer than the memory it quotes
    assert sum(got[i]["similarity"] > 0.8 for i in ids) <= 3
    # where the quote is: the sentence that holds the memory's words
    assert "dark mode" in got[ids[5]]["matched_text"]
    assert "penicillin" in got[ids[7]]["matched_text"]
    counts = {m["id"]: (m["cited_count"], m["injected_count"])
              for m in client.call("memory.get", ids=ids)["memories"]}
    assert counts == {i: (1, 1) for i in ids}

    # an answer about other things cites none of them, and records them as injected
    r, got = provenance(client, OTHER, ids)
    assert [i for i in ids if got[i]["cited"]] == []
    assert all(m["match"] is None and m["overlap"] < 0.5 for m in got.values())
    counts = {m["id"]: (m["cited_count"], m["injected_count"])
              for m in client.call("memory.get", ids=ids)["memories"]}
    assert counts == {i: (1, 2) for i in ids}


def test_another_value_is_not_a_citation(client):
    ids = [client.call("memory.store", content=m, type="fact", importance=0.5)["id"]
           for m in MEMORIES[:2]]
    r, got = provenance(client, "Right now the Morpho USDC vault on Base has 2.5% base APY, and "
                                "agent 7 wallet holds 12 ETH on Arbitrum.", ids)
    for i in ids:
        assert got[i]["cited"] is False and got[i]["conflict"] is True
        assert got[i]["match"] is None and got[i]["overlap"] > 0.5
    # the same value, written otherwise, is
    r, got = provenance(client, "The Morpho USDC vault on Base has 2.30 percent base APY.", ids)
    assert got[ids[0]]["cited"] is True and got[ids[0]]["conflict"] is False
    assert got[ids[1]]["cited"] is False and got[ids[1]]["conflict"] is False


def test_text_from_the_database_the_cache_and_after_an_update(server, tenant):
    with server.client(key=tenant[1]) as c:
        mid = c.call("memory.store", content="The user's sister lives in Porto.", type="fact",
                     importance=0.5)["id"]
        answer = "For the weekend: the user's sister lives in Porto, so lunch could be there."
        first = provenance(c, answer, [mid])[1][mid]
        second = provenance(c, answer, [mid])[1][mid]  # the row is cached by now
        assert first["cited"] and second["cited"]
        for k in ("match", "overlap", "similarity", "sentence", "matched_text", "conflict"):
            assert first[k] == second[k], k
        # an update changes what an answer must contain
        c.call("memory.update", id=mid, content="The user's sister moved to Lisbon in May.")
        m = provenance(c, answer, [mid])[1][mid]
        assert m["cited"] is False and m["overlap"] < 0.5
        m = provenance(c, "Your sister moved to Lisbon in May, so lunch is there.", [mid])[1][mid]
        assert m["cited"] is True and m["match"] in ("overlap", "both")
    # after a restart (an empty cache): from PostgreSQL
    server.restart()
    with server.client(key=tenant[1]) as c:
        m = provenance(c, "Your sister moved to Lisbon in May, so lunch is there.", [mid])[1][mid]
        assert m["cited"] is True and m["match"] in ("overlap", "both")


def test_found_by_words_whatever_the_vector(client):
    # a memory stored with a vector of another embedder: no sentence of ours is near it
    v = structured_vectors(1, 384, seed=91)[0]
    mid = client.call("memory.store", content="The Q3 board meeting is in Lisbon.", type="fact",
                      importance=0.5, embedding=vec_bin(v))["id"]
    m = provenance(client, "Noted. The Q3 board meeting is in Lisbon, so I booked the hotel.",
                   [mid])[1][mid]
    assert m["cited"] is True and m["match"] == "overlap" and m["similarity"] < 0.5
    assert "Lisbon" in m["matched_text"]


def test_overlap_threshold_is_a_setting(engramd):
    srv = engramd(new_database("pv"), extra=["--provenance-overlap-threshold", "1"])
    _, key = srv.create_tenant()
    with srv.client(key=key) as c:
        mid = c.call("memory.store", content="The user runs 5 km every morning before work.",
                     type="fact", importance=0.5)["id"]
        # verbatim: all of its wording, found at 1
        m = provenance(c, "You told me: the user runs 5 km every morning before work.", [mid])[1][mid]
        assert m["cited"] is True and m["overlap"] == 1.0
        # reworded: most of it, not all (found at the default 0.5)
        m = provenance(c, "You run 5 km every day before going to work.", [mid])[1][mid]
        assert (m["cited"], m["match"], m["similarity"] < 0.8) == (False, None, True), m
        assert 0.5 <= m["overlap"] < 1.0
