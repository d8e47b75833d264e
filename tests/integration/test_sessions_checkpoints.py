"""Session checkpoints: delta storage, resume restoring exactly a checkpoint's state, branch
rules, per-agent tails, sub-agents across resume, expiry and the purge."""
import pytest

from harness import Server, new_database, psql

TTL_S = 120


@pytest.fixture(scope="module")
def server():
    srv = Server(new_database("ck"), extra=["--premium-checkpoint-ttl-s", str(TTL_S)]).start()
    yield srv
    try:
        srv.stop()
    finally:
        srv.cleanup()


def new_session(c, agent_id=1, **config):
    config.setdefault("model", "sonnet")
    return c.call("session.create", agent_id=agent_id, config=config)["session_id"]


def note(c, sid, key, value, category="decision", scope="session", **kw):
    return c.call("session.note.add", session_id=sid, category=category, key=key, value=value,
                  scope=scope, **kw)


def snapshot(c, sid):
    """Everything a checkpoint must restore, in comparable form."""
    s = c.call("session.get", session_id=sid)
    sp = c.call("session.scratchpad.get", session_id=sid)
    notes = c.call("session.notes", session_id=sid)["notes"]
    msgs = c.call("session.messages", session_id=sid)["messages"]
    return {
        "messages": [(m["entry_id"], m["type"], m["role"], m["content"]) for m in msgs],
        "scratchpad": (sp["content"], sp["version"], sp["token_count"]),
        "notes": [(n["category"], n["key"], n["value"], n["scope"], n["work_item_id"])
                  for n in notes],
        "counters": {k: s[k] for k in ("total_cost_usdc", "children_cost_usdc", "entry_count",
                                       "entry_bytes", "compaction_count", "rounds", "position")},
    }


def test_resume_restores_exactly_the_checkpointed_state(client):
    sid = new_session(client, agent_id=5, max_cost_usdc=10, compaction={"keep_recent": 0})
    ids = [client.call("session.append", session_id=sid, role="user" if i % 2 else "assistant",
                       content=f"m{i}", cost_usdc=0.25)["entry_id"] for i in range(6)]
    client.call("session.tombstone", entry_id=ids[1])
    client.call("session.scratchpad.update", session_id=sid, content="plan A")
    note(client, sid, "auth", "JWT")
    wid = client.call("session.work_item.add", session_id=sid, title="t")["work_item_id"]
    note(client, sid, "tmp", "scratch", scope="current_task", work_item_id=wid)
    a = client.call("session.checkpoint", session_id=sid, label="A", metadata={"strategy": "lp"})
    at_a = snapshot(client, sid)
    assert a["delta"]["scratchpad"] and a["delta"]["notes_added"] == 2
    assert a["expires_at"] - a["created_at"] == TTL_S * 1000

    # change everything
    for i in range(3):
        client.call("session.append", session_id=sid, role="assistant", content=f"n{i}",
                    cost_usdc=0.5)
    client.call("session.tombstone", entry_id=ids[2])
    client.call("session.summarize", session_id=sid, summary="S", through_entry_id=ids[4],
                messages_compacted=4)
    client.call("session.scratchpad.update", session_id=sid, content="plan B")
    note(client, sid, "auth", "OAuth")
    client.call("session.task.complete", session_id=sid)
    note(client, sid, "risk", "IL", category="discovery", scope="carry_forward")
    b = client.call("session.checkpoint", session_id=sid, label="B")
    at_b = snapshot(client, sid)
    # 3 messages, a tombstone, a summary and B's session_paused event were logged since A
    # (referenced, not copied)
    assert b["delta"] == {"scratchpad": True, "notes_added": 2, "notes_removed": 2,
                          "entries": 6}
    # nothing changed: nothing stored but the position (C's own session_paused event)
    c2 = client.call("session.checkpoint", session_id=sid, label="C")
    assert c2["delta"] == {"scratchpad": False, "notes_added": 0, "notes_removed": 0,
                           "entries": 1}
    at_c = snapshot(client, sid)
    client.call("session.append", session_id=sid, role="user", content="after", cost_usdc=1)
    client.call("session.scratchpad.update", session_id=sid, content="plan C")
    note(client, sid, "late", "x")
    now = snapshot(client, sid)

    for ck, want in ((a, at_a), (b, at_b), (c2, at_c)):
        r = client.call("session.resume", checkpoint_id=ck["checkpoint_id"])
        assert r["resumed_from"] == sid and r["branch_type"] == "resume"
        got = snapshot(client, r["session_id"])
        assert got["messages"] == want["messages"]
        assert got["scratchpad"] == want["scratchpad"]
        assert got["notes"] == want["notes"]
        # the resumed session starts with its session_resumed event after the checkpoint
        assert got["counters"] == dict(want["counters"],
                                       position=want["counters"]["position"] + 1)
        assert r["restored"]["total_cost_usdc"] == want["counters"]["total_cost_usdc"]
        assert r["restored"]["position"] == want["counters"]["position"]
    assert r["restored"]["label"] == "C"
    # the source session is untouched by resuming from it
    assert snapshot(client, sid) == now
    listed = client.call("session.checkpoints", session_id=sid)["checkpoints"]
    assert [k["label"] for k in listed] == ["A", "B", "C"]
    assert listed[0]["metadata"] == {"strategy": "lp"}


