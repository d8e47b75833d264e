"""Sessions are tenant-private: another tenant's key gets not_found for every id of the first
tenant, through every session method, and changes nothing."""


def setup_tenant_a(c):
    sid = c.call("session.create", agent_id=1, config={"model": "m"})["session_id"]
    entry = c.call("session.append", session_id=sid, role="user", content="secret",
                   cost_usdc=0.5)["entry_id"]
    c.call("session.note.add", session_id=sid, category="decision", key="k", value="secret",
           scope="session")
    c.call("session.scratchpad.update", session_id=sid, content="secret plan")
    ck = c.call("session.checkpoint", session_id=sid, label="a")["checkpoint_id"]
    child = c.call("session.spawn", parent_id=sid, task="t", return_format="summary")["session_id"]
    work = c.call("session.work_item.add", session_id=sid, title="secret task")["work_item_id"]
    return sid, entry, ck, child, work


def calls(sid, entry, ck, child, work):
    """Every session method with tenant A's ids (None: the method takes no id)."""
    return {
        "session.create": None,
        "session.list": None,
        "session.get": {"session_id": sid},
        "session.extract": {"session_id": sid, "through_entry_id": entry},
        "session.end": {"session_id": sid, "summary": "x"},
        "session.append": {"session_id": sid, "role": "user", "content": "x"},
        "session.tombstone": {"entry_id": entry},
        "session.summarize": {"summary": "x", "through_entry_id": entry,
                              "messages_compacted": 1},
        "session.messages": {"session_id": sid},
        "session.scratchpad.get": {"session_id": sid},
        "session.scratchpad.update": {"session_id": sid, "content": "x"},
        "session.note.add": {"session_id": sid, "category": "decision", "key": "k",
                             "value": "x", "scope": "session"},
        "session.notes": {"session_id": sid},
        "session.task.complete": {"session_id": sid},
        "session.checkpoint": {"session_id": sid, "label": "x"},
        "session.checkpoints": {"session_id": sid},
        "session.resume": {"checkpoint_id": ck},
        "session.spawn": {"parent_id": sid, "task": "x", "return_format": "summary"},
        "session.complete": {"session_id": child, "output": "x"},
        "session.children": {"session_id": sid},
        "session.handoff": {"session_id": sid, "mode": "recovery"},
        "session.context": {"session_id": sid},
        "session.delete": {"session_id": sid, "cascade": True},
        "session.audit": {"session_id": sid},
        "session.work_item.add": {"session_id": sid, "title": "x"},
        "session.work_item.update": {"session_id": sid, "work_item_id": work, "status": "done"},
        "session.work_item.list": {"session_id": sid},
    }


def test_other_tenants_get_not_found_everywhere(server):
    _, key_a = server.create_tenant()
    _, key_b = server.create_tenant()
    with server.client(key=key_a) as a, server.client(key=key_b) as b:
        sid, entry, ck, child, work = setup_tenant_a(a)
        before = a.call("session.handoff", session_id=sid, mode="recovery")
        table = calls(sid, entry, ck, child, work)
        served = {m["name"] for m in b.call("methods") if m["name"].startswith("session.")}
        assert served == set(table), f"untested session methods: {served ^ set(table)}"
        for method, params in table.items():
            if params is None:
                continue
            err = b.call_err(method, **params)
            assert err["code"] == "not_found", (method, err)
            assert "tenant" not in err["message"], (method, err)
        # with the session id given explicitly as well
        for method, params in [("session.tombstone", {"session_id": sid, "entry_id": entry}),
                               ("session.summarize", {"session_id": sid, "summary": "x",
                                                      "through_entry_id": entry,
                                                      "messages_compacted": 1})]:
            assert b.call_err(method, **params)["code"] == "not_found", method
        # B's own session cannot reach A's entries either
        own = b.call("session.create", agent_id=1, config={"model": "m"})["session_id"]
        assert b.call_err("session.tombstone", session_id=own, entry_id=entry)["code"] == \
            "not_found"
        assert b.call_err("session.append", session_id=own, role="user", content="x",
                          parent_id=entry)["code"] == "invalid_argument"
        # B lists only its own sessions
        assert [s["session_id"] for s in b.call("session.list")["sessions"]] == [own]
        # and A's session is exactly as it was
        after = a.call("session.handoff", session_id=sid, mode="recovery")
        for k in ("notes", "scratchpad", "metrics", "checkpoint", "children", "summary",
                  "work_items", "audit"):
            if k == "metrics":
                before[k].pop("duration_ms")
                after[k].pop("duration_ms")
            assert after[k] == before[k], k
        assert a.call("session.get", session_id=sid)["state"] == "active"
        assert [m["content"] for m in a.call("session.messages", session_id=sid)["messages"]] \
            == ["secret"]
