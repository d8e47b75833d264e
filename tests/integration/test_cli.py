"""The engram CLI against the real server: every command, --json, errors, export/import."""
import json
import os
import socket
import subprocess
import tempfile
import time

from harness import CLI, free_port, structured_vectors, vec_bin


def cli(server, *args, key=None, stdin=None, check=True):
    assert CLI and os.access(CLI, os.X_OK), "ENGRAM_CLI must name the engram binary"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    if key:
        env["ENGRAM_API_KEY"] = key
    r = subprocess.run([CLI, "--port", str(server.port)] + list(args), capture_output=True,
                       text=True, env=env, input=stdin, timeout=60)
    if check:
        assert r.returncode == 0, (args, r.returncode, r.stderr)
    return r


def test_everyday_commands(server, tenant):
    key = tenant[1]
    assert cli(server, "ping").stdout.strip() == "pong"
    r = cli(server, "--json", "store", "Never LP in pools with less than $100K TVL", "--type", "constraint",
            "--importance", "0.95", "--metadata", '{"tokens": ["ETH"]}', key=key)
    stored = json.loads(r.stdout)
    assert stored["id"] > 0 and len(r.stdout.strip().splitlines()) == 1
    r = cli(server, "store", "Morpho USDC vault APY is 2.3%", key=key)
    other = int(r.stdout.strip().lstrip("#").split()[0])
    r = cli(server, "--json", "search", "pool TVL", "--top-k", "1", key=key)
    hits = json.loads(r.stdout)["results"]
    assert hits[0]["id"] == stored["id"] and hits[0]["metadata"] == {"tokens": ["ETH"]}
    r = cli(server, "search", "pool TVL", key=key)
    assert "Never LP in pools" in r.stdout and "constraint" in r.stdout
    r = cli(server, "--json", "get", str(stored["id"]), str(other), key=key)
    assert [m["id"] for m in json.loads(r.stdout)["memories"]] == [stored["id"], other]
    r = cli(server, "get", str(stored["id"]), key=key)
    assert "Never LP in pools" in r.stdout
    r = cli(server, "--json", "delete", str(other), key=key)
    assert json.loads(r.stdout)["deleted"] == [other]
    r = cli(server, "--json", "call", "memory.stats", "{}", key=key)
    assert json.loads(r.stdout)["total"] == 1


def test_errors_and_usage(server, tenant):
    r = cli(server, "store", "x", check=False)  # no key at all
    assert r.returncode == 1 and "unauthenticated" in r.stderr
    r = cli(server, "store", "x", key="egk_aaaaaaaaaaaa_" + "b" * 40, check=False)
    assert r.returncode == 1 and "engram: unauthenticated: invalid API key" in r.stderr
    r = cli(server, "store", "x", "--importance", "7", key=tenant[1], check=False)
    assert r.returncode in (1, 2) and "importance" in r.stderr
    r = cli(server, "frobnicate", check=False)
    assert r.returncode == 2 and "usage" in r.stderr
    r = cli(server, "call", "memory.get", '{"ids": "nope"}', key=tenant[1], check=False)
    assert r.returncode == 1 and "invalid_argument" in r.stderr and "ids" in r.stderr
    # the key never appears in output
    assert tenant[1] not in r.stdout + r.stderr


def test_admin_tenant_create(server):
    r = cli(server, "--json", "admin", "tenant", "create", "cli-made", "--tier", "standard",
            key=server.admin_key())
    made = json.loads(r.stdout)
    assert made["tenant_id"] > 0 and made["api_key"].startswith("egk_")
    r = cli(server, "--json", "call", "auth", json.dumps({"api_key": made["api_key"]}))
    assert json.loads(r.stdout)["tier"] == "standard"
    r = cli(server, "admin", "tenant", "create", "cli-made", "--tier", "free", key=server.admin_key(),
            check=False)
    assert r.returncode == 1 and "already_exists" in r.stderr


