"""Identity changes on one connection under pipelining.

Every request that follows an `auth` in the byte stream runs as the identity that `auth`
establishes, however the requests are pipelined; a failed `auth` leaves the connection with no
identity at all, whatever it had before; `auth` answers `unauthenticated` with one message
whatever is wrong with the key.
"""
import itertools

import msgpack
import pytest

from harness import structured_vectors, vec_bin

VECS = structured_vectors(64, 384, seed=11)
_n = itertools.count()


def frame(msgid, method, params=None):
    return msgpack.packb([0, msgid, method, [] if params is None else [params]],
                         use_bin_type=True)


def store_params(tag):
    return {"content": tag, "type": "fact", "importance": 0.5,
            "embedding": vec_bin(VECS[next(_n) % len(VECS)])}


def answers(c, msgids):
    """Reads until every msgid is answered; returns {msgid: (err, result)}."""
    got = {}
    while len(got) < len(msgids):
        msg = c.recv()
        assert msg is not None, f"connection closed after {len(got)} of {len(msgids)} answers"
        assert msg[0] == 1 and msg[1] in msgids and msg[1] not in got
        got[msg[1]] = (msg[2], msg[3])
    return got


def owner_of(server, keys, memory_id, content):
    """Which of keys (name -> key) holds memory_id with this content; asserts exactly one
    does (ids are numbered per tenant, so both tenants may hold the id itself)."""
    seen = []
    for name, key in keys.items():
        with server.client(key=key) as c:
            got = c.call("memory.get", ids=[memory_id])["memories"]
            if got and got[0]["content"] == content:
                seen.append(name)
    assert len(seen) == 1, f"memory {memory_id} ({content}) held by {seen}"
    return seen[0]


@pytest.fixture(scope="module")
def two(server):
    return {"A": server.create_tenant()[1], "B": server.create_tenant()[1]}


def run_sequence(server, two, start, steps):
    """Sends steps in one write on a connection authenticated as start (None: fresh).

    steps: list of ("auth", name) / ("auth_bad", None) / ("store", None) / ("get", None).
    Returns the list of (step, err, result) in order.
    """
    c = server.client(key=two[start] if start else None)
    try:
        frames, ids = [], []
        tags = [f"s{next(_n)}" for _ in steps]
        for i, (kind, arg) in enumerate(steps):
            mid = 100 + i
            if kind == "auth":
                frames.append(frame(mid, "auth", {"api_key": two[arg]}))
            elif kind == "auth_bad":
                frames.append(frame(mid, "auth", {"api_key": "egk_" + "a" * 16 + "_" + "b" * 32}))
            elif kind == "store":
                frames.append(frame(mid, "memory.store", store_params(tags[i])))
            elif kind == "get":
                frames.append(frame(mid, "memory.stats"))
            ids.append(mid)
        c.send_raw(b"".join(frames))
        got = answers(c, set(ids))
        return [(steps[i], *got[ids[i]], tags[i]) for i in range(len(steps))]
    finally:
        c.close()


def expected_identity(start, steps):
    """The identity each step must run as: the last auth before it, None after a failure."""
    who, out = start, []
    for kind, arg in steps:
        out.append(who)
        if kind == "auth":
            who = arg
        elif kind == "auth_bad":
            who = None
    return out


SHAPES = [
    # (start identity, steps)
    ("A", [("auth", "B"), ("store", None)]),
    (None, [("auth", "A"), ("store", None)]),
    (None, [("auth", "B"), ("get", None), ("store", None), ("store", None)]),
    ("A", [("store", None), ("auth", "B"), ("store", None), ("auth", "A"), ("store", None)]),
    ("A", [("auth_bad", None), ("store", None), ("get", None)]),
    ("B", [("auth", "A"), ("auth_bad", None), ("store", None), ("auth", "B"), ("store", None)]),
    (None, [("store", None), ("auth", "A"), ("store", None)]),
    ("A", [("auth", "B"), ("auth", "A"), ("auth", "B"), ("store", None)]),
]


