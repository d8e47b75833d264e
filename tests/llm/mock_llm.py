#!/usr/bin/env python3
"""tests/llm/mock_llm.py: a scripted model server for tests, on loopback, standard library only.

It speaks Anthropic's Messages API (POST /v1/messages) and the OpenAI chat completions API
(POST /v1/chat/completions, also /chat/completions) with their real request checks,
answer shapes and error shapes, so that a client that works against it works against the
providers. Answers are chosen by a script: an ordered list of rules, the first whose
`match` is found in the request's text (system prompt and every message) answers it.

A rule (JSON):
    {"name": "facts",                   # names the rule in /_calls (default: its index)
     "match": "extract facts",          # a substring, or {"regex": "..."}; absent: any
     "api": "anthropic",                # only requests of that API (default: both)
     "reply": {"text": "..."}           # a text answer
           or {"json": {...}}           # a structured answer: Anthropic's tool_use input
                                        # (text when the request has no tool), OpenAI's
                                        # message content
           or {"echo": true},           # the last user message, as text
           or {"summarize": {"prefix": "S", "field": "summary"}},  # a structured answer
                                        # {field: "S of entries 1,2 (roles user,tool)"}: the
                                        # ids and roles of the JSON lines between
                                        # <transcript> and </transcript> (auto-compact)
     "usage": {"input_tokens": 10, "output_tokens": 3},  # default: about len/4 of each
     "delay_ms": 0,                     # every answer of the rule waits this long
     "hold": true,                      # every answer of the rule waits for POST /_release
                                        # (at most 600 s; a new script holds again)
     "fault": {...}}                    # see below

A fault applies to every request the rule answers, or with "fail_n": N to its first N
requests only (then the rule answers normally: "fail twice, then succeed"):
    {"slow_ms": N}                      wait N ms before answering (past a client's timeout)
    {"status": 429, "retry_after": 1}   an error answer in the API's error shape; optional
                                        "retry_after" (seconds, as sent), "retry_after_date"
                                        (seconds ahead, sent as an HTTP date),
                                        "retry_after_ms" (OpenAI's retry-after-ms header),
                                        "error_type", "error_code", "message", "quota": true
                                        (Anthropic's spend limit / OpenAI's
                                        insufficient_quota)
    {"drop": true}                      read the request, close the connection, no answer
    {"partial": true}                   headers and half the body, then close
    {"malformed": true}                 a 200 whose body is not JSON
    {"schema_break": true}              a 200 whose structured answer breaks the requested
                                        schema (a required property removed, or a list
                                        where an object is due)
    {"truncated": true}                 the output token limit: Anthropic stop_reason
                                        "max_tokens", OpenAI finish_reason "length", the
                                        answer cut in half
    {"refusal": true}                   Anthropic stop_reason "refusal"; OpenAI
                                        message.refusal
    {"echo_key": true}                  a 400 whose message quotes the API key it got (to
                                        check that a client never repeats it); "type": in
                                        the error's type too

Control endpoints (no key needed; on the API port and on the control port, which is
plain HTTP on 127.0.0.1 whatever --host and TLS say):
    POST /_script {"rules": [...]}      replace the rules (counters restart)
    GET  /_calls                        {"calls": [...], "max_inflight": n}: per request its
                                        api, path, rule, fault, t (monotonic seconds at
                                        arrival), t_end, inflight (counting itself), auth
                                        ("ok", "missing", "wrong"), headers (without the
                                        key), body (parsed) and error (why the mock refused it)
    POST /_reset                        forget calls and counters (rules stay)
    POST /_release                      let the answers of rules with "hold" go

Usage: mock_llm.py [--host 127.0.0.1|::1] [--port 0] [--rules FILE] [--tls-cert PEM --tls-key PEM]
The API key expected is $MOCK_LLM_KEY (default "sk-mock-key"). The first line printed is
"PORT <api port> CONTROL <control port>"; the server runs until stdin closes or SIGTERM.
"""
import argparse
import email.utils
import json
import os
import re
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                    413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                    503: "api_error", 529: "overloaded_error"}
OPENAI_ERRORS = {400: ("invalid_request_error", None), 401: ("invalid_request_error",
                 "invalid_api_key"), 403: ("invalid_request_error", None),
                 404: ("invalid_request_error", "model_not_found"),
                 429: ("requests", "rate_limit_exceeded"), 500: ("server_error", None),
                 503: ("server_error", None)}


