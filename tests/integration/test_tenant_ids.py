"""A tenant's ids are numbered by that tenant alone (migration 0012).

The ids one tenant receives must tell it nothing about what other tenants write: consecutive
stores of one tenant get consecutive ids whatever the others do, of memories and of every
session object. Two tenants hold the same ids, and everything keyed by an id (access counts,
row cache, index) keeps them apart. A database that numbered ids from server-wide sequences
keeps every existing id, and no id handed out before is handed out again.
"""
import glob
import os
import subprocess

from harness import PG_BINDIR, Server, new_database, psql, structured_vectors, vec_bin, wait_for

VECS = structured_vectors(16, 384, seed=1201)
MIGRATIONS = os.path.join(os.path.dirname(__file__), "..", "..", "storage", "migrations")


def mem(i, tag):
    return {"content": f"{tag} {i}", "type": "fact", "importance": 0.5,
            "embedding": vec_bin(VECS[i % len(VECS)])}


def test_each_tenant_numbers_its_own_ids(server):
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    with server.client(key=ka) as a, server.client(key=kb) as b:
        a1 = a.call("memory.store", **mem(0, "a"))["id"]
        assert a1 == 1
        b_ids = b.call("memory.store_batch", memories=[mem(i, "b") for i in range(7)])["ids"]
        assert b_ids == list(range(1, 8))
        assert a.call("memory.store", **mem(1, "a"))["id"] == a1 + 1
        assert a.call("memory.store_batch", memories=[mem(i, "a") for i in range(3)])["ids"] == \
            [a1 + 2, a1 + 3, a1 + 4]

        def session_ids(c):
            sid = c.call("session.create", agent_id=1, config={"model": "m"})["session_id"]
            entry = c.call("session.append", session_id=sid, role="user", content="x")["entry_id"]
            note = c.call("session.note.add", session_id=sid, category="decision", key="k",
                          value="v", scope="session")["note_id"]
            cp = c.call("session.checkpoint", session_id=sid, label="l")["checkpoint_id"]
            return sid, entry, note, cp

        first = session_ids(a)
        for _ in range(3):
            session_ids(b)
        second = session_ids(a)
        # A's numbering moved by exactly A's own writes: one session, note and checkpoint,
        # and as many entries as the first round made (its append is its last entry)
        assert (first[0], first[2], first[3]) == (1, 1, 1)
        assert second == (2, 2 * first[1], 2, 2)


def test_equal_ids_in_two_tenants_stay_apart(server):
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    with server.client(key=ka) as a, server.client(key=kb) as b:
        ids_a = a.call("memory.store_batch", memories=[mem(i, "A") for i in range(3)])["ids"]
        ids_b = b.call("memory.store_batch", memories=[mem(i, "B") for i in range(3)])["ids"]
        assert ids_a == ids_b
        for _ in range(3):
            res = a.call("memory.search", embedding=vec_bin(VECS[0]), top_k=1,
                         similarity_weight=1.0)["results"]
            assert res[0]["id"] == ids_a[0] and res[0]["content"] == "A 0"
        # A's accesses are counted on A's memory only, never on B's memory of the same id
        assert wait_for(lambda: a.call("memory.get", ids=[ids_a[0]])["memories"][0]
                        ["access_count"] == 3)
        got = b.call("memory.get", ids=ids_b)["memories"]
        assert [m["content"] for m in got] == ["B 0", "B 1", "B 2"]
        assert [m["access_count"] for m in got] == [0, 0, 0]
        # an update in B leaves A's memory of the same id alone
        b.call("memory.update", id=ids_b[1], content="B 1 changed")
        assert a.call("memory.get", ids=[ids_a[1]])["memories"][0]["content"] == "A 1"
        assert b.call("memory.get", ids=[ids_b[1]])["memories"][0]["content"] == "B 1 changed"


def schema_at(dsn, version):
    """Applies migrations 1..version the way engramd does (one transaction each)."""
    psql(dsn, "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
              " applied_at timestamptz NOT NULL DEFAULT now())")
    for path in sorted(glob.glob(os.path.join(MIGRATIONS, "*.sql")))[:version]:
        name = os.path.basename(path)[5:-4]
        out = subprocess.run([os.path.join(PG_BINDIR, "psql"), dsn, "-v", "ON_ERROR_STOP=1",
                              "-1", "-q", "-f", path], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        psql(dsn, f"INSERT INTO schema_migrations (version, name) VALUES "
                  f"({int(os.path.basename(path)[:4])}, '{name}')")


def test_migration_keeps_ids_and_never_reuses_one():
    dsn = new_database("ids")
    schema_at(dsn, 11)
    # a tenant of the old numbering: two memories among ids other tenants used, a
    # deleted one above them, and sessions numbered up to 300
    emb = ["\\x" + vec_bin(VECS[i]).hex() for i in range(2)]
    psql(dsn, f"""
        INSERT INTO tenants (id, name, tier, embed_dim, change_seq, memory_count)
            VALUES (7, 'old', 'premium', 384, 3, 2);
        SELECT setval('tenants_id_seq', 7);
        INSERT INTO memories (tenant_id, id, type, content, importance, embedding, created_at,
                              updated_at, seq)
            VALUES (7, 480, 'fact', 'old one', 0.5, '{emb[0]}', now(), now(), 1),
                   (7, 495, 'fact', 'old two', 0.5, '{emb[1]}', now(), now(), 2);
        INSERT INTO memory_changes VALUES (7, 1, 480, 'u'), (7, 2, 495, 'u'), (7, 3, 499, 'd');
        SELECT setval('memory_id_seq', 500);
        SELECT setval('session_id_seq', 300);
        SELECT setval('session_note_id_seq', 40);
        SELECT setval('consolidation_runs_id_seq', 70);
    """)
    srv = Server(dsn).start()
    try:
        assert psql(dsn, "SELECT max(version) FROM schema_migrations") == "12"
        assert psql(dsn, "SELECT count(*) FROM pg_class WHERE relkind = 'S' "
                         "AND relname NOT IN ('tenants_id_seq', 'api_keys_id_seq')"
                         ) == "0"
        with srv.admin() as adm:
            key = adm.call("admin.key.create", tenant_id=7, name="after")["api_key"]
        with srv.client(key=key) as c:
            got = c.call("memory.get", ids=[480, 495])["memories"]
            assert [(m["id"], m["content"]) for m in got] == [(480, "old one"), (495, "old two")]
            res = c.call("memory.search", embedding=vec_bin(VECS[1]), top_k=1,
                         similarity_weight=1.0)["results"]
            assert res[0]["id"] == 495
            # the next ids follow the old sequence's last value: 499 (deleted) never returns
            assert c.call("memory.store", **mem(2, "new"))["id"] == 501
            sid = c.call("session.create", agent_id=1, config={"model": "m"})["session_id"]
            assert sid == 301
            note = c.call("session.note.add", session_id=sid, category="decision", key="k",
                          value="v", scope="session")["note_id"]
            assert note == 41
            assert c.call("memory.consolidate")["run_id"] == 71
        # a tenant created after the migration starts at 1
        _, k2 = srv.create_tenant()
        with srv.client(key=k2) as c:
            assert c.call("memory.store", **mem(3, "fresh"))["id"] == 1
            assert c.call("session.create", agent_id=1, config={"model": "m"})["session_id"] == 1
            assert c.call("memory.consolidate")["run_id"] == 1
        srv.stop()
    finally:
        srv.cleanup()
