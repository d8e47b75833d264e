"""Session working memory through the blocking and the asyncio client."""
import asyncio

import pytest

from engram_client import AsyncClient, CostLimitExceeded


def test_session_lifecycle(client):
    s = client.session.create(agent_id=42, config={"model": "m1", "max_cost_usdc": 1.0})
    sid = s["session_id"]
    client.session.append(sid, role="user", content="hello", cost_usdc=0.4)
    client.session.append(sid, role="assistant", content="hi there", cost_usdc=0.4)
    with pytest.raises(CostLimitExceeded) as e:
        client.session.append(sid, role="user", content="too much", cost_usdc=0.4)
    assert e.value.limit == pytest.approx(1.0) and e.value.session_id == sid
    pad = client.session.scratchpad.update(sid, content="# plan\n- step 1")
    assert pad["version"] == 1
    assert client.session.scratchpad.get(sid)["content"] == "# plan\n- step 1"
    n = client.session.note.add(sid, category="decision", key="db", value="use postgres",
                                scope="carry_forward")
    w = client.session.work_item.add(sid, title="green CI", status="blocked")
    assert w["status"] == "blocked" and w["owner_agent_id"] == 42
    client.session.note.add(sid, category="blocker", key="ci", value="tests flaky",
                            scope="current_task",
                            work_item_id=w["work_item_id"])
    notes = client.session.notes(sid)["notes"]
    assert [x["key"] for x in notes] == ["db", "ci"] and notes[0]["note_id"] == n["note_id"]
    cp = client.session.checkpoint(sid, label="before-risky-step")
    client.session.append(sid, role="user", content="after checkpoint")
    r = client.session.resume(cp["checkpoint_id"])
    assert r["session_id"] != sid
    msgs = client.session.messages(r["session_id"])["messages"]
    assert [m["content"] for m in msgs] == ["hello", "hi there"]
    h = client.session.handoff(sid, mode="continue")
    assert h["scratchpad"]["content"] == "# plan\n- step 1"
    assert [x["key"] for x in h["blockers"]] == ["ci"]
    assert [x["work_item_id"] for x in h["work_items"]] == [w["work_item_id"]]
    assert "note_add" in [x["action"] for x in client.session.audit(sid)["records"]]
    assert client.session.task.complete(sid)["cleared"] == 1
    assert client.session.end(sid, summary="done")["state"] == "ended"


def test_async_client_sessions_and_memory(server, key):
    async def main():
        async with AsyncClient(server.host, server.port, api_key=key) as c:
            assert await c.ping() == "pong"
            sid = (await c.session.create(agent_id=1, config={"model": "m"}))["session_id"]
            await c.session.note.add(sid, category="context", key="k", value="v", scope="session")
            got = await c.session.notes(sid)
            assert got["notes"][0]["value"] == "v"
            ids = await asyncio.gather(*[
                c.memory.store(content=f"async {i}", type="fact", importance=0.5,
                               embedding=[1.0] * 7 + [float(i + 1)])
                for i in range(50)])
            assert len({r["id"] for r in ids}) == 50
            mems = (await c.memory.get([r["id"] for r in ids]))["memories"]
            assert [m["content"] for m in mems] == [f"async {i}" for i in range(50)]
            fast = c.with_options(timeout=5)
            assert (await fast.memory.stats())["total"] == 50
    asyncio.run(main())
