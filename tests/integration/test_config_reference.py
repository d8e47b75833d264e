"""The configuration reference never drifts from the settings table: docs/configuration.md
and deploy/engramd.conf are what `engramd --print-config` generates, and the reference
file reads back, with --config, to exactly the defaults."""
import difflib
import os
import re
import subprocess
import tempfile

from harness import BIN, require_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(args, env=None):
    require_env()
    e = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    e.update(env or {})
    return subprocess.run([BIN] + args, capture_output=True, text=True, env=e, timeout=60)


def generated(fmt):
    r = run([f"--print-config={fmt}"])
    assert r.returncode == 0, r.stderr
    return r.stdout


def check_same(path, fmt):
    with open(os.path.join(ROOT, path)) as f:
        have = f.read()
    want = generated(fmt)
    if have != want:
        diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                            path, f"engramd --print-config={fmt}"))
        raise AssertionError(f"{path} differs from what the code generates; run "
                             f"deploy/gen-config-docs.sh and commit the result:\n{diff[:6000]}")


def effective(extra, env=None):
    """The effective settings engramd --check-config prints, as a dict."""
    r = run(extra + ["--check-config"], env={"ENGRAM_PG_DSN": "dbname=x", **(env or {})})
    assert r.returncode == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines():
        k, _, v = line.partition(" = ")
        out[k] = v
    return out


def test_configuration_md_is_generated_from_the_table():
    check_same("docs/configuration.md", "markdown")


def test_engramd_conf_is_generated_from_the_table():
    check_same("deploy/engramd.conf", "ini")
    assert generated("ini") == run(["--print-config"]).stdout  # ini is the default format


def test_every_setting_is_in_the_reference_with_its_sources():
    defaults = effective([])
    assert len(defaults) > 100
    md = generated("markdown")
    ini = generated("ini")
    for name in defaults:
        env = "ENGRAM_" + name.upper()
        flag = "--" + name.replace("_", "-")
        assert f"| `{name}` |" in md and f"`{env}` `{flag}`" in md, name
        assert re.search(rf"^#{name} = ", ini, re.M), name
        assert f"{env}, {flag};" in ini, name
    # which settings SIGHUP reloads is stated for each one
    row = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", md, re.M)}
    for name in ["log_level", "maintenance_interval_s", "premium_rate_per_s",
                 "free_max_memories", "standard_session_retention_days"]:
        assert "| SIGHUP |" in row[name], name
    for name in ["rpc_port", "pg_dsn", "workers", "index_memory_mb", "max_top_k"]:
        assert "| restart |" in row[name], name
    assert "file re-read on SIGHUP" in row["tls_cert_file"]
    assert "secret" in row["pg_dsn"]


def test_reference_reads_back_to_the_defaults():
    defaults = effective([])
    ref = generated("ini")
    with tempfile.TemporaryDirectory() as d:
        # as shipped: everything commented out
        path = os.path.join(d, "engramd.conf")
        with open(path, "w") as f:
            f.write(ref)
        assert effective(["--config", path]) == defaults
        # every setting uncommented: each documented default parses to the default
        active = re.sub(r"^#(\w+ = )", r"\1", ref, flags=re.M)
        n = len(re.findall(r"^\w+ = ", active, re.M))
        assert n == len(defaults), (n, len(defaults))
        path2 = os.path.join(d, "active.conf")
        with open(path2, "w") as f:
            # pg_dsn's default is empty (and required): the environment supplies it
            f.write(active)
        assert effective(["--config", path2]) == defaults
        # and the file is really read: a changed value shows
        with open(path2, "w") as f:
            f.write(active.replace("\nmax_top_k = 1000\n", "\nmax_top_k = 17\n"))
        assert effective(["--config", path2])["max_top_k"] == "17"


def test_check_config_names_a_bad_value_and_print_config_a_bad_format():
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
        f.write("[engramd]\nworkers = lots\n")
    try:
        r = run(["--config", f.name, "--check-config"], env={"ENGRAM_PG_DSN": "x"})
        assert r.returncode == 2 and "workers" in r.stderr and f.name in r.stderr
    finally:
        os.unlink(f.name)
    r = run(["--print-config=yaml"])
    assert r.returncode == 2 and "=ini or =markdown" in r.stderr