class State:
    def __init__(self, key):
        self.key = key
        self.lock = threading.Lock()
        self.rules = []
        self.hits = {}
        self.calls = []
        self.inflight = 0  # requests of the current epoch being answered
        self.max_inflight = 0
        self.epoch = 0  # a reset starts a new one: requests still running from before
        self.seq = 0    # (a slow answer its client gave up on) no longer count
        self.released = threading.Event()  # rules with "hold" wait for it (POST /_release)

    def load(self, rules):
        for i, r in enumerate(rules):
            if not isinstance(r, dict):
                raise ValueError(f"rule {i} is not an object")
            m = r.get("match")
            if isinstance(m, dict):
                re.compile(m["regex"])
            elif m is not None and not isinstance(m, str):
                raise ValueError(f"rule {i}: match must be a string or {{\"regex\": ...}}")
        with self.lock:
            self.rules = [dict(r, name=r.get("name", str(i))) for i, r in enumerate(rules)]
            self.hits = {}
            self.released.clear()

    def reset(self):
        with self.lock:
            self.calls = []
            self.hits = {}
            self.inflight = 0
            self.max_inflight = 0
            self.epoch += 1


def prompt_text(api, body):
    """The request's text that rules match: the system prompt and every message."""
    parts = []

    def add(content):
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for blk in content:
                if isinstance(blk, dict) and isinstance(blk.get("text"), str):
                    parts.append(blk["text"])

    if api == "anthropic":
        add(body.get("system"))
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            add(m.get("content"))
    return "\n".join(parts)


def last_user(body):
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):
                return "".join(b.get("text", "") for b in c if isinstance(b, dict))
    return ""


def summarize(spec, text):
    """A structured summary of the transcript a request carries (auto-compact's prompt: JSON
    lines {"id": N, "role": ..., "text": ...} between <transcript> and </transcript>):
    {field: "<prefix> of entries 1,2,3 (roles user,assistant,tool)"}, so a test can check
    which entries were summarized."""
    m = re.search(r"<transcript>\n(.*?)\n</transcript>", text, re.S)
    ids, roles = [], []
    for line in (m.group(1).splitlines() if m else []):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        ids.append(str(e.get("id")))
        roles.append(str(e.get("role")))
    return {spec.get("field", "summary"):
            "%s of entries %s (roles %s)" % (spec.get("prefix", "Summary"), ",".join(ids),
                                             ",".join(roles))}


def check_anthropic(h, body):
    """Returns (status, message) for a request the real API refuses, else None."""
    if not h.get("anthropic-version"):
        return 400, "anthropic-version: header is required"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return 400, "model: Field required"
    mt = body.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        return 400, "max_tokens: Field required"
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return 400, "messages: at least one message is required"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            return 400, f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if not isinstance(m.get("content"), (str, list)):
            return 400, f"messages.{i}.content: Field required"
    if msgs[0].get("role") != "user":
        return 400, "messages: first message must use the \"user\" role"
    if "system" in body and not isinstance(body["system"], (str, list)):
        return 400, "system: Input should be a valid string"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            return 400, "tools: Input should be a valid list"
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}",
                                                           str(t.get("name", ""))):
                return 400, f"tools.{i}.name: String should match pattern"
            sch = t.get("input_schema")
            if not isinstance(sch, dict) or sch.get("type") != "object":
                return 400, f"tools.{i}.input_schema.type: Input should be 'object'"
    tc = body.get("tool_choice")
    if tc is not None:
        if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
            return 400, "tool_choice: Input tag does not match any of the expected tags"
        if tc["type"] == "tool" and tc.get("name") not in [t.get("name") for t in tools or []]:
            return 400, "tool_choice: Tool does not exist"
    return None


