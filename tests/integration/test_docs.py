"""docs/protocol.md describes what the server does: every method and parameter the server's
method table has is documented, and the worked example's bytes are what the server sends."""
import os
import re
import socket

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "protocol.md")


def sections():
    text = open(DOC, encoding="utf-8").read()
    parts = re.split(r"^### `([^`]+)`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}, text


def test_every_method_and_parameter_is_documented(server):
    docs, _ = sections()
    with server.client() as c:
        methods = c.call("methods")
    assert methods, "the server lists no methods"
    missing = []
    for m in methods:
        body = docs.get(m["name"])
        if body is None:
            missing.append(m["name"])
            continue
        for p in m["params"]:
            if f"`{p['name']}`" not in body:
                missing.append(f"{m['name']}.{p['name']}")
    assert not missing, f"undocumented in docs/protocol.md: {missing}"
    # and nothing documented that the server does not have
    names = {m["name"] for m in methods}
    assert set(docs) <= names, f"documented but unknown to the server: {set(docs) - names}"


def hex_lines(block, arrow):
    out = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(arrow):
            data = line[1:].split()
            i += 1
            while i < len(lines) and re.match(r"^\s+[0-9a-f]{2}(\s|$)", lines[i]):
                data += lines[i].split()
                i += 1
            out.append(bytes.fromhex("".join(data)))
            continue
        i += 1
    return out


def test_worked_example_bytes(server):
    _, text = sections()
    block = text.split("## A worked example, in bytes", 1)[1].split("```")[1]
    sent = hex_lines(block, "→")
    want = hex_lines(block, "←")
    assert len(sent) == len(want) == 2
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        for req, resp in zip(sent, want):
            s.sendall(req)
            got = b""
            while len(got) < len(resp):
                chunk = s.recv(4096)
                assert chunk, "connection closed"
                got += chunk
            assert got == resp, f"server sent {got.hex(' ')}, the document says {resp.hex(' ')}"
    finally:
        s.close()


def test_every_setting_is_in_the_configuration_doc():
    import subprocess
    from harness import BIN, require_env
    require_env()
    out = subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=30).stdout
    settings = [m.group(1).replace("-", "_") for m in re.finditer(r"^  --([a-z0-9-]+)\s", out, re.M)]
    settings = [s for s in settings if s not in ("config", "check_config")]
    assert len(settings) > 10
    # README links to docs/configuration.md, which is generated from the settings table
    # (test_config_reference checks it is exactly what the code generates)
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "configuration.md"),
               encoding="utf-8").read()
    missing = [s for s in settings if f"`{s}`" not in doc]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"
