"""Pipelined requests on one connection are all answered, matched by msgid."""
import msgpack

from harness import structured_vectors, vec_bin


def test_pipelined_requests_all_answered(server, tenant):
    _, key = tenant
    vecs = structured_vectors(300, 384, seed=5)
    with server.client(key=key) as c:
        # one write burst of stores, searches and pings, without reading in between
        frames = []
        expect = {}
        for i, v in enumerate(vecs):
            frames.append(msgpack.packb([0, 1000 + i, "memory.store",
                                         [{"content": f"p{i}", "type": "fact", "importance": 0.5,
                                           "embedding": vec_bin(v)}]], use_bin_type=True))
            expect[1000 + i] = "store"
        for i in range(200):
            frames.append(msgpack.packb([0, 5000 + i, "ping", []], use_bin_type=True))
            expect[5000 + i] = "ping"
        c.send_raw(b"".join(frames))
        got = {}
        while len(got) < len(expect):
            msg = c.recv()
            assert msg is not None, f"connection closed after {len(got)} responses"
            assert msg[0] == 1
            assert msg[1] in expect and msg[1] not in got
            got[msg[1]] = msg
        for msgid, kind in expect.items():
            _, _, err, result = got[msgid]
            assert err is None, err
            if kind == "ping":
                assert result == "pong"
            else:
                assert isinstance(result["id"], int)
        ids = {got[1000 + i][3]["id"] for i in range(300)}
        assert len(ids) == 300
        # and a pipelined batch of searches each finds its own vector
        msgids = [c.send("memory.search", {"embedding": vec_bin(vecs[i]), "top_k": 1, "similarity_weight": 1.0})
                  for i in range(0, 300, 10)]
        for n, msgid in enumerate(msgids):
            err, res = c.wait(msgid)
            assert err is None
            assert res["results"][0]["content"] == f"p{n * 10}"


def test_notifications_get_no_response(server, tenant):
    with server.client(key=tenant[1]) as c:
        c.send_raw(msgpack.packb([2, "ping", []]))
        assert c.call("ping") == "pong"
        assert not c.pending