def check_openai(body):
    if not isinstance(body.get("model"), str) or not body["model"]:
        return 400, "you must provide a model parameter"
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return 400, "'messages' must contain at least one message"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user",
                                                             "assistant", "tool"):
            return 400, f"Invalid value for 'messages[{i}].role'"
        if m.get("content") is None or not isinstance(m["content"], (str, list)):
            return 400, f"Invalid type for 'messages[{i}].content'"
    for f in ("max_tokens", "max_completion_tokens"):
        if f in body and (not isinstance(body[f], int) or isinstance(body[f], bool)
                          or body[f] < 1):
            return 400, f"Invalid '{f}': must be a positive integer"
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object",
                                                              "json_schema"):
            return 400, "Invalid value for 'response_format.type'"
        if rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}",
                                                            str(js.get("name", ""))):
                return 400, "Invalid 'response_format.json_schema.name'"
            if not isinstance(js.get("schema"), dict):
                return 400, "Missing required parameter: 'response_format.json_schema.schema'"
    return None


def requested_schema(api, body):
    """(name, schema) of the structure the request asks for, or (None, None)."""
    if api == "anthropic":
        tc = body.get("tool_choice") or {}
        for t in body.get("tools") or []:
            if tc.get("type") == "tool" and t.get("name") == tc.get("name"):
                return t["name"], t.get("input_schema")
        return None, None
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        return rf["json_schema"]["name"], rf["json_schema"].get("schema")
    return None, None


def break_value(value, schema):
    """A value that breaks schema: drop a required property, else a list for an object."""
    if isinstance(value, dict) and isinstance(schema, dict) and schema.get("required"):
        v = dict(value)
        v.pop(schema["required"][0], None)
        return v
    return ["mock", "schema", "break"]


