"""A change the index cannot take is not lost (issue 13, 3a).

engramd built for tests (any build but release) honours ENGRAM_FAULT_INDEX_UPSERT=N: the next
N index upserts fail as out of memory. A failed change must stay unapplied, so that it is read
again from the change log (the live index converges) and no snapshot claims it (an index
loaded from a snapshot written meanwhile still gets it)."""
import re

from harness import Server, new_database, structured_vectors, vec_bin, wait_for

DIM = 384


def apply_failures(srv):
    status, text = srv.http_get("/metrics")
    assert status == 200
    m = re.search(r"^engram_index_apply_failures_total (\d+)$", text, re.M)
    assert m, "engram_index_apply_failures_total missing from /metrics"
    return int(m.group(1))


def found(c, vecs, ids):
    """The ids whose own vector finds them first (the index has them)."""
    got = set()
    for v, i in zip(vecs, ids):
        res = c.call("memory.search", embedding=vec_bin(v), top_k=1, similarity_weight=1.0)
        if res["results"] and res["results"][0]["id"] == i:
            got.add(i)
    return got


def store(c, vecs, first):
    return [c.call("memory.store", content=f"m{first + k}", type="fact", importance=0.5,
                   embedding=vec_bin(v))["id"] for k, v in enumerate(vecs)]


def test_failed_applies_are_retried_and_never_snapshotted():
    dsn = new_database("applyfail")
    srv = Server(dsn, env={"ENGRAM_FAULT_INDEX_UPSERT": "3"})
    try:
        srv.start()
        assert "fault injection: the next 3 index upserts fail" in srv.log_text()
        _, key = srv.create_tenant()
        vecs = structured_vectors(20, DIM, seed=29)
        with srv.client(key=key) as c:
            # load the (empty) index first, so that the stores below are applied to it
            assert c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=1)["results"] == []
            ids = store(c, vecs[:10], 0)
            # the first three applies failed...
            assert apply_failures(srv) == 3
            # ... and were read again from the change log: every memory is searchable
            assert wait_for(lambda: found(c, vecs[:10], ids) == set(ids), timeout=30), \
                sorted(set(ids) - found(c, vecs[:10], ids))
        srv.stop()

        # every apply fails now: the index lacks the new memories, and its watermark stays
        # below them; a delete applied after them makes the index changed, so shutdown writes
        # a snapshot, and that snapshot must not claim the failed changes
        srv.env["ENGRAM_FAULT_INDEX_UPSERT"] = "1000000"
        srv.start()
        with srv.client(key=key) as c:
            assert found(c, vecs[:10], ids) == set(ids)  # loaded from the snapshot
            more = store(c, vecs[10:15], 10)
            assert apply_failures(srv) >= 5
            assert found(c, vecs[10:15], more) == set()
            c.call("memory.delete", ids=[ids[0]])
            assert wait_for(lambda: ids[0] not in found(c, vecs[:1], ids[:1]))
        srv.stop()

        # without faults, the index loads from that snapshot plus the change log after its
        # watermark: the failed stores are replayed, the delete stays
        del srv.env["ENGRAM_FAULT_INDEX_UPSERT"]
        mark = len(srv.log_text())
        srv.start()
        with srv.client(key=key) as c:
            assert found(c, vecs[:15], ids + more) == set(ids[1:] + more)
        assert "loaded from its snapshot" in srv.log_text()[mark:]
        assert apply_failures(srv) == 0
    finally:
        srv.stop()
        srv.cleanup()
