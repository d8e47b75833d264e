"""Sessions: work items (CRUD, validation, status transitions, sub-agents, resume), notes
pointing at work items, the audit log (every state change recorded, paging under concurrent
writes, tenant isolation, append-only) and the handoff package's work items, tasks, audit
tail and takeover filtering, against the real engramd and PostgreSQL."""
import threading

import pytest

from harness import psql

STATUSES = ["open", "in_progress", "blocked", "done", "cancelled"]


def new_session(c, agent_id=1, **config):
    config.setdefault("model", "sonnet")
    return c.call("session.create", agent_id=agent_id, config=config)["session_id"]


def add_item(c, sid, title="task", **kw):
    return c.call("session.work_item.add", session_id=sid, title=title, **kw)


def note(c, sid, key, value="v", category="decision", scope="session", **kw):
    return c.call("session.note.add", session_id=sid, category=category, key=key, value=value,
                  scope=scope, **kw)


def audit(c, sid, **kw):
    """The whole audit log of a session, read page by page."""
    out, cursor = [], None
    while True:
        page = c.call("session.audit", session_id=sid, cursor=cursor, limit=50, **kw)
        out += page["records"]
        cursor = page["next_cursor"]
        if not page["more"]:
            return out


def actions(c, sid):
    return [a["action"] for a in audit(c, sid)]


# ---- work items -------------------------------------------------------------------------------

def test_work_item_crud(client):
    sid = new_session(client, agent_id=9)
    a = add_item(client, sid, "config generation")
    assert a["title"] == "config generation" and a["status"] == "open"
    assert a["owner_agent_id"] == 9 and a["created_by"] == 9 and a["description"] is None
    assert a["version"] == 1 and a["session_id"] == sid
    assert a["created_at"] == a["updated_at"] == a["status_changed_at"]
    b = add_item(client, sid, "test scenarios", description="validate 1-15",
                 status="in_progress", owner_agent_id=2**64 - 1, agent_id=3)
    assert b["work_item_id"] > a["work_item_id"]
    assert b["owner_agent_id"] == 2**64 - 1 and b["created_by"] == 3
    assert b["description"] == "validate 1-15" and b["status"] == "in_progress"

    u = client.call("session.work_item.update", session_id=sid, work_item_id=a["work_item_id"],
                    title="config generation v2", agent_id=4)
    assert u["changed"] and u["version"] == 2 and u["title"] == "config generation v2"
    assert u["updated_by"] == 4 and u["status_changed_at"] == a["status_changed_at"]
    u = client.call("session.work_item.update", session_id=sid, work_item_id=a["work_item_id"],
                    status="blocked", description="waiting on IT", owner_agent_id=5)
    assert u["status"] == "blocked" and u["version"] == 3 and u["owner_agent_id"] == 5
    assert u["status_changed_at"] >= a["status_changed_at"]
    assert u["description"] == "waiting on IT"
    # the same values again: nothing changes, nothing is recorded
    n = len(audit(client, sid))
    same = client.call("session.work_item.update", session_id=sid,
                       work_item_id=a["work_item_id"], status="blocked", owner_agent_id=5)
    assert not same["changed"] and same["version"] == 3
    assert len(audit(client, sid)) == n
    # "" removes the description
    u = client.call("session.work_item.update", session_id=sid, work_item_id=a["work_item_id"],
                    description="")
    assert u["description"] is None and u["version"] == 4
    # optimistic concurrency
    err = client.call_err("session.work_item.update", session_id=sid,
                          work_item_id=a["work_item_id"], status="open", expected_version=3)
    assert err["code"] == "conflict" and err["version"] == 4 and err["expected_version"] == 3
    assert client.call("session.work_item.update", session_id=sid,
                       work_item_id=a["work_item_id"], status="open",
                       expected_version=4)["version"] == 5

    items = client.call("session.work_item.list", session_id=sid)
    assert [w["work_item_id"] for w in items["work_items"]] == [a["work_item_id"],
                                                                 b["work_item_id"]]
    assert items["next_cursor"] is None and items["owner_session_id"] == sid
    assert [w["title"] for w in client.call("session.work_item.list", session_id=sid,
                                            statuses=["in_progress", "done"])["work_items"]] \
        == ["test scenarios"]
    assert [w["title"] for w in client.call("session.work_item.list", session_id=sid,
                                            owner_agent_id=2**64 - 1)["work_items"]] \
        == ["test scenarios"]


