"""Auto-dream (issue 32, item 6; seed 001): a background pass per tenant over the sessions
since its last pass, behind three gates (time, new sessions, a lock with a stale time), in
four phases (orient, gather, consolidate through extraction's pipeline, prune through a
consolidation run). The real engramd and PostgreSQL against the scripted model server;
the state lives in PostgreSQL: two engramd processes on one database dream once, and a lock
whose holder died is taken over once stale.
"""
import threading
import time

from harness import Server, metric, new_database, server_pair, wait_for

from llm_mock import llm_args, mock_fixture

DIM = 256
KEY = "sk-test-5b2d40687f3a9c1e3c1ea1b3c5d7e9f1"


mock = mock_fixture(KEY)


def model_args(mock, extra=(), api="openai", timeout_ms=1500):
    return llm_args(mock, api, KEY, timeout_ms, 0) + [
            "--extract-min-messages", "0", "--premium-consolidation-hours", "0",
            "--standard-consolidation-hours", "0", "--free-consolidation-hours", "0"] + list(extra)


def server(dsn, mock, extra=(), api="openai", timeout_ms=1500):
    return Server(dsn, extra=model_args(mock, extra, api, timeout_ms))


def second(a, dsn, mock, extra=()):
    """Another engramd on a's database, sharing its secret and admin key (not started)."""
    b = server(dsn, mock, list(extra) + ["--secret-file", a.data_dir + "/secret.key",
                                         "--admin-key-file", a.admin_key_file])
    b.admin_key_file = a.admin_key_file
    return b


def session_with_fact(c, n, agent=3):
    """A session whose transcript states one fact; returns (session id, fact text, rule)."""
    sid = c.call("session.create", agent_id=agent, config={"model": "m"})["session_id"]
    text = f"The staging cluster number {n} runs PostgreSQL {10 + n}"
    e = c.call("session.append", session_id=sid, role="user",
               content=f"Remember: staging cluster number {n} runs PostgreSQL {10 + n}.")["entry_id"]
    c.call("session.append", session_id=sid, role="assistant", content="Noted.")
    rule = {"name": f"facts-{sid}", "match": f"messages of session {sid}.",
            "reply": {"json": {"facts": [{"category": "project", "text": text,
                                          "confidence": 0.9, "entry_ids": [e]}]}}}
    return sid, text, rule


# facts of one session near another's: added (the decision leaves them out)
DECIDE = {"name": "decide", "match": "Decide for each of these",
          "reply": {"json": {"decisions": []}}}


def state(c):
    return c.call("tenant.dream")["state"]


def test_pass_on_demand_four_phases(mock):
    dsn = new_database("dream")
    s = server(dsn, mock, ["--dream-hours", "0"]).start()
    try:
        tid, key = s.create_tenant(tier="premium", embedding={"dim": DIM})
        with s.client(key=key) as c:
            d = c.call("tenant.dream")
            assert d["enabled"] is False and d["pass"] is None  # dream_hours 0: not scheduled
            assert d["state"]["runs"] == 0 and d["state"]["new_sessions"] == 0
            made = [session_with_fact(c, n) for n in range(2)]
            assert state(c)["new_sessions"] == 2
            mock.reset()
            mock.script([m[2] for m in made] + [DECIDE])
            r = c.call("tenant.dream", run=True)
            p = r["pass"]
            assert p["status"] == "completed" and p["outcome"] == "ok" and p["error"] is None, p
            assert (p["sessions"], p["extracted"], p["failed"], p["facts"], p["added"]) == \
                (2, 2, 0, 2, 2)
            assert p["tokens"] > 0 and not p["takeover"]
            st = r["state"]
            assert st["runs"] == 1 and st["last_status"] == "ok" and st["new_sessions"] == 0
            assert st["last_session_id"] == made[-1][0] and st["lock_holder"] is None
            rec = st["last_result"]
            # the four phases in the record
            assert rec["orient"]["memories"] == {} and rec["orient"]["model"] == "mock-haiku"
            assert rec["gather"]["sessions"] == [m[0] for m in made]
            assert rec["consolidate"]["added"] == 2 and rec["consolidate"]["errors"] == []
            assert rec["prune"]["status"] == "completed"
            run = c.call("memory.consolidation.runs", limit=1)["runs"][0]
            assert run["run_id"] == rec["prune"]["run_id"] and run["trigger"] == "dream"
            # the memories, with provenance
            mems = {m["content"]: m for m in c.call("memory.list", limit=100)["memories"]}
            for sid, text, _ in made:
                pv = mems[text]["metadata"]["provenance"]
                assert pv["session_id"] == sid and pv["trigger"] == "dream"
                assert c.call("session.get", session_id=sid)["extraction"]["last_trigger"] == "dream"
            # nothing new: a pass reads nothing and asks nothing
            mock.reset()
            r = c.call("tenant.dream", run=True)
            assert r["pass"]["sessions"] == 0 and mock.calls() == []
            assert r["state"]["runs"] == 2
    finally:
        s.finish()