def test_export_import_round_trip(server):
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    vecs = structured_vectors(30, 384, seed=90)
    with server.client(key=ka) as a:
        items = [{"content": f"memory {i} with \"quotes\" and \\ slashes \u00e9",
                  "type": ["fact", "episode", "constraint"][i % 3], "importance": i / 30,
                  "embedding": vec_bin(vecs[i]), "created_at": 1700000000000 + i * 1000,
                  "metadata": {"tokens": [f"T{i % 4}"], "attrs": {"i": i, "nested": {"x": [1, 2]}}},
                  "agent_id": i % 5 + 1, "scope": "agent" if i % 2 else "tenant",
                  "access_count": i, "last_accessed_at": 1700000500000 + i,
                  "pinned": i % 7 == 0} for i in range(30)]
        ids = a.call("memory.store_batch", memories=items)["ids"]
        a.call("memory.archive", ids=[ids[3]], reason="old news")
        src = {m["content"]: m for m in a.call("memory.list", limit=100, include_archived=True,
                                                include_embedding=True)["memories"]}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "export.jsonl")
        r = cli(server, "export", "--out", path, key=ka)
        assert "exported 30 memories" in r.stderr
        lines = open(path).read().splitlines()
        assert len(lines) == 30 and all(json.loads(x)["embedding"] for x in lines)
        r = cli(server, "import", path, key=kb)
        assert "imported 30 new memories, 0 already present" in r.stderr
        # running it again stores nothing twice
        r = cli(server, "import", path, key=kb)
        assert "imported 0 new memories, 30 already present" in r.stderr
    with server.client(key=kb) as b:
        got = b.call("memory.list", limit=100, include_archived=True, include_embedding=True)["memories"]
        assert len(got) == 30
        for m in got:
            s = src[m["content"]]
            for f in ("type", "importance", "metadata", "created_at", "updated_at", "access_count",
                      "last_accessed_at", "agent_id", "scope", "pinned", "embedding", "archived_reason"):
                if f == "updated_at" and s["archived_at"] is not None:
                    continue  # archiving again on import is a change of its own
                assert m[f] == s[f], (f, m[f], s[f])
            assert (m["archived_at"] is None) == (s["archived_at"] is None)
        # and the imported vectors are searchable
        res = b.call("memory.search", embedding=vec_bin(vecs[8]), top_k=1, similarity_weight=1.0)["results"]
        assert res[0]["content"].startswith("memory 8 ")


def export_lines(server, key, d):
    path = os.path.join(d, "export.jsonl")
    cli(server, "export", "--out", path, key=key)
    return path, open(path).read().splitlines()


def write_lines(d, name, lines):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_import_is_idempotent_per_content(server):
    """The README's lines in order: import, then import --embeddings drop of the same file,
    then the same memories in other batches, reordered, with new ones among them. Each run
    stores only what the tenant lacks and says how many were new and how many were there."""
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    with server.client(key=ka) as a:
        a.call("memory.store_batch", memories=[
            {"content": f"lesson {i}: keep slippage under {i} bps", "type": "strategy_outcome",
             "importance": 0.5, "agent_id": i % 3 + 1, "scope": "agent",
             "created_at": 1700000000000 + i} for i in range(12)])
        # the same content twice, as different memories (another agent, another time)
        a.call("memory.store", content="gas spikes at the top of the hour", type="fact",
               importance=0.4, created_at=1700000100000)
        a.call("memory.store", content="gas spikes at the top of the hour", type="fact",
               importance=0.4, created_at=1700000200000)
        a.call("memory.store", content="gas spikes at the top of the hour", type="fact",
               importance=0.4, agent_id=9, created_at=1700000100000)
        old = a.call("memory.store", content="the bridge is paused", type="fact", importance=0.3)
        a.call("memory.archive", ids=[old["id"]], reason="unpaused")
    with tempfile.TemporaryDirectory() as d:
        path, lines = export_lines(server, ka, d)
        assert len(lines) == 16
        r = cli(server, "import", path, key=kb)
        assert r.stderr.strip() == "imported 16 new memories, 0 already present"
        # without embeddings (it failed with an idempotency conflict) and with them again
        r = cli(server, "import", path, "--embeddings", "drop", key=kb)
        assert r.stderr.strip() == "imported 0 new memories, 16 already present"
        r = cli(server, "--json", "import", path, key=kb)
        assert json.loads(r.stdout) == {"imported": 0, "already_present": 16, "expired": 0}
        # other batches: reordered, a part of it, and two new memories among them (one
        # written by hand without created_at)
        new = [json.dumps({"content": "oracle lag doubled during the crash", "type": "episode",
                           "importance": 0.6, "created_at": 1700000300000}),
               json.dumps({"content": "never bridge on Fridays", "type": "constraint",
                           "importance": 0.9})]
        mixed = write_lines(d, "mixed.jsonl", lines[10:] + new[:1] + lines[:10][::-1] + new[1:])
        r = cli(server, "import", mixed, "--embeddings", "drop", key=kb)
        assert r.stderr.strip() == "imported 2 new memories, 16 already present"
        r = cli(server, "import", mixed, key=kb)
        assert r.stderr.strip() == "imported 0 new memories, 18 already present"
        r = cli(server, "import", write_lines(d, "part.jsonl", lines[3:5]), key=kb)
        assert r.stderr.strip() == "imported 0 new memories, 2 already present"
    with server.client(key=kb) as b:
        got = b.call("memory.list", limit=100, include_archived=True)["memories"]
    assert len(got) == 18
    assert sum(1 for m in got if m["content"] == "gas spikes at the top of the hour") == 3
    assert [m["archived_reason"] for m in got if m["content"] == "the bridge is paused"] == \
        ["unpaused"]