def test_resumed_session_continues_independently(client):
    sid = new_session(client, agent_id=5, max_cost_usdc=2)
    e = [client.call("session.append", session_id=sid, role="user", content=f"m{i}",
                     cost_usdc=0.5)["entry_id"] for i in range(3)]
    ck = client.call("session.checkpoint", session_id=sid, label="x")["checkpoint_id"]
    r = client.call("session.resume", checkpoint_id=ck,
                    config_override={"model": "opus", "system_prompt": "think hard"})
    new = r["session_id"]
    s = client.call("session.get", session_id=new)
    assert s["model"] == "opus" and s["config"]["system_prompt"] == "think hard"
    assert s["config"]["max_cost_usdc"] == 2  # kept from the source
    # three messages and the checkpoint's session_paused event
    assert s["resumed_from"] == {"session_id": sid, "checkpoint_id": ck, "position": 4}
    # budget spent carries over (1.5 of 2); elapsed time restarts
    assert s["total_cost_usdc"] == 1.5 and s["constraints"]["elapsed_ms"] < 60000
    client.call("session.append", session_id=new, role="user", content="b1", cost_usdc=0.5)
    err = client.call_err("session.append", session_id=new, role="user", content="b2",
                          cost_usdc=0.01)
    assert err["code"] == "cost_limit_exceeded"
    # both go on separately; a tombstone in the branch hides an inherited entry there only
    client.call("session.append", session_id=sid, role="user", content="a1")
    client.call("session.tombstone", session_id=new, entry_id=e[0])
    assert [m["content"] for m in client.call("session.messages", session_id=new)["messages"]] \
        == ["m1", "m2", "b1"]
    assert [m["content"] for m in client.call("session.messages", session_id=sid)["messages"]] \
        == ["m0", "m1", "m2", "a1"]
    # entries of the source after the checkpoint are not part of the branch
    late = client.call("session.messages", session_id=sid)["messages"][-1]["entry_id"]
    assert client.call_err("session.tombstone", session_id=new, entry_id=late)["code"] == \
        "not_found"
    # a resume of a resume (crash after crash) chains the transcript
    ck2 = client.call("session.checkpoint", session_id=new, label="y")["checkpoint_id"]
    r2 = client.call("session.resume", checkpoint_id=ck2, config_override={"max_cost_usdc": None})
    assert [m["content"] for m in client.call("session.messages",
                                              session_id=r2["session_id"])["messages"]] == \
        ["m1", "m2", "b1"]
    s2 = client.call("session.get", session_id=r2["session_id"])
    assert s2["max_cost_usdc"] is None and "max_cost_usdc" not in s2["config"]
    client.call("session.append", session_id=r2["session_id"], role="user", content="free",
                cost_usdc=5)


