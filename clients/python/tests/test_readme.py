"""The README's quick start works as written (pointed at the test server's port)."""
import os
import re
import subprocess
import sys

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_start_runs(server, tmp_path):
    readme = open(os.path.join(PKG, "README.md")).read()
    section = readme.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) == 5
    assert code.count("Client(api_key=") == 1
    code = code.replace("Client(api_key=", f"Client(port={server.port}, api_key=")
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "demo.key").write_text(server.tenant() + "\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": PKG})
    assert r.returncode == 0, r.stderr
    assert "The user prefers metric units" in r.stdout