def test_import_counts_copies_and_follows_changes(server):
    """Equal lines are counted: a file holding a memory twice stores it twice, once. A
    memory changed since (importance, tags) is still the same memory; one deleted since is
    stored again."""
    _, kb = server.create_tenant()
    line = json.dumps({"content": "the vault pays weekly", "type": "fact", "importance": 0.5,
                       "created_at": 1700000000000, "metadata": {"tokens": ["USDC"]}})
    other = json.dumps({"content": "rebalance after 5% drift", "type": "strategy_outcome",
                        "importance": 0.7, "created_at": 1700000000001})
    with tempfile.TemporaryDirectory() as d:
        two = write_lines(d, "two.jsonl", [line, other, line])
        r = cli(server, "import", two, key=kb)
        assert r.stderr.strip() == "imported 3 new memories, 0 already present"
        r = cli(server, "import", two, key=kb)
        assert r.stderr.strip() == "imported 0 new memories, 3 already present"
        r = cli(server, "import", write_lines(d, "three.jsonl", [line, line, line]), key=kb)
        assert r.stderr.strip() == "imported 1 new memory, 2 already present"
        with server.client(key=kb) as b:
            mems = b.call("memory.list", limit=100)["memories"]
            vault = [m["id"] for m in mems if m["content"] == "the vault pays weekly"]
            drift = [m["id"] for m in mems if m["content"] != "the vault pays weekly"]
            assert len(vault) == 3 and len(drift) == 1
            b.call("memory.update", id=drift[0], importance=0.1, metadata={"tokens": ["ETH"]})
            b.call("memory.delete", ids=vault[:1])
        r = cli(server, "import", two, key=kb)
        assert r.stderr.strip() == "imported 0 new memories, 3 already present"
        r = cli(server, "import", write_lines(d, "three.jsonl", [line, line, line, other]),
                key=kb)
        assert r.stderr.strip() == "imported 1 new memory, 3 already present"
    with server.client(key=kb) as b:
        assert b.call("memory.stats")["total"] == 4


def test_import_can_reembed_into_another_dimension(server):
    _, ka = server.create_tenant()
    with server.admin() as adm:
        kb = adm.call("admin.tenant.create", name="dim64", tier="premium", embedding={"dim": 64})["api_key"]
    with server.client(key=ka) as a:
        a.call("memory.store", content="the oracle lagged during the crash", type="episode", importance=0.4)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "e.jsonl")
        cli(server, "export", "--out", path, key=ka)
        r = cli(server, "import", path, key=kb, check=False)
        assert r.returncode == 1 and "dimension" in r.stderr
        cli(server, "import", path, "--embeddings", "drop", key=kb)
    with server.client(key=kb) as b:
        res = b.call("memory.search", query="oracle crash", top_k=1)["results"]
        assert res[0]["content"] == "the oracle lagged during the crash"


def test_admin_commands(server):
    adm = server.admin_key()
    made = json.loads(cli(server, "--json", "admin", "tenant", "create", "cli-admin", "--tier", "free",
                          key=adm).stdout)
    tid = made["tenant_id"]
    r = cli(server, "admin", "tenant", "list", "--limit", "1000", key=adm)
    assert "cli-admin" in r.stdout and "free" in r.stdout
    got = json.loads(cli(server, "--json", "admin", "tenant", "get", "cli-admin", key=adm).stdout)
    assert got["tenant_id"] == tid and got["tier"] == "free"
    up = json.loads(cli(server, "--json", "admin", "tenant", "update", str(tid), "--tier", "standard",
                        "--name", "cli-admin-2", key=adm).stdout)
    assert up["tier"] == "standard" and up["name"] == "cli-admin-2"
    k2 = json.loads(cli(server, "--json", "admin", "key", "create", "cli-admin-2", "robot", key=adm).stdout)
    assert k2["api_key"].startswith("egk_")
    r = cli(server, "admin", "key", "create", "cli-admin-2", "robot2", key=adm)
    assert "shown only once" in r.stdout
    keys = json.loads(cli(server, "--json", "admin", "key", "list", str(tid), key=adm).stdout)["keys"]
    assert [k["name"] for k in keys] == ["default", "robot", "robot2"]
    usage = json.loads(cli(server, "--json", "usage", key=k2["api_key"]).stdout)
    assert usage["tier"] == "standard" and usage["memories"]["stored"] == 0
    cli(server, "admin", "key", "revoke", str(k2["key_id"]), key=adm)
    r = cli(server, "usage", key=k2["api_key"], check=False)
    assert r.returncode == 1 and "unauthenticated" in r.stderr
    cli(server, "admin", "tenant", "delete", "cli-admin-2", key=adm)
    r = cli(server, "admin", "tenant", "get", str(tid), key=adm, check=False)
    assert r.returncode == 1 and "not_found" in r.stderr


