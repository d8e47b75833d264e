"""Access counts reach PostgreSQL even when a writer holds a memory's row at flush time:
the batch skips the locked row instead of waiting on it (waiting could deadlock with a
delete and fail the client's write) and writes its count in a later batch."""
import os
import subprocess
import time

from harness import PG_BINDIR, Server, new_database, psql, structured_vectors, vec_bin


def test_counts_of_a_locked_row_arrive_later():
    dsn = new_database("access")
    srv = Server(dsn).start()
    holder = None
    try:
        tid, key = srv.create_tenant()
        vecs = structured_vectors(5, 384, seed=71)
        with srv.client(key=key) as c:
            ids = [c.call("memory.store", content=f"a{i}", type="fact", importance=0.5,
                          embedding=vec_bin(v))["id"] for i, v in enumerate(vecs)]
            # another session holds memory 0's row (as a long write would)
            holder = subprocess.Popen([os.path.join(PG_BINDIR, "psql"), dsn, "-qAt"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            holder.stdin.write(f"BEGIN; SELECT id FROM memories WHERE id = {ids[0]} FOR UPDATE;\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == str(ids[0])
            for _ in range(3):
                res = c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=2,
                             similarity_weight=1.0)["results"]
                assert res[0]["id"] == ids[0]
            other = res[1]["id"]

            def counts():
                out = psql(dsn, f"SELECT id, access_count FROM memories WHERE id IN ({ids[0]}, {other})")
                return {int(a): int(b) for a, b in (line.split("|") for line in out.splitlines())}

            # the unlocked memory's counts land; the locked one's wait (and the flush does
            # not block: it lands within the batch interval)
            deadline = time.time() + 10
            while counts()[other] < 3:
                assert time.time() < deadline, "access counts never reached the database"
                time.sleep(0.1)
            assert counts()[ids[0]] == 0
            holder.stdin.write("COMMIT;\n")
            holder.stdin.close()
            holder.wait(timeout=10)
            holder = None
            deadline = time.time() + 10
            while counts()[ids[0]] < 3:
                assert time.time() < deadline, "the skipped counts were lost"
                time.sleep(0.1)
            assert counts() == {ids[0]: 3, other: 3}
            # index and database agree
            got = c.call("memory.get", ids=[ids[0]])["memories"][0]
            assert got["access_count"] == 3
        srv.stop()
    finally:
        if holder:
            holder.kill()
        srv.cleanup()