@pytest.mark.parametrize("start,steps", SHAPES)
def test_pipelined_requests_run_as_the_preceding_auth(server, two, start, steps):
    checked = 0
    for _ in range(5):
        results = run_sequence(server, two, start, steps)
        for (step, err, result, tag), who in zip(results, expected_identity(start, steps)):
            kind = step[0]
            if kind == "auth":
                assert err is None, err
                assert "tenant_id" in result
            elif kind == "auth_bad":
                assert err is not None and err["code"] == "unauthenticated"
            elif who is None:
                assert err is not None and err["code"] == "unauthenticated", (step, err)
            elif kind == "store":
                assert err is None, err
                assert owner_of(server, two, result["id"], tag) == who
            else:
                assert err is None, err
            checked += 1
    shape = " ".join(k if a is None else f"{k}({a})" for k, a in steps)
    print(f"\n[auth] start {start or 'none'}, one write of [{shape}]: 5 trials, {checked} answers "
          f"checked against the identity of the auth before them, misrouted 0")


def test_fifty_trials_switch_tenant_then_store(server, two):
    """The reported case: authenticated as A, [auth B, store] in one write lands in B."""
    ids = []
    with server.client(key=two["A"]) as c:
        for i in range(50):
            key = two["B"] if i % 2 == 0 else two["A"]
            c.send_raw(frame(1, "auth", {"api_key": key}) +
                       frame(2, "memory.store", store_params(f"trial{i}")))
            got = answers(c, {1, 2})
            assert got[1][0] is None and got[2][0] is None, got
            ids.append(("B" if i % 2 == 0 else "A", got[2][1]["id"], f"trial{i}"))
    for who, mid, tag in ids:
        assert owner_of(server, two, mid, tag) == who
    print(f"\n[auth] {len(ids)} trials of [auth other tenant, memory.store] in one write on an "
          f"authenticated connection: every store in the new tenant, misrouted 0")


def test_failed_reauth_drops_identity(server, two):
    with server.client(key=two["A"]) as c:
        assert c.call("memory.stats") is not None
        err = c.call_err("auth", api_key="egk_not-a-key")
        assert err["code"] == "unauthenticated"
        err = c.call_err("memory.stats")
        assert err["code"] == "unauthenticated"
        # the public methods still work, and a good key binds again
        assert c.call("ping") == "pong"
        assert "tenant_id" in c.call("auth", api_key=two["B"])
        c.call("memory.stats")


def test_failed_admin_reauth_drops_admin(server, two):
    with server.admin() as c:
        c.call("admin.tenant.list")
        assert c.call_err("auth", api_key="wrong")["code"] == "unauthenticated"
        assert c.call_err("admin.tenant.list")["code"] == "unauthenticated"


def test_auth_then_admin_pipelined(server, two):
    with server.client() as c:
        c.send_raw(frame(1, "auth", {"api_key": server.admin_key()}) +
                   frame(2, "admin.tenant.list") +
                   frame(3, "auth", {"api_key": two["A"]}) +
                   frame(4, "admin.tenant.list") + frame(5, "memory.stats"))
        got = answers(c, {1, 2, 3, 4, 5})
        assert got[1][0] is None and got[1][1] == {"admin": True}
        assert got[2][0] is None
        assert got[3][0] is None
        assert got[4][0]["code"] == "permission_denied"
        assert got[5][0] is None


@pytest.mark.parametrize("params", [
    {"api_key": ""},
    {"api_key": "x" * (1 << 20)},
    {"api_key": 12345},
    {"api_key": b"egk_binary"},
    {"api_key": None},
    {"api_key": ["egk_"]},
    {},
    {"api_key": "egk_short", "extra": 1},
])
def test_auth_errors_are_unauthenticated_with_one_message(server, two, params):
    with server.client(key=two["A"]) as c:
        err, _ = c.wait(c.send("auth", params))
        assert err is not None
        assert err["code"] == "unauthenticated"
        assert err["message"] == "invalid API key"
        # and the failure dropped the identity
        assert c.call_err("memory.stats")["code"] == "unauthenticated"
