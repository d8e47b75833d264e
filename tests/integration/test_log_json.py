"""log_format = json: every line engramd writes is one JSON object with time, level, file,
line and message, through start-up, requests that succeed and fail, a reload and shutdown;
no API key appears in it; a reload to log_format = text switches the form at once."""
import json
import os
import re
import signal
import tempfile
import time

from harness import Server, new_database, wait_for

LEVELS = {"debug", "info", "warn", "error"}
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def check_json_line(line):
    rec = json.loads(line)
    assert isinstance(rec, dict), line
    assert set(rec) == {"time", "level", "file", "line", "message"}, line
    assert TIME.fullmatch(rec["time"]), line
    assert rec["level"] in LEVELS, line
    assert re.fullmatch(r"[\w.-]+\.(c|cc|h)", rec["file"]) and isinstance(rec["line"], int), line
    assert isinstance(rec["message"], str) and rec["message"], line
    return rec


def test_json_lines_then_text_after_reload():
    d = tempfile.mkdtemp(prefix="engram-logjson-")
    conf = os.path.join(d, "engramd.conf")
    with open(conf, "w") as f:
        f.write("log_format = json\n")
    srv = Server(new_database("logjson"), extra=["--config", conf])
    failed = True
    try:
        srv.start()
        tid, key = srv.create_tenant(tier="premium")
        with srv.client(key=key) as c:
            c.call("memory.store", content='a "quoted"\nline \\ with \x01 bytes',
                   type="fact", importance=0.5)
            c.call("memory.search", query="quoted", top_k=3)
            assert c.call_err("memory.search", query="x", top_k=0)["code"] == \
                "invalid_argument"
            assert c.call_err("no.such.method")["code"] == "unknown_method"
        with srv.client() as c:
            assert c.call_err("auth", api_key="ek_not_a_key")["code"] == "unauthenticated"
        # a reload that fails (an unknown setting) logs an error; one that works logs info
        with open(conf, "w") as f:
            f.write("log_format = json\nno_such_setting = 1\n")
        srv.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: '"level":"error"' in srv.log_text() and
                 "no_such_setting" in srv.log_text(), what="the failed reload logged")
        lines = [ln for ln in srv.log_text().splitlines() if ln.strip()]
        assert len(lines) >= 5, lines
        recs = [check_json_line(ln) for ln in lines]
        assert {"info", "error"} <= {r["level"] for r in recs}
        assert any("no_such_setting" in r["message"] for r in recs)
        # switching back to text takes effect at the reload
        n_json = len(lines)
        with open(conf, "w") as f:
            f.write("log_format = text\n")
        srv.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: len([ln for ln in srv.log_text().splitlines() if ln.strip()]) >
                 n_json and not srv.log_text().splitlines()[-1].startswith("{"),
                 what="a text line after the reload")
        srv.stop()
        text = srv.log_text()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        # JSON up to the reload's switch (its own "received SIGHUP" line included), text
        # from there to the end
        switch = next(i for i, ln in enumerate(lines) if not ln.startswith("{"))
        assert switch >= n_json
        for ln in lines[:switch]:
            check_json_line(ln)
        after = lines[switch:]
        assert all(re.match(TIME.pattern + r" (debug|info |warn |error) \S+:\d+ ", ln)
                   for ln in after), after
        assert any("engramd stopped" in ln for ln in after), after
        # keys are never logged, in either form
        for secret in (key, srv.admin_key(), "ek_not_a_key"):
            assert secret not in text
        failed = False
    finally:
        srv.finish(failed=failed)
