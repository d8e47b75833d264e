"""`redocly lint` (@redocly/cli pinned in tools/redocly, its recommended rules) finds no
error in the /v1/openapi.json a live engramd serves."""
import os
import subprocess

LINT = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "redocly", "lint")


def test_redocly_lint_has_no_error(server, tmp_path):
    status, body = server.http_get("/v1/openapi.json")
    assert status == 200
    path = tmp_path / "openapi.json"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    r = subprocess.run([LINT, str(path)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Your API description is valid" in out, out
    assert " error " not in out, out