def test_branches_are_single_level(client):
    sid = new_session(client)
    client.call("session.append", session_id=sid, role="user", content="x")
    ck = client.call("session.checkpoint", session_id=sid, label="root")["checkpoint_id"]
    for kind in ("sim", "pre_steer", "dream"):
        r = client.call("session.resume", checkpoint_id=ck, branch_type=kind)
        assert r["branch_type"] == kind and r["simulation"] == kind
        s = client.call("session.get", session_id=r["session_id"])
        assert s["branch_type"] == kind and s["simulation"] == kind
    sim = client.call("session.resume", checkpoint_id=ck, branch_type="sim")["session_id"]
    ck_sim = client.call("session.checkpoint", session_id=sim, label="in sim")["checkpoint_id"]
    for kind in ("sim", "pre_steer", "dream"):
        err = client.call_err("session.resume", checkpoint_id=ck_sim, branch_type=kind)
        assert err["code"] == "permission_denied" and "single-level" in err["message"]
    # crash recovery stays allowed, and the lineage stays a simulation
    rec = client.call("session.resume", checkpoint_id=ck_sim)
    assert rec["branch_type"] == "resume" and rec["simulation"] == "sim"
    ck_rec = client.call("session.checkpoint", session_id=rec["session_id"],
                         label="recovered")["checkpoint_id"]
    assert client.call_err("session.resume", checkpoint_id=ck_rec,
                           branch_type="dream")["code"] == "permission_denied"
    # a plain resume of the root may branch again
    plain = client.call("session.resume", checkpoint_id=ck)["session_id"]
    ck_plain = client.call("session.checkpoint", session_id=plain, label="p")["checkpoint_id"]
    assert client.call("session.resume", checkpoint_id=ck_plain,
                       branch_type="sim")["simulation"] == "sim"


def test_agent_tails(client):
    sid = new_session(client, agent_id=1)
    for i in range(60):
        client.call("session.append", session_id=sid, role="assistant", content=f"a{i}")
    for i in range(5):
        client.call("session.append", session_id=sid, role="assistant", content=f"b{i}",
                    agent_id=2)
    ck = client.call("session.checkpoint", session_id=sid, label="t")["checkpoint_id"]
    client.call("session.append", session_id=sid, role="assistant", content="late")
    r = client.call("session.resume", checkpoint_id=ck)
    tails = {a["agent_id"]: [m["content"] for m in a["tail"]] for a in r["agents"]}
    assert [a["agent_id"] for a in r["agents"]] == [2, 1]  # most recently active first
    # default depth 50; the session's agent's tail ends with the pause
    paused = f"Session paused at checkpoint {ck} (t)."
    assert tails[1] == [f"a{i}" for i in range(11, 60)] + [paused]
    assert tails[2] == [f"b{i}" for i in range(5)]
    r = client.call("session.resume", checkpoint_id=ck,
                    config_override={"transcript_replay_depth": 3})
    tails = {a["agent_id"]: [m["content"] for m in a["tail"]] for a in r["agents"]}
    assert tails[1] == ["a58", "a59", paused] and tails[2] == ["b2", "b3", "b4"]


def test_active_sub_agents_come_back(client):
    parent = new_session(client, agent_id=1)
    child = client.call("session.spawn", parent_id=parent, task="research", context="ctx",
                        return_format="summary", agent_id=9)["session_id"]
    done = client.call("session.spawn", parent_id=parent, task="done already",
                       return_format="summary")["session_id"]
    client.call("session.complete", session_id=done, output="ok")
    client.call("session.append", session_id=child, role="assistant", content="found X",
                cost_usdc=0.25)
    err = client.call_err("session.checkpoint", session_id=child, label="no")
    assert err["code"] == "invalid_argument"
    ck = client.call("session.checkpoint", session_id=parent, label="p")["checkpoint_id"]
    client.call("session.append", session_id=child, role="assistant", content="after")
    client.call("session.complete", session_id=child, output="X")
    r = client.call("session.resume", checkpoint_id=ck)
    assert len(r["children"]) == 1
    kid = r["children"][0]
    assert kid["resumed_from"] == child and kid["agent_id"] == 9 and kid["task"] == "research"
    assert [m["content"] for m in kid["tail"]] == ["ctx", "research", "found X"]
    k = client.call("session.get", session_id=kid["session_id"])
    assert k["parent_id"] == r["session_id"] and k["state"] == "active"
    assert k["total_cost_usdc"] == 0.25
    assert client.call("session.get", session_id=r["session_id"])["total_cost_usdc"] == 0.25
    # the restored sub-agent works, and its costs go to the new parent
    client.call("session.append", session_id=kid["session_id"], role="assistant", content="more",
                cost_usdc=0.5)
    assert client.call("session.get", session_id=r["session_id"])["total_cost_usdc"] == 0.75
    assert client.call("session.get", session_id=parent)["total_cost_usdc"] == 0.25


