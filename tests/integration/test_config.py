"""engramd's settings: flags, ENGRAM_* variables, the config file, validation at start."""
import os
import subprocess
import tempfile

from harness import BIN, Server, new_database, require_env


def run(args, env=None, timeout=30):
    require_env()
    e = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") or k == "ENGRAM_BIN"}
    e.update(env or {})
    return subprocess.run([BIN] + args, capture_output=True, text=True, env=e, timeout=timeout)


def test_help_lists_every_setting_with_its_sources():
    r = run(["--help"])
    assert r.returncode == 0
    for needle in ["--rpc-port", "ENGRAM_RPC_PORT", "--pg-dsn", "ENGRAM_PG_DSN", "--workers",
                   "default '7420'", "1..65535", "--config"]:
        assert needle in r.stdout, needle


def test_out_of_range_flag_is_named():
    r = run(["--pg-dsn", "x", "--rpc-port", "70000"])
    assert r.returncode == 2
    assert "rpc_port" in r.stderr and "--rpc-port" in r.stderr and "1..65535" in r.stderr


def test_bad_environment_value_is_named():
    r = run(["--pg-dsn", "x"], env={"ENGRAM_WORKERS": "many"})
    assert r.returncode == 2
    assert "workers" in r.stderr and "ENGRAM_WORKERS" in r.stderr and "not an integer" in r.stderr


def test_missing_dsn_is_explained():
    r = run([])
    assert r.returncode == 2 and "pg_dsn is required" in r.stderr


def test_unknown_flag_and_file_key_are_rejected():
    r = run(["--pg-dsn", "x", "--rpc-prot", "1"])
    assert r.returncode == 2 and "unknown setting '--rpc-prot'" in r.stderr
    with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
        f.write("pg_dsn = x\nmax_top_kk = 5\n")
    try:
        r = run(["--config", f.name])
        assert r.returncode == 2 and "unknown setting 'max_top_kk'" in r.stderr and f.name in r.stderr
    finally:
        os.unlink(f.name)


def test_file_then_environment_then_flags():
    dsn = new_database("cfg")
    with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
        f.write(f"# comment\n[engram]\npg_dsn = {dsn}\nmax_top_k = 5\nworkers = 1\n")
    srv = Server(dsn, extra=["--config", f.name, "--max-top-k", "7"],
                 env={"ENGRAM_MAX_TOP_K": "6"})
    try:
        srv.start()
        _, key = srv.create_tenant()
        with srv.client(key=key) as c:
            c.call("memory.store", content="x", type="fact", importance=0.5)
            assert c.call("memory.search", query="x", top_k=7) is not None  # flag wins
            err = c.call_err("memory.search", query="x", top_k=8)
            assert err["code"] == "invalid_argument" and "between 1 and 7" in err["message"]
        srv.stop()
        # without the flag the environment wins over the file
        srv.extra = ["--config", f.name]
        srv.start()
        with srv.client(key=key) as c:
            assert c.call_err("memory.search", query="x", top_k=7)["code"] == "invalid_argument"
            assert c.call("memory.search", query="x", top_k=6) is not None
        srv.stop()
    finally:
        srv.cleanup()
        os.unlink(f.name)


def test_scoring_settings_change_the_composite():
    import math
    from harness import structured_vectors, vec_bin
    r = run(["--pg-dsn", "x", "--score-w-recency", "0.5"])
    assert r.returncode == 2 and "must be 1" in r.stderr
    dsn = new_database("score")
    srv = Server(dsn, extra=["--score-w-recency", "0.5", "--score-w-access", "0.1",
                             "--score-w-explicit", "0.4", "--score-recency-days", "10",
                             "--score-access-saturation", "4"])
    try:
        srv.start()
        _, key = srv.create_tenant()
        with srv.client(key=key) as c:
            import time
            now = int(time.time() * 1000)
            e = vec_bin(structured_vectors(1, 384, seed=2)[0])
            c.call("memory.store", content="x", type="fact", importance=0.25, embedding=e,
                   created_at=now - 5 * 86400000, access_count=2)
            got = c.call("memory.search", embedding=e, top_k=1)["results"][0]
            want = 0.5 * math.exp(-5 / 10) + 0.1 * min(2 / 4, 1) + 0.4 * 0.25
            assert abs(got["composite"] - want) < 1e-4
        srv.stop()
    finally:
        srv.cleanup()
