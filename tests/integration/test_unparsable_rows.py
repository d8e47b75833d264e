"""Rows that do not parse are counted and logged, never read as zeros (issue 13).

Normal use of every reader leaves engram_rows_unparsable_total at 0 for every table; a
memory row made unreadable behind the server's back (a type the server does not know, with
the CHECK constraint dropped as a hand-edited schema might) is left out of answers, counted
under table="memories" and logged once with its table and column but not its content."""
import re

from harness import Server, new_database, psql, structured_vectors, vec_bin

DIM = 384
TABLES = ("memories", "memory_changes", "api_keys", "tenants", "other")


def unparsable(srv):
    status, text = srv.http_get("/metrics")
    assert status == 200
    got = {}
    for line in text.splitlines():
        m = re.match(r'engram_rows_unparsable_total\{table="([a-z_]+)"\} (\d+)$', line)
        if m:
            got[m.group(1)] = int(m.group(2))
    assert set(got) == set(TABLES), text
    return got


def test_unparsable_rows_are_counted_and_logged():
    dsn = new_database("unparsable")
    srv = Server(dsn).start()
    try:
        tid, key = srv.create_tenant(tier="premium")
        vecs = structured_vectors(4, DIM, seed=13)
        with srv.client(key=key) as c:
            ids = c.call("memory.store_batch", memories=[
                {"content": f"SECRET-CONTENT-{i}", "type": "fact", "importance": 0.5,
                 "embedding": vec_bin(v), "metadata": {"tokens": ["ETH"]}}
                for i, v in enumerate(vecs)])["ids"]
            # every reader of normal rows: nothing is reported
            assert len(c.call("memory.get", ids=ids)["memories"]) == 4
            assert len(c.call("memory.list")["memories"]) == 4
            res = c.call("memory.search", embedding=vec_bin(vecs[1]), top_k=2)["results"]
            assert res[0]["id"] == ids[1]
            c.call("memory.search", query="SECRET", top_k=2, mode="text")
            c.call("memory.update", id=ids[0], importance=0.9)
            c.call("memory.history", id=ids[0])
            c.call("memory.stats")
            c.call("memory.context", embedding=vec_bin(vecs[2]), top_k=2)
            c.call("memory.consolidation.runs")
            c.call("memory.archive", ids=[ids[3]])
            c.call("tenant.usage")
        with srv.admin() as a:
            a.call("admin.tenant.list")
        assert unparsable(srv) == {t: 0 for t in TABLES}

        # the schema edited by hand: a memory type this server does not know
        psql(dsn, "ALTER TABLE memories DROP CONSTRAINT memories_type_check; "
                  f"UPDATE memories SET type = 'anecdote' WHERE tenant_id = {tid} "
                  f"AND id = {ids[2]}")
        with srv.client(key=key) as c:
            got = c.call("memory.get", ids=[ids[0], ids[2]])["memories"]
            assert got[0]["id"] == ids[0]
            assert got[1] is None  # left out, never read as a fact with zeros
            listed = c.call("memory.list")["memories"]
            assert None in listed and ids[2] not in [m["id"] for m in listed if m]
        counts = unparsable(srv)
        assert counts["memories"] == 2, counts
        assert all(counts[t] == 0 for t in TABLES if t != "memories"), counts
        log = srv.log_text()
        lines = [l for l in log.splitlines() if "unparsable row from PostgreSQL" in l]
        # one line for the table and column, however often it was met
        assert len(lines) == 1, lines
        assert "table memories, column type: not a memory type" in lines[0]
        assert " warn " in lines[0]
        assert "SECRET-CONTENT" not in log and "anecdote" not in lines[0]
    finally:
        srv.stop()
        srv.cleanup()