def test_expired_checkpoints_are_not_found_and_purged(server, tenant, client):
    sid = new_session(client)
    note(client, sid, "first", "1")
    client.call("session.scratchpad.update", session_id=sid, content="v1")
    k1 = client.call("session.checkpoint", session_id=sid, label="k1")["checkpoint_id"]
    note(client, sid, "second", "2")
    k2 = client.call("session.checkpoint", session_id=sid, label="k2")["checkpoint_id"]
    note(client, sid, "third", "3")
    k3 = client.call("session.checkpoint", session_id=sid, label="k3")["checkpoint_id"]
    assert client.call("session.get", session_id=sid)["checkpoint_count"] == 3
    # expire k1 and k2 in the database (the lifetime is a tier setting of at least 60 s)
    psql(server.dsn, "UPDATE session_checkpoints SET expires_at = now() - interval '1 second' "
                     f"WHERE tenant_id = {tenant[0]} AND id IN ({k1}, {k2})")
    for k in (k1, k2):
        assert client.call_err("session.resume", checkpoint_id=k)["code"] == "not_found"
    assert [k["checkpoint_id"] for k in client.call("session.checkpoints",
                                                    session_id=sid)["checkpoints"]] == [k3]
    assert client.call("session.get", session_id=sid)["checkpoint_count"] == 1
    removed = int(psql(server.dsn, "SELECT engram_session_purge_expired()"))
    assert removed >= 2
    assert psql(server.dsn, f"SELECT count(*) FROM session_checkpoints WHERE tenant_id = {tenant[0]} "
                            f"AND id IN ({k1},{k2})") \
        == "0"
    # k3 held only a delta against k2; after the purge it still restores everything
    r = client.call("session.resume", checkpoint_id=k3)
    notes = client.call("session.notes", session_id=r["session_id"])["notes"]
    assert [n["key"] for n in notes] == ["first", "second", "third"]
    assert client.call("session.scratchpad.get", session_id=r["session_id"])["content"] == "v1"
    # the scratchpad copy moved to k3; nothing is left that only purged checkpoints held
    assert psql(server.dsn, "SELECT count(*) FROM session_scratchpad_snaps sn WHERE NOT EXISTS "
                            "(SELECT 1 FROM session_checkpoints k WHERE k.tenant_id = sn.tenant_id"
                            " AND k.scratchpad_snap = sn.id)") == "0"
    assert int(psql(server.dsn, "SELECT engram_session_purge_expired()")) == 0
    # a new checkpoint after the purge is a delta against k3
    note(client, sid, "fourth", "4")
    k4 = client.call("session.checkpoint", session_id=sid, label="k4")
    assert k4["delta"]["notes_added"] == 1 and not k4["delta"]["scratchpad"]
    notes = client.call("session.notes", session_id=client.call(
        "session.resume", checkpoint_id=k4["checkpoint_id"])["session_id"])["notes"]
    assert [n["key"] for n in notes] == ["first", "second", "third", "fourth"]


def test_purge_of_every_checkpoint(server, tenant, client):
    sid = new_session(client)
    client.call("session.scratchpad.update", session_id=sid, content="only")
    k = client.call("session.checkpoint", session_id=sid, label="k")["checkpoint_id"]
    psql(server.dsn, "UPDATE session_checkpoints SET expires_at = now() - interval '1 second' "
                     f"WHERE tenant_id = {tenant[0]} AND id = {k}")
    assert int(psql(server.dsn, "SELECT engram_session_purge_expired()")) >= 1
    assert psql(server.dsn, f"SELECT count(*) FROM session_scratchpad_snaps WHERE "
                            f"tenant_id = {tenant[0]} AND session_id = {sid}") == "0"
    # with no checkpoint left, the next one stores the whole state again
    k2 = client.call("session.checkpoint", session_id=sid, label="k2")
    assert k2["delta"]["scratchpad"]
    r = client.call("session.resume", checkpoint_id=k2["checkpoint_id"])
    assert client.call("session.scratchpad.get", session_id=r["session_id"])["content"] == "only"
