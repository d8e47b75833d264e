"""Tenant isolation, generated from the server's own method table.

For every tenant method the server lists (`methods`), a second tenant calls it aimed at the
first tenant's data: its memory ids, session, entries, checkpoint. It may succeed only in
its own space, must never see the first tenant's content, and must learn nothing from
errors (not found, never "another tenant"). Afterwards the first tenant's data is exactly as
before. A method added later is covered without anyone remembering: a required parameter
this test has no probe value for fails the test.

Ids are numbered per tenant, so B's own objects could carry the very ids A's have. Tenant A
first moves its counters past anything B's probes create, so every id B aims at is A's
alone. (Equal ids in two tenants are covered by test_isolation_basic.)
"""
import json

from harness import structured_vectors, vec_bin

MARK = "SECRET-A-7f3e"


def without_clock(o):
    """Drops values that move with the wall clock alone (a live session's elapsed time)."""
    if isinstance(o, dict):
        return {k: without_clock(v) for k, v in o.items() if k != "elapsed_ms"}
    if isinstance(o, list):
        return [without_clock(v) for v in o]
    return o


def snapshot(c, sid, mem_ids):
    """Everything tenant A can read about its data."""
    return json.dumps(without_clock({
        "memories": c.call("memory.get", ids=mem_ids),
        "stats": c.call("memory.stats"),
        "list": c.call("memory.list", limit=1000, include_archived=True),
        "session": c.call("session.get", session_id=sid),
        "messages": c.call("session.messages", session_id=sid),
        "notes": c.call("session.notes", session_id=sid),
        "scratchpad": c.call("session.scratchpad.get", session_id=sid),
        "checkpoints": c.call("session.checkpoints", session_id=sid),
        "children": c.call("session.children", session_id=sid),
        "work_items": c.call("session.work_item.list", session_id=sid),
        "audit": c.call("session.audit", session_id=sid, limit=1000),
        "history": [c.call("memory.history", id=i) for i in mem_ids],
    }), sort_keys=True, default=str)


PAD = 20  # ids A uses up first, of every kind; B's probes create fewer than this


def pad_counters(a):
    """Moves tenant A's memory, session, entry, note and checkpoint counters past PAD."""
    ids = a.call("memory.store_batch", memories=[
        {"content": f"pad {i}", "type": "fact", "importance": 0.1} for i in range(PAD)])["ids"]
    assert a.call("memory.delete", ids=ids)["deleted"] == ids
    sid = a.call("session.create", agent_id=9, config={"model": "m"})["session_id"]
    for i in range(PAD):
        a.call("session.append", session_id=sid, role="user", content=f"pad {i}")
        a.call("session.note.add", session_id=sid, category="decision", key=f"p{i}", value="pad",
               scope="session")
        a.call("session.checkpoint", session_id=sid, label=f"pad {i}")
    for _ in range(PAD):
        a.call("session.end", session_id=a.call("session.create", agent_id=9,
                                                config={"model": "m"})["session_id"])


def test_second_tenant_cannot_reach_the_first(server):
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    vecs = structured_vectors(5, 384, seed=501)
    with server.client(key=ka) as a:
        pad_counters(a)
        mem_ids = a.call("memory.store_batch", memories=[
            {"content": f"{MARK} memory {i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(v),
             "metadata": {"tokens": ["SHARED"]}} for i, v in enumerate(vecs)])["ids"]
        a.call("memory.archive", ids=[mem_ids[4]])
        sid = a.call("session.create", agent_id=1, config={"model": "m", "system_prompt": MARK})["session_id"]
        entry = a.call("session.append", session_id=sid, role="user", content=f"{MARK} said")["entry_id"]
        a.call("session.note.add", session_id=sid, category="decision", key="k", value=MARK, scope="session")
        a.call("session.scratchpad.update", session_id=sid, content=MARK)
        cp = a.call("session.checkpoint", session_id=sid, label="cp")["checkpoint_id"]
        child = a.call("session.spawn", parent_id=sid, task=MARK, return_format="summary")["session_id"]
        work = a.call("session.work_item.add", session_id=sid, title=MARK)["work_item_id"]
        before = snapshot(a, sid, mem_ids)
    assert min(mem_ids + [sid, entry, cp, child]) > PAD

    # probe values, most specific first: (method, parameter), then parameter
    by_method = {
        ("session.note.add", "scope"): "session",
        ("session.complete", "session_id"): child,
        ("memory.update", "content"): "overwritten by B",
        ("session.handoff", "mode"): "continue",
        ("session.append", "tokens"): 3,
        ("session.work_item.update", "status"): "done",
    }
    by_name = {
        "ids": mem_ids, "id": mem_ids[0], "session_id": sid, "parent_id": sid, "entry_id": entry,
        "through_entry_id": entry, "checkpoint_id": cp,
        "content": "probe", "type": "fact", "importance": 0.5, "query": MARK, "embedding": vec_bin(vecs[0]),
        "memories": [{"content": "probe", "type": "fact", "importance": 0.5}],
        "agent_id": 1, "config": {"model": "m"}, "role": "user", "label": "probe", "output": "probe",
        "category": "decision", "key": "k", "value": "probe", "summary": "probe",
        "messages_compacted": 1, "task": "probe", "return_format": "summary", "tokens": ["SHARED"],
        "cited": mem_ids, "injected": mem_ids, "response": "probe", "title": "probe",
        "work_item_id": work,
    }
    with server.client() as anon:
        methods = [m for m in anon.call("methods") if "tenant" in m["flags"]]
    assert len(methods) > 30
    probed, refusals = [], set()
    with server.client(key=kb) as b:
        for m in methods:
            params = {}
            for p in m["params"]:
                v = by_method.get((m["name"], p["name"]), by_name.get(p["name"]))
                if v is None:
                    assert not p["required"], f"no probe value for {m['name']}.{p['name']}: add one"
                    continue
                params[p["name"]] = v
            if m["name"] == "memory.update":
                params.setdefault("content", "overwritten by B")
            err, res = b.wait(b.send(m["name"], params))
            text = json.dumps([err, res], default=str)
            assert MARK not in text, f"{m['name']} showed tenant A's data to B: {text[:300]}"
            if err is not None:
                # every probe is well-formed, so a refusal can only be about the data (or
                # the tier): an invalid_argument here would mean the method was never probed
                assert err["code"] in ("not_found", "permission_denied"), (m["name"], err)
                refusals.add(m["name"])
                msg = err["message"].lower()
                assert "another tenant" not in msg and "belongs" not in msg and "owner" not in msg, err
            elif isinstance(res, dict):
                for f in ("deleted", "archived", "restored"):
                    assert not res.get(f), f"{m['name']} changed A's memories: {res}"
            probed.append(m["name"])
    assert len(probed) == len(methods)
    with server.client(key=ka) as a:
        after = snapshot(a, sid, mem_ids)
    assert after == before, "tenant A's data changed while tenant B probed it"
    refused = sum(1 for m in probed if m in refusals)
    print(f"\n[isolation] {len(probed)} tenant methods called by tenant B with tenant A's "
          f"memory, session, entry, note and checkpoint ids: {refused} refused (not_found or "
          f"permission_denied), {len(probed) - refused} answered within B's own space; A's "
          f"content shown 0 times, A's data changed 0 times")