def test_no_model_changes_nothing(mock):
    dsn = new_database("dream")
    s = server(dsn, mock, ["--dream-hours", "0"]).start()
    try:
        tid, key = s.create_tenant(tier="premium", embedding={"dim": DIM})
        with s.admin() as a:
            a.call("admin.tenant.update", tenant_id=tid, chat_model="none")
        with s.client(key=key) as c:
            session_with_fact(c, 1)
            mock.reset()
            r = c.call("tenant.dream", run=True)
            assert r["pass"]["outcome"] == "no_model" and mock.calls() == []
            assert "chat_model is none" in r["pass"]["error"]
            st = r["state"]
            assert st["runs"] == 0 and st["last_status"] == "no_model"
            assert st["last_session_id"] == 0 and st["new_sessions"] == 1
            assert c.call("memory.list", limit=10)["memories"] == []
    finally:
        s.finish()


def test_gates_and_two_processes_dream_once(mock):
    """Both processes look every second; the sessions gate holds the pass until the third
    session, then exactly one process dreams (the model sees each session once), and the
    time gate keeps both from dreaming again."""
    dsn = new_database("dream")
    extra = ["--dream-hours", "24", "--dream-min-sessions", "3", "--dream-check-interval-s", "1"]
    a, b = server_pair(dsn, model_args(mock, extra))
    try:
        tid, key = a.create_tenant(tier="premium", embedding={"dim": DIM})
        with a.client(key=key) as c:
            made = [session_with_fact(c, n) for n in range(2)]
            mock.reset()
            # slow answers: a pass takes seconds, so both processes see the tenant due
            rules = [dict(m[2], delay_ms=800) for m in made]
            mock.script(rules + [DECIDE])
            time.sleep(2.5)
            assert state(c)["runs"] == 0 and mock.calls() == []  # 2 of 3 sessions
            third = session_with_fact(c, 2)
            made.append(third)
            mock.script(rules + [dict(third[2], delay_ms=800), DECIDE])
            st = wait_for(lambda: state(c)["runs"] == 1 and state(c), timeout=30,
                          what="one dream pass")
            assert st["last_status"] == "ok" and st["new_sessions"] == 0
            time.sleep(3)
            assert state(c)["runs"] == 1
            facts = [x for x in mock.calls() if (x["rule"] or "").startswith("facts-")]
            assert sorted(x["rule"] for x in facts) == sorted(m[2]["name"] for m in made)
            assert len(c.call("memory.list", limit=100)["memories"]) == 3
        with b.client(key=key) as c:
            assert state(c)["runs"] == 1  # the same state, seen from the other process
        # one pass in all, by one of the two processes
        assert sum(metric(x, "engram_dream_passes_total", 'outcome="ok"') for x in (a, b)) == 1
    finally:
        b.finish()
        a.finish()


def test_stale_lock_taken_over(mock):
    dsn = new_database("dream")
    extra = ["--dream-hours", "24", "--dream-min-sessions", "1", "--dream-lock-stale-s", "4",
             "--dream-check-interval-s", "1", "--extract-stale-s", "4"]
    # the first process asks on demand only (its scheduler would take the lock back)
    a = server(dsn, mock, ["--dream-hours", "0", "--dream-lock-stale-s", "4"], timeout_ms=60000)
    b = second(a, dsn, mock, extra)
    a.start()
    try:
        tid, key = a.create_tenant(tier="premium", embedding={"dim": DIM})
        with a.client(key=key) as c:
            sid, text, rule = session_with_fact(c, 1)
        mock.reset()
        mock.script([dict(rule, delay_ms=30000)])
        errors = []

        def dream():
            try:
                with a.client(key=key, timeout=60) as c2:
                    c2.call("tenant.dream", run=True)
            except Exception as e:  # the server dies under it
                errors.append(e)

        t = threading.Thread(target=dream)
        t.start()
        wait_for(lambda: len(mock.calls()) >= 1, what="the model being asked")
        locked_at = time.monotonic()
        a.kill()
        t.join(timeout=60)
        assert errors
        b.start()
        with b.client(key=key) as c:
            st = state(c)
            assert st["lock_holder"] and st["runs"] == 0  # the dead pass's lock
            assert c.call("memory.list", limit=10)["memories"] == []
            mock.reset()
            mock.script([rule])
            r = c.call("tenant.dream", run=True)
            if time.monotonic() - locked_at < 3.5:  # the dead pass's lock is not stale yet
                assert r["pass"]["status"] == "locked" and mock.calls() == []
            st = wait_for(lambda: state(c)["runs"] == 1 and state(c), timeout=30,
                          what="the pass after the takeover")
            assert st["takeovers"] == 1 and st["last_result"]["takeover"] is True
            assert st["lock_holder"] is None
            mems = c.call("memory.list", limit=10)["memories"]
            assert [m["content"] for m in mems] == [text]
    finally:
        b.finish()
        a.finish()