# ---- the environment every Engram tool reads, and a server that is not there -----------------


def cli_env(args, env, timeout=60):
    """Runs the CLI with exactly env (plus PATH), no --port: where to connect comes from env."""
    assert CLI and os.access(CLI, os.X_OK), "ENGRAM_CLI must name the engram binary"
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    return subprocess.run([CLI] + list(args), capture_output=True, text=True, env=e,
                          timeout=timeout)


def test_engram_url_and_api_key_file(server, tenant):
    key = tenant[1]
    with tempfile.TemporaryDirectory() as d:
        kf = os.path.join(d, "tenant.key")
        with open(kf, "w") as f:
            f.write(key + "\n")
        url = f"engram://127.0.0.1:{server.port}"
        r = cli_env(["--json", "call", "tenant.usage", "{}"],
                    {"ENGRAM_URL": url, "ENGRAM_API_KEY_FILE": kf})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tenant_id"] == tenant[0]
        # the old name of the key file still works; ENGRAM_API_KEY_FILE wins over it
        r = cli_env(["store", "kept via the old name"], {"ENGRAM_URL": url, "ENGRAM_KEY_FILE": kf})
        assert r.returncode == 0, r.stderr
        r = cli_env(["search", "old name"], {"ENGRAM_URL": url, "ENGRAM_API_KEY_FILE": kf,
                                             "ENGRAM_KEY_FILE": "/nonexistent"})
        assert r.returncode == 0, r.stderr
        # ENGRAM_URL wins over ENGRAM_HOST/ENGRAM_PORT, which still work without it
        dead = str(free_port())
        r = cli_env(["ping"], {"ENGRAM_URL": url, "ENGRAM_PORT": dead})
        assert r.returncode == 0 and r.stdout.strip() == "pong", r.stderr
        r = cli_env(["ping"], {"ENGRAM_HOST": "127.0.0.1", "ENGRAM_PORT": str(server.port)})
        assert r.returncode == 0 and r.stdout.strip() == "pong", r.stderr
        # flags win over the environment
        r = cli_env(["--url", f"tcp://127.0.0.1:{server.port}", "ping"],
                    {"ENGRAM_URL": f"engram://127.0.0.1:{dead}"})
        assert r.returncode == 0, r.stderr
        r = cli_env(["--port", str(server.port), "ping"], {"ENGRAM_URL": f"engram://127.0.0.1:{dead}"})
        assert r.returncode == 0, r.stderr
        r = cli_env(["--url", f"[::1]:{dead}", "--host", "x", "ping"], {})
        assert r.returncode == 2 and "not both" in r.stderr
        # URLs it cannot use are usage errors naming where they came from, never echoed
        r = cli_env(["ping"], {"ENGRAM_URL": f"http://127.0.0.1:{server.port}"})
        assert r.returncode == 2 and "ENGRAM_URL: http:// names engramd's HTTP/JSON port" in r.stderr
        r = cli_env(["ping"], {"ENGRAM_URL": "engram://user:hunter2@127.0.0.1:7420"})
        assert r.returncode == 2 and "credentials" in r.stderr and "hunter2" not in r.stderr
        r = cli_env(["--url", "gopher://x", "ping"], {})
        assert r.returncode == 2 and "--url: unknown scheme 'gopher'" in r.stderr
        assert key not in r.stdout + r.stderr


def blackhole():
    """A listener that never accepts, its queue full: connects to it get no answer."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(ls.getsockname())
        except BlockingIOError:
            pass
        fill.append(s)
    time.sleep(0.1)
    return ls, fill


def test_connect_gives_up_after_a_second():
    """Refused: at once (as before). Unanswered: after --connect-timeout-ms, 1 s by default
    (before: the whole --timeout-ms, 30 s)."""
    t = time.monotonic()
    r = cli_env(["--url", f"engram://127.0.0.1:{free_port()}", "ping"], {})
    took = time.monotonic() - t
    print(f"engram CLI, refused port: failed after {took:.2f} s")
    assert r.returncode == 1 and "connect_failed" in r.stderr and took < 3
    ls, fill = blackhole()
    try:
        t = time.monotonic()
        r = cli_env(["--port", str(ls.getsockname()[1]), "ping"], {})
        took = time.monotonic() - t
        print(f"engram CLI, unanswered connect: failed after {took:.2f} s")
        assert r.returncode == 1 and "timeout" in r.stderr and "--connect-timeout-ms" in r.stderr
        assert took < 3
        r = cli_env(["--port", str(ls.getsockname()[1]), "--connect-timeout-ms", "200", "ping"], {})
        assert r.returncode == 1 and "in 200 ms" in r.stderr
    finally:
        for s in fill:
            s.close()
        ls.close()