def test_work_item_list_pages(client):
    sid = new_session(client)
    ids = [add_item(client, sid, f"t{i}")["work_item_id"] for i in range(7)]
    other = new_session(client)
    add_item(client, other, "elsewhere")
    seen, cursor = [], None
    while True:
        page = client.call("session.work_item.list", session_id=sid, limit=3, cursor=cursor)
        assert len(page["work_items"]) <= 3
        seen += [w["work_item_id"] for w in page["work_items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids


def test_work_item_validation(client):
    sid = new_session(client)
    wid = add_item(client, sid)["work_item_id"]
    cases = [
        ("session.work_item.add", {"session_id": sid, "title": ""}, "title"),
        ("session.work_item.add", {"session_id": sid, "title": "x" * 257}, "title"),
        ("session.work_item.add", {"session_id": sid}, "title"),
        ("session.work_item.add", {"session_id": sid, "title": "t", "description": "x" * 16385},
         "description"),
        ("session.work_item.add", {"session_id": sid, "title": "t", "status": "done"}, "status"),
        ("session.work_item.add", {"session_id": sid, "title": "t", "status": "assigned"},
         "status"),
        ("session.work_item.add", {"session_id": sid, "title": "t", "owner_agent_id": -1},
         "owner_agent_id"),
        ("session.work_item.add", {"session_id": sid, "title": "t", "colour": 1}, "colour"),
        ("session.work_item.update", {"session_id": sid, "work_item_id": wid}, "nothing"),
        ("session.work_item.update", {"session_id": sid, "work_item_id": wid,
                                      "status": "finished"}, "status"),
        ("session.work_item.update", {"session_id": sid, "work_item_id": wid, "title": ""},
         "title"),
        ("session.work_item.update", {"session_id": sid, "title": "t"}, "work_item_id"),
        ("session.work_item.list", {"session_id": sid, "statuses": ["open", "x"]},
         "statuses[1]"),
        ("session.work_item.list", {"session_id": sid, "limit": 0}, "limit"),
        ("session.work_item.list", {"session_id": sid, "cursor": 2**64 - 1}, "cursor"),
        ("session.audit", {"session_id": sid, "limit": 1001}, "limit"),
        ("session.audit", {"session_id": sid, "cursor": -1}, "cursor"),
    ]
    for method, params, needle in cases:
        err = client.call_err(method, **params)
        assert err["code"] == "invalid_argument" and needle in err["message"], (method, err)
    for method, params in [
            ("session.work_item.add", {"session_id": 999999999, "title": "t"}),
            ("session.work_item.update", {"session_id": sid, "work_item_id": 999999999,
                                          "title": "t"}),
            ("session.work_item.update", {"session_id": 999999999, "work_item_id": wid,
                                          "title": "t"}),
            ("session.work_item.list", {"session_id": 999999999}),
            ("session.audit", {"session_id": 999999999})]:
        assert client.call_err(method, **params)["code"] == "not_found", method
    # an item of another session is not this session's
    other = new_session(client)
    err = client.call_err("session.work_item.update", session_id=other, work_item_id=wid,
                          title="t")
    assert err["code"] == "not_found"
    # ended sessions are read-only
    client.call("session.end", session_id=sid)
    assert client.call_err("session.work_item.add", session_id=sid, title="t")["code"] == \
        "conflict"
    assert client.call_err("session.work_item.update", session_id=sid, work_item_id=wid,
                           status="done")["code"] == "conflict"
    assert len(client.call("session.work_item.list", session_id=sid)["work_items"]) == 1


def test_work_item_limit(server):
    _, key = server.create_tenant()
    with server.client(key=key) as c:
        sid = new_session(c)
        for i in range(1000):
            add_item(c, sid, f"t{i}")
        err = c.call_err("session.work_item.add", session_id=sid, title="one more")
        assert err["code"] == "quota_exceeded" and err["limit"] == 1000 and err["usage"] == 1000


ALLOWED = {
    "open": {"in_progress", "blocked", "done", "cancelled"},
    "in_progress": {"open", "blocked", "done", "cancelled"},
    "blocked": {"open", "in_progress", "done", "cancelled"},
    "done": {"open"},
    "cancelled": {"open"},
}


def test_status_transitions(client):
    sid = new_session(client)
    for frm in STATUSES:
        for to in STATUSES:
            if frm == to:
                continue
            w = add_item(client, sid, f"{frm}->{to}")
            wid = w["work_item_id"]
            if frm != "open":
                client.call("session.work_item.update", session_id=sid, work_item_id=wid,
                            status=frm)
            if to in ALLOWED[frm]:
                r = client.call("session.work_item.update", session_id=sid, work_item_id=wid,
                                status=to)
                assert r["status"] == to and r["changed"], (frm, to)
            else:
                err = client.call_err("session.work_item.update", session_id=sid,
                                      work_item_id=wid, status=to)
                assert err["code"] == "conflict", (frm, to, err)
                assert err["status"] == frm and err["requested"] == to
            if frm in ("done", "cancelled"):  # other fields of a finished item still change
                assert client.call("session.work_item.update", session_id=sid,
                                   work_item_id=wid, title="renamed")["title"] == "renamed"


def test_sub_agents_share_their_parents_work_items(client):
    parent = new_session(client, agent_id=1)
    w = add_item(client, parent, "research pools")["work_item_id"]
    child = client.call("session.spawn", parent_id=parent, task="research",
                        return_format="summary", agent_id=42)["session_id"]
    listed = client.call("session.work_item.list", session_id=child)
    assert listed["owner_session_id"] == parent
    assert [x["work_item_id"] for x in listed["work_items"]] == [w]
    u = client.call("session.work_item.update", session_id=child, work_item_id=w,
                    status="in_progress")
    assert u["updated_by"] == 42 and u["session_id"] == parent
    mine = add_item(client, child, "sub-task")
    assert mine["session_id"] == parent and mine["owner_agent_id"] == 42
    assert note(client, child, "found", work_item_id=w)["note_id"]
    # both audit logs tell the change: the owner's with the sub-agent it came through
    rec = [a for a in audit(client, parent) if a["action"] == "work_item_update"][-1]
    assert rec["target_id"] == w and rec["detail"]["via_session_id"] == child
    assert rec["agent_id"] == 42 and rec["detail"]["status_to"] == "in_progress"
    rec = [a for a in audit(client, child) if a["action"] == "work_item_update"][-1]
    assert rec["detail"]["owner_session_id"] == parent
    client.call("session.end", session_id=parent)
    err = client.call_err("session.work_item.update", session_id=child, work_item_id=w,
                          status="done")
    assert err["code"] == "conflict"


def test_notes_point_at_existing_work_items(client):
    sid = new_session(client)
    w = add_item(client, sid)["work_item_id"]
    assert note(client, sid, "ok", work_item_id=w)["note_id"]
    err = client.call_err("session.note.add", session_id=sid, category="decision", key="k",
                          value="v", scope="session", work_item_id=w + 1000)
    assert err["code"] == "not_found" and "work item" in err["message"]
    err = client.call_err("session.note.add", session_id=sid, category="decision", key="k",
                          value="v", scope="session", work_item_id="W-1")
    assert err["code"] == "invalid_argument" and "work_item_id" in err["message"]
    err = client.call_err("session.note.add", session_id=sid, category="decision", key="k",
                          value="v", scope="session", work_item_id=2**64 - 1)
    assert err["code"] == "not_found"
    other = new_session(client)
    err = client.call_err("session.note.add", session_id=other, category="decision", key="k",
                          value="v", scope="session", work_item_id=w)
    assert err["code"] == "not_found"
    # nothing was stored by the refused calls
    assert [n["key"] for n in client.call("session.notes", session_id=sid)["notes"]] == ["ok"]
    note(client, sid, "t", scope="current_task", work_item_id=w)
    assert client.call("session.task.complete", session_id=sid, work_item_id=w)["cleared"] == 1


def test_resume_restores_the_checkpoints_work_items(client):
    sid = new_session(client)
    a = add_item(client, sid, "a")["work_item_id"]
    b = add_item(client, sid, "b")["work_item_id"]
    note(client, sid, "on-a", work_item_id=a)
    client.call("session.work_item.update", session_id=sid, work_item_id=a, status="in_progress")
    cp = client.call("session.checkpoint", session_id=sid, label="cp")["checkpoint_id"]
    client.call("session.work_item.update", session_id=sid, work_item_id=a, status="done")
    add_item(client, sid, "c")
    r = client.call("session.resume", checkpoint_id=cp)
    new = r["session_id"]
    items = client.call("session.work_item.list", session_id=new)["work_items"]
    assert [(w["work_item_id"], w["title"], w["status"]) for w in items] == \
        [(a, "a", "in_progress"), (b, "b", "open")]
    # the copied note still points at its item, which the branch changes on its own
    assert client.call("session.notes", session_id=new)["notes"][0]["work_item_id"] == a
    client.call("session.work_item.update", session_id=new, work_item_id=b, status="cancelled")
    assert [w["status"] for w in client.call("session.work_item.list",
                                             session_id=sid)["work_items"]] == \
        ["done", "open", "open"]
    assert note(client, new, "on-b", work_item_id=b)["note_id"]
    rec = audit(client, new)[0]
    assert rec["action"] == "resume" and rec["target_id"] == cp
    # position 1: the checkpoint's session_paused event
    assert rec["detail"] == {"resumed_from": sid, "branch_type": "resume", "position": 1,
                             "work_items": 2}


# ---- the audit log -------------------------------------------------------------------------------

def test_audit_records_every_state_change(client):
    secret = "SECRET-CONTENT-never-in-the-audit"
    sid = new_session(client, agent_id=7, compaction={"keep_recent": 0})
    e1 = client.call("session.append", session_id=sid, role="user", content=secret,
                     tokens=5, cost_usdc=0.25)["entry_id"]
    e2 = client.call("session.append", session_id=sid, role="assistant", content=secret,
                     agent_id=8)["entry_id"]
    client.call("session.tombstone", entry_id=e2)
    sm = client.call("session.summarize", session_id=sid, summary=secret, through_entry_id=e1,
                     messages_compacted=1)["entry_id"]
    w = add_item(client, sid, "the task", description=secret)["work_item_id"]
    n = note(client, sid, "blocker-key", value=secret, category="blocker",
             scope="current_task", work_item_id=w)["note_id"]
    client.call("session.task.complete", session_id=sid)
    client.call("session.scratchpad.update", session_id=sid, content=secret)
    client.call("session.work_item.update", session_id=sid, work_item_id=w, status="done")
    cp = client.call("session.checkpoint", session_id=sid, label="cp1")["checkpoint_id"]
    child = client.call("session.spawn", parent_id=sid, task=secret, return_format="summary",
                        agent_id=11)["session_id"]
    client.call("session.complete", session_id=child, output=secret)
    client.call("session.handoff", session_id=sid, mode="takeover", agent_id=12)
    client.call("session.end", session_id=sid, summary=secret)
    new = client.call("session.resume", checkpoint_id=cp)["session_id"]

    log = audit(client, sid)
    assert [a["action"] for a in log] == [
        "create", "append", "append", "tombstone", "summarize", "work_item_add", "note_add",
        "task_complete", "scratchpad_update", "work_item_update", "checkpoint", "spawn",
        "child_complete", "handoff", "end"]
    assert [a["seq"] for a in log] == list(range(1, len(log) + 1))
    by = {a["action"]: a for a in reversed(log)}  # the first record of each action
    assert by["append"]["target_type"] == "entry" and by["append"]["target_id"] == e1
    assert by["append"]["detail"] == {"seq": 1, "role": "user", "bytes": len(secret),
                                      "tokens": 5, "cost_usdc": 0.25}
    assert log[2]["agent_id"] == 8
    assert by["tombstone"]["target_id"] == e2 and by["summarize"]["target_id"] == sm
    assert by["summarize"]["detail"]["through_entry_id"] == e1
    assert by["note_add"]["target_type"] == "note" and by["note_add"]["target_id"] == n
    assert by["note_add"]["detail"]["key"] == "blocker-key"
    assert by["note_add"]["detail"]["work_item_id"] == w
    assert by["task_complete"]["detail"]["cleared"] == 1
    assert by["task_complete"]["detail"]["note_ids"] == [n]
    assert by["work_item_add"]["target_id"] == w
    assert by["work_item_update"]["detail"]["changed"] == ["status"]
    assert by["checkpoint"]["target_id"] == cp and by["checkpoint"]["detail"]["label"] == "cp1"
    assert by["spawn"]["target_id"] == child and by["spawn"]["detail"]["agent_id"] == 11
    assert by["child_complete"]["target_id"] == child
    assert by["handoff"]["agent_id"] == 12 and by["handoff"]["detail"] == {"mode": "takeover"}
    assert by["create"]["agent_id"] == 7 and by["end"]["agent_id"] == 7
    assert all(isinstance(a["at"], int) and a["at"] > 0 for a in log)
    assert [a["at"] for a in log] == sorted(a["at"] for a in log)
    assert actions(client, child) == ["create", "append", "complete"]
    assert actions(client, new) == ["resume"]
    # a small detail, never the content
    for rec in log + audit(client, child):
        assert secret not in repr(rec), rec
    # since: only records at or after a time
    t = by["checkpoint"]["at"]
    assert all(a["at"] >= t for a in audit(client, sid, since=t))
    assert by["checkpoint"]["seq"] in [a["seq"] for a in audit(client, sid, since=t)]


def test_audit_paging_never_skips_or_repeats_under_concurrent_writes(server):
    _, key = server.create_tenant()
    writers, per_writer = 3, 60
    with server.client(key=key) as c:
        sid = new_session(c)
        errors = []

        def writer(n):
            try:
                with server.client(key=key) as w:
                    for i in range(per_writer):
                        if i % 10 == 9:
                            w.call("session.scratchpad.update", session_id=sid,
                                   content=f"{n}-{i}")
                        else:
                            w.call("session.append", session_id=sid, role="user",
                                   content=f"{n}-{i}")
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
        for t in threads:
            t.start()
        seen, cursor, pages_while_writing = [], None, 0
        while True:
            writing = any(t.is_alive() for t in threads)
            page = c.call("session.audit", session_id=sid, cursor=cursor, limit=7)
            seqs = [a["seq"] for a in page["records"]]
            assert len(seqs) <= 7
            seen += seqs
            if seqs:
                assert page["next_cursor"] == seqs[-1]
                pages_while_writing += writing
            else:
                assert page["next_cursor"] == (cursor or 0)
            cursor = page["next_cursor"]
            if not writing and not page["more"] and not any(t.is_alive() for t in threads):
                # one last read after every writer finished
                page = c.call("session.audit", session_id=sid, cursor=cursor, limit=1000)
                seen += [a["seq"] for a in page["records"]]
                break
        for t in threads:
            t.join()
        assert not errors, errors
        total = 1 + writers * per_writer
        assert seen == list(range(1, total + 1))
        assert pages_while_writing > 1
        log = audit(c, sid)
        assert [a["action"] for a in log].count("append") == writers * per_writer * 9 // 10
        assert [a["action"] for a in log].count("scratchpad_update") == writers * per_writer // 10


def test_audit_is_isolated_per_tenant(server):
    _, key_a = server.create_tenant()
    tid_b, key_b = server.create_tenant()
    with server.client(key=key_a) as a, server.client(key=key_b) as b:
        sa = new_session(a)
        a.call("session.append", session_id=sa, role="user", content="x")
        sb = new_session(b)
        # ids are per tenant: B's first session may carry A's number, and shows B's log only
        assert actions(b, sb) == ["create"]
        if sb != sa:
            assert b.call_err("session.audit", session_id=sa)["code"] == "not_found"
        assert actions(a, sa) == ["create", "append"]
    # the server's role sees one tenant's rows, and may not write the log
    as_app = f"BEGIN; SET LOCAL ROLE engram_app; SET LOCAL engram.tenant_id = '{tid_b}'; "
    assert psql(server.dsn, as_app + "SELECT count(DISTINCT tenant_id) || ':' || count(*) "
                                     "FROM session_audit; COMMIT") == "1:1"
    for stmt in ["UPDATE session_audit SET action = 'x'", "DELETE FROM session_audit",
                 "INSERT INTO session_audit (tenant_id, session_id, seq, at, action) "
                 f"VALUES ({tid_b}, {sb}, 99, now(), 'forged')"]:
        with pytest.raises(RuntimeError, match="permission denied"):
            psql(server.dsn, as_app + stmt + "; COMMIT")


def test_audit_is_append_only_and_goes_with_its_session(server):
    tid, key = server.create_tenant()
    with server.client(key=key) as c:
        sid = new_session(c)
        w = add_item(c, sid)["work_item_id"]
        c.call("session.spawn", parent_id=sid, task="t", return_format="summary")
        c.call("session.checkpoint", session_id=sid, label="cp")
        note(c, sid, "k", work_item_id=w)
    # not even the schema's owner changes a record
    with pytest.raises(RuntimeError, match="append-only"):
        psql(server.dsn, f"UPDATE session_audit SET action = 'x' WHERE tenant_id = {tid}")
    count = ("SELECT (SELECT count(*) FROM session_audit WHERE tenant_id = {t}) || ':' || "
             "(SELECT count(*) FROM session_audit_heads WHERE tenant_id = {t}) || ':' || "
             "(SELECT count(*) FROM session_work_items WHERE tenant_id = {t}) || ':' || "
             "(SELECT count(*) FROM session_checkpoint_work_items WHERE tenant_id = {t})")
    assert psql(server.dsn, count.format(t=tid)) == "7:2:1:1"
    # deleting the session (as session.delete does, as the server's role) takes them along
    psql(server.dsn, f"BEGIN; SET LOCAL ROLE engram_app; SET LOCAL engram.tenant_id = '{tid}'; "
                     f"DELETE FROM sessions WHERE tenant_id = {tid} AND id = {sid}; COMMIT")
    assert psql(server.dsn, count.format(t=tid)) == "0:0:0:0"


# ---- handoff -----------------------------------------------------------------------------------

def test_handoff_lists_work_items_tasks_and_the_audit_tail(client):
    sid = new_session(client, agent_id=1)
    a = add_item(client, sid, "config generation")["work_item_id"]
    b = add_item(client, sid, "test scenarios", status="blocked")["work_item_id"]
    d = add_item(client, sid, "client context")["work_item_id"]
    x = add_item(client, sid, "dropped")["work_item_id"]
    client.call("session.work_item.update", session_id=sid, work_item_id=d, status="done")
    client.call("session.work_item.update", session_id=sid, work_item_id=x, status="cancelled")
    for i in range(3):
        client.call("session.append", session_id=sid, role="assistant", content=f"m{i}")
    note(client, sid, "ea", "EA 14.3 confirmed", scope="carry_forward", work_item_id=a)
    note(client, sid, "mine", "half-done local choice", scope="current_task", work_item_id=a)
    note(client, sid, "uat", "creds expired", category="blocker", scope="session",
         work_item_id=b)

    cont = client.call("session.handoff", session_id=sid, mode="continue")
    assert [(w["work_item_id"], w["status"]) for w in cont["work_items"]] == \
        [(a, "open"), (b, "blocked")]
    assert [n["key"] for n in cont["work_items"][0]["notes"]] == ["ea", "mine"]
    assert [n["key"] for n in cont["work_items"][1]["notes"]] == ["uat"]
    assert cont["work_items"][0]["title"] == "config generation"
    assert [(t["work_item_id"], t["title"]) for t in cont["tasks_done"]] == \
        [(d, "client context")]
    m = cont["metrics"]
    assert (m["tasks_done"], m["tasks_remaining"], m["tasks_cancelled"]) == (1, 2, 1)
    tail = cont["audit"]
    assert tail[0]["action"] == "create" and tail[-1]["action"] == "note_add"
    assert "append" not in [r["action"] for r in tail]
    assert [r["action"] for r in tail].count("work_item_add") == 4
    # the tail is the last 20 significant records, oldest first
    for i in range(25):
        client.call("session.scratchpad.update", session_id=sid, content=f"s{i}")
    tail = client.call("session.handoff", session_id=sid, mode="recovery")["audit"]
    assert len(tail) == 35 and tail[0]["action"] == "create"
    tail = client.call("session.handoff", session_id=sid, mode="continue")["audit"]
    assert len(tail) == 20 and all(r["action"] == "scratchpad_update" for r in tail)
    assert tail[-1]["detail"]["version"] == 25
    review = client.call("session.handoff", session_id=sid, mode="review")
    for absent in ("work_items", "tasks_done", "audit"):
        assert absent not in review, absent
    assert review["metrics"]["tasks_remaining"] == 2
    # every handoff is recorded
    assert actions(client, sid).count("handoff") == 4


def test_takeover_never_hands_over_current_task_notes(client):
    sid = new_session(client)
    w = add_item(client, sid, "config generation")["work_item_id"]
    note(client, sid, "jwt", "use JWT", category="decision", scope="carry_forward")
    note(client, sid, "next", "testing agent validates 1-15", category="handoff",
         scope="session", work_item_id=w)
    note(client, sid, "uat", "creds expired", category="blocker", scope="session")
    # the previous agent's current_task notes, one of every category
    for cat in ("decision", "discovery", "blocker", "context", "handoff"):
        note(client, sid, f"ct-{cat}", f"current {cat}", category=cat, scope="current_task",
             work_item_id=w)

    cont = client.call("session.handoff", session_id=sid, mode="continue")
    assert "ct-handoff" in [n["key"] for n in cont["carry_forward"]]
    assert "ct-blocker" in [n["key"] for n in cont["blockers"]]

    take = client.call("session.handoff", session_id=sid, mode="takeover")
    assert [n["key"] for n in take["carry_forward"]] == ["jwt", "next"]
    assert [n["key"] for n in take["blockers"]] == ["uat"]
    assert [n["key"] for n in take["decisions"]] == ["jwt"]
    assert [n["key"] for n in take["work_items"][0]["notes"]] == ["next"]
    for rec in take["audit"]:
        assert rec["detail"].get("scope") != "current_task", rec
        assert not rec["detail"].get("key", "").startswith("ct-"), rec
    assert "current " not in repr(take)
    for absent in ("summary", "scratchpad", "events", "notes"):
        assert absent not in take, absent