def make_handler(st):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "mock-llm/1"

        def log_message(self, *a):
            pass

        # ---- plumbing

        def send_json(self, status, obj, headers=None, raw=None):
            data = raw if raw is not None else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def read_body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def do_GET(self):
            if self.path == "/_calls":
                with st.lock:
                    out = {"calls": list(st.calls), "max_inflight": st.max_inflight}
                self.send_json(200, out)
            elif self.path == "/_health":
                self.send_json(200, {"ok": True})
            else:
                self.send_json(404, {"error": {"type": "not_found_error",
                                               "message": "no such endpoint"}})

        def do_POST(self):
            raw = self.read_body()
            path = urllib.parse.urlsplit(self.path).path
            if path == "/_script":
                try:
                    st.load(json.loads(raw)["rules"])
                except (ValueError, KeyError, TypeError, re.error) as e:
                    self.send_json(400, {"error": str(e)})
                    return
                self.send_json(200, {"ok": True})
            elif path == "/_reset":
                st.reset()
                self.send_json(200, {"ok": True})
            elif path == "/_release":
                st.released.set()
                self.send_json(200, {"ok": True})
            elif path == "/v1/messages" and not self.server.control_only:
                self.model_call("anthropic", raw)
            elif path in ("/v1/chat/completions", "/chat/completions") \
                    and not self.server.control_only:
                self.model_call("openai", raw)
            else:
                self.send_json(404, {"error": {"type": "not_found_error",
                                               "message": f"no endpoint {self.path}"}})

        # ---- a model call

        def model_call(self, api, raw):
            t = time.monotonic()
            with st.lock:
                st.seq += 1
                seq = st.seq
                epoch = st.epoch
                st.inflight += 1
                st.max_inflight = max(st.max_inflight, st.inflight)
                rec = {"seq": seq, "api": api, "path": self.path, "t": t, "t_end": None,
                       "inflight": st.inflight, "rule": None, "fault": None, "error": None}
                st.calls.append(rec)
            done = [False]

            def leave():
                # before the last byte goes out: a client cannot start its next request
                # before this one's answer ends, so max_inflight never counts a finished one
                if not done[0]:
                    done[0] = True
                    with st.lock:
                        if st.epoch == epoch:
                            st.inflight -= 1
                        rec["t_end"] = time.monotonic()

            try:
                self.answer(api, raw, rec, seq, leave)
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
                self.close_connection = True
            finally:
                leave()

        def auth(self, api):
            h = self.headers
            if api == "anthropic":
                got = h.get("x-api-key")
            else:
                a = h.get("Authorization") or ""
                got = a[7:] if a.startswith("Bearer ") else None
            if got is None:
                return "missing", None
            return ("ok" if got == st.key else "wrong"), got

        def error(self, api, status, message, leave, etype=None, code=None, headers=None):
            if api == "anthropic":
                body = {"type": "error", "error": {"type": etype or ANTHROPIC_ERRORS.get(
                    status, "api_error"), "message": message},
                    "request_id": "req_mock"}
            else:
                t, c = OPENAI_ERRORS.get(status, ("server_error", None))
                body = {"error": {"message": message, "type": etype or t, "param": None,
                                  "code": code if code is not None else c}}
            leave()
            self.send_json(status, body, headers)

        def answer(self, api, raw, rec, seq, leave):
            hdrs = {k.lower(): v for k, v in self.headers.items()
                    if k.lower() not in ("x-api-key", "authorization")}
            rec["headers"] = hdrs
            auth, presented = self.auth(api)
            rec["auth"] = auth
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError:
                rec["error"] = "body is not JSON"
                self.error(api, 400, "The request body is not valid JSON", leave)
                return
            rec["body"] = body
            if auth != "ok":
                rec["error"] = "auth " + auth
                if api == "anthropic":
                    self.error(api, 401, "invalid x-api-key", leave)
                else:
                    shown = (presented or "")[:3] + "***" + (presented or "")[-4:]
                    self.error(api, 401, f"Incorrect API key provided: {shown}. You can find "
                               "your API key at https://platform.openai.com/account/api-keys.",
                               leave)
                return
            bad = check_anthropic(self.headers, body) if api == "anthropic" else check_openai(body)
            if bad:
                rec["error"] = bad[1]
                self.error(api, bad[0], bad[1], leave)
                return
            text = prompt_text(api, body)
            rule = None
            with st.lock:
                for r in st.rules:
                    if r.get("api") not in (None, api):
                        continue
                    m = r.get("match")
                    if m is None or (isinstance(m, str) and m in text) or \
                            (isinstance(m, dict) and re.search(m["regex"], text)):
                        rule = r
                        break
                if rule:
                    n = st.hits.get(rule["name"], 0)
                    st.hits[rule["name"]] = n + 1
            if not rule:
                rec["error"] = "no rule matches"
                self.error(api, 400, "mock_llm: no rule matches this request", leave)
                return
            rec["rule"] = rule["name"]
            fault = rule.get("fault") or {}
            if "fail_n" in fault and n >= int(fault["fail_n"]):
                fault = {}
            rec["fault"] = next((k for k in ("status", "drop", "partial", "malformed",
                                             "schema_break", "truncated", "refusal",
                                             "echo_key", "slow_ms") if k in fault), None)
            if rule.get("delay_ms"):
                time.sleep(rule["delay_ms"] / 1000)
            if rule.get("hold"):
                st.released.wait(600)
            if fault.get("slow_ms"):
                time.sleep(fault["slow_ms"] / 1000)
            if fault.get("drop"):
                leave()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if fault.get("echo_key"):
                # in the message, and (a provider could) in the error's type
                self.error(api, 400, f"The key {presented} cannot use model {body['model']}",
                           leave, etype=f"key_{presented}" if fault["echo_key"] == "type"
                           else None)
                return
            if "status" in fault:
                status = int(fault["status"])
                headers = {}
                if "retry_after" in fault:
                    headers["retry-after"] = str(fault["retry_after"])
                if "retry_after_date" in fault:
                    headers["retry-after"] = email.utils.formatdate(
                        time.time() + float(fault["retry_after_date"]), usegmt=True)
                if "retry_after_ms" in fault:
                    headers["retry-after-ms"] = str(fault["retry_after_ms"])
                etype, code = fault.get("error_type"), fault.get("error_code")
                msg = fault.get("message", f"mock fault: HTTP {status}")
                if fault.get("quota"):
                    if api == "anthropic":
                        body_ = {"type": "error", "error": {
                            "type": "rate_limit_error", "message": "spend limit reached",
                            "details": {"error_code": "enforced_spend_limit_reached"}}}
                        leave()
                        self.send_json(status, body_, headers)
                        return
                    etype, code = "insufficient_quota", "insufficient_quota"
                self.error(api, status, msg, leave, etype, code, headers)
                return
            self.success(api, body, rule, fault, text, seq, leave)

        def success(self, api, body, rule, fault, text, seq, leave):
            reply = rule.get("reply") or {"text": ""}
            name, schema = requested_schema(api, body)
            value = reply.get("json")
            if reply.get("summarize") is not None:
                value = summarize(reply["summarize"], last_user(body))
            if fault.get("schema_break"):
                value = break_value(value, schema)
            if reply.get("echo"):
                out_text = last_user(body)
            elif value is not None and name is None:
                out_text = json.dumps(value)  # no tool asked for: the JSON as text
            elif value is not None:
                out_text = json.dumps(value)
            else:
                out_text = str(reply.get("text", ""))
            usage = rule.get("usage") or {}
            tin = int(usage.get("input_tokens", max(1, len(text) // 4)))
            tout = int(usage.get("output_tokens", max(1, len(out_text) // 4)))
            truncated = bool(fault.get("truncated"))
            if truncated:
                out_text = out_text[:len(out_text) // 2]
                tout = int(body.get("max_tokens") or body.get("max_completion_tokens") or tout)
            refusal = bool(fault.get("refusal"))
            if api == "anthropic":
                if refusal:
                    content, stop = [], "refusal"
                elif name is not None and value is not None:
                    inp = {} if truncated else value
                    content = [{"type": "tool_use", "id": f"toolu_mock{seq:06d}", "name": name,
                                "input": inp}]
                    stop = "max_tokens" if truncated else "tool_use"
                else:
                    content = [{"type": "text", "text": out_text}]
                    stop = "max_tokens" if truncated else "end_turn"
                resp = {"id": f"msg_mock{seq:06d}", "type": "message", "role": "assistant",
                        "model": body["model"], "content": content, "stop_reason": stop,
                        "stop_sequence": None,
                        "usage": {"input_tokens": tin, "output_tokens": tout,
                                  "cache_creation_input_tokens": 0,
                                  "cache_read_input_tokens": 0}}
            else:
                msg = {"role": "assistant", "content": out_text, "refusal": None}
                finish = "length" if truncated else "stop"
                if refusal:
                    msg["content"] = None
                    msg["refusal"] = "I'm sorry, I can't help with that."
                resp = {"id": f"chatcmpl-mock{seq:06d}", "object": "chat.completion",
                        "created": int(time.time()), "model": body["model"],
                        "system_fingerprint": "fp_mock",
                        "choices": [{"index": 0, "message": msg, "logprobs": None,
                                     "finish_reason": finish}],
                        "usage": {"prompt_tokens": tin, "completion_tokens": tout,
                                  "total_tokens": tin + tout}}
            data = json.dumps(resp).encode()
            if fault.get("malformed"):
                data = data[: len(data) // 2]  # a 200 whose JSON stops halfway
            if fault.get("partial"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                leave()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            leave()
            self.send_json(200, None, raw=data)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, tls=None, control_only=False):
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)
        self.tls = tls
        self.control_only = control_only

    def finish_request(self, request, client_address):
        # the TLS handshake runs here, in the connection's own thread, so that a client
        # that never finishes it (or refuses the certificate) holds up nobody else
        if not self.tls:
            self.RequestHandlerClass(request, client_address, self)
            return
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--rules", help="a JSON file: {\"rules\": [...]}")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    a = ap.parse_args()
    if a.host not in ("127.0.0.1", "::1", "localhost"):
        sys.exit("mock_llm: loopback only")
    st = State(os.environ.get("MOCK_LLM_KEY", "sk-mock-key"))
    if a.rules:
        with open(a.rules) as f:
            st.load(json.load(f)["rules"])
    tls = None
    if a.tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(a.tls_cert, a.tls_key)
    handler = make_handler(st)
    api = Server((a.host, a.port), handler, tls=tls)
    ctl = Server(("127.0.0.1", 0), handler, control_only=True)  # always IPv4 and plain
    for s in (api, ctl):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(f"PORT {api.server_address[1]} CONTROL {ctl.server_address[1]}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch_stdin():
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    stop.wait()
    os._exit(0)


if __name__ == "__main__":
    main()
