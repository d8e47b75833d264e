"""The scripted model server itself (mock_llm.py, through mockctl.py): the answer and error
shapes of both APIs, its request checks, every fault, the control endpoints and HTTPS. Tests
of Engram lean on it, so its own behaviour is pinned here (stdlib and pytest only)."""
import email.utils
import http.client
import json
import os
import socket
import ssl
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mockctl import MockLLM, client_context, make_pki  # noqa: E402

KEY = "sk-test-FAKE-mock-0000"
SCHEMA = {"type": "object", "required": ["ids"], "additionalProperties": False,
          "properties": {"ids": {"type": "array", "items": {"type": "integer"}}}}
RULES = [
    {"name": "plain", "match": "hello", "reply": {"text": "Hi there"},
     "usage": {"input_tokens": 7, "output_tokens": 2}},
    {"name": "ids", "match": {"regex": "pick (the )?ids"}, "reply": {"json": {"ids": [1, 2]}}},
    {"name": "echo", "match": "ECHO", "reply": {"echo": True}},
    {"name": "anth", "api": "anthropic", "match": "which api", "reply": {"text": "anthropic"}},
    {"name": "oai", "api": "openai", "match": "which api", "reply": {"text": "openai"}},
    {"name": "r429", "match": "RATE", "reply": {"text": "ok"},
     "fault": {"status": 429, "retry_after": 3, "fail_n": 1}},
    {"name": "rdate", "match": "DATE", "reply": {"text": "ok"},
     "fault": {"status": 503, "retry_after_date": 30, "retry_after_ms": 1500}},
    {"name": "e529", "match": "OVERLOAD", "reply": {"text": "ok"}, "fault": {"status": 529}},
    {"name": "quota", "match": "QUOTA", "reply": {"text": "ok"},
     "fault": {"status": 429, "quota": True}},
    {"name": "drop", "match": "DROP", "reply": {"text": "ok"}, "fault": {"drop": True}},
    {"name": "partial", "match": "PARTIAL", "reply": {"text": "a" * 100},
     "fault": {"partial": True}},
    {"name": "malformed", "match": "MALFORMED", "reply": {"text": "ok"},
     "fault": {"malformed": True}},
    {"name": "break", "match": "BREAK", "reply": {"json": {"ids": [1]}},
     "fault": {"schema_break": True}},
    {"name": "trunc", "match": "TRUNC", "reply": {"text": "abcdefgh"},
     "fault": {"truncated": True}},
    {"name": "refuse", "match": "REFUSE", "reply": {"text": "x"}, "fault": {"refusal": True}},
    {"name": "echokey", "match": "QUOTE-KEY", "reply": {"text": "x"}, "fault": {"echo_key": True}},
    {"name": "slow", "match": "SLOW", "reply": {"text": "late"}, "fault": {"slow_ms": 400}},
]


@pytest.fixture(scope="module")
def mock():
    with MockLLM(key=KEY, rules=RULES) as m:
        yield m


@pytest.fixture(autouse=True)
def fresh(mock):
    mock.reset()


def post(mock, api, body, key=KEY, headers=None, timeout=10, context=None):
    """(status, headers, raw body) of one API request."""
    path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    h = {"Content-Type": "application/json"}
    if api == "anthropic":
        h["anthropic-version"] = "2023-06-01"
        if key:
            h["x-api-key"] = key
    elif key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    if context:
        c = http.client.HTTPSConnection("127.0.0.1", mock.port, timeout=timeout, context=context)
    else:
        c = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def req(api, text, schema=None, **extra):
    if api == "anthropic":
        b = {"model": "m", "max_tokens": 100, "system": "sys",
             "messages": [{"role": "user", "content": text}]}
        if schema:
            b["tools"] = [{"name": "pick", "input_schema": schema}]
            b["tool_choice"] = {"type": "tool", "name": "pick"}
    else:
        b = {"model": "m", "max_completion_tokens": 100,
             "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]}
        if schema:
            b["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "pick", "schema": schema, "strict": True}}
    b.update(extra)
    return b


APIS = ["anthropic", "openai"]


@pytest.mark.parametrize("api", APIS)
def test_text_answer(mock, api):
    st, h, raw = post(mock, api, req(api, "hello there"))
    assert st == 200 and h["content-type"] == "application/json"
    a = json.loads(raw)
    if api == "anthropic":
        assert a["type"] == "message" and a["role"] == "assistant" and a["id"].startswith("msg_")
        assert a["content"] == [{"type": "text", "text": "Hi there"}]
        assert a["stop_reason"] == "end_turn"
        assert a["usage"]["input_tokens"] == 7 and a["usage"]["output_tokens"] == 2
    else:
        assert a["object"] == "chat.completion" and a["id"].startswith("chatcmpl-")
        ch = a["choices"][0]
        assert ch["message"] == {"role": "assistant", "content": "Hi there", "refusal": None}
        assert ch["finish_reason"] == "stop"
        assert a["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert a["model"] == "m"
    calls = mock.calls()
    assert len(calls) == 1 and calls[0]["rule"] == "plain" and calls[0]["auth"] == "ok"
    assert calls[0]["api"] == api and calls[0]["body"]["model"] == "m"
    # the key is never recorded
    assert KEY not in json.dumps(calls)


@pytest.mark.parametrize("api", APIS)
def test_structured_answer(mock, api):
    a = json.loads(post(mock, api, req(api, "please pick the ids", SCHEMA))[2])
    if api == "anthropic":
        blk = a["content"][0]
        assert blk["type"] == "tool_use" and blk["name"] == "pick" and blk["input"] == {"ids": [1, 2]}
        assert blk["id"].startswith("toolu_") and a["stop_reason"] == "tool_use"
    else:
        assert json.loads(a["choices"][0]["message"]["content"]) == {"ids": [1, 2]}
    # without a tool or a schema, the JSON comes as text
    a = json.loads(post(mock, api, req(api, "pick ids"))[2])
    text = a["content"][0]["text"] if api == "anthropic" else a["choices"][0]["message"]["content"]
    assert json.loads(text) == {"ids": [1, 2]}


@pytest.mark.parametrize("api", APIS)
def test_rules(mock, api):
    a = json.loads(post(mock, api, req(api, "ECHO this back"))[2])
    text = a["content"][0]["text"] if api == "anthropic" else a["choices"][0]["message"]["content"]
    assert text == "ECHO this back"
    a = json.loads(post(mock, api, req(api, "which api?"))[2])
    text = a["content"][0]["text"] if api == "anthropic" else a["choices"][0]["message"]["content"]
    assert text == api
    st, _, raw = post(mock, api, req(api, "nothing matches me"))
    assert st == 400 and b"no rule matches" in raw


@pytest.mark.parametrize("api", APIS)
def test_auth(mock, api):
    st, _, raw = post(mock, api, req(api, "hello"), key="sk-test-FAKE-wrong-1234")
    assert st == 401
    e = json.loads(raw)
    if api == "anthropic":
        assert e["type"] == "error" and e["error"]["type"] == "authentication_error"
    else:
        assert e["error"]["code"] == "invalid_api_key"
        assert "sk-***1234" in e["error"]["message"]  # masked, as OpenAI does
    st, _, _ = post(mock, api, req(api, "hello"), key=None)
    assert st == 401
    assert [c["auth"] for c in mock.calls()] == ["wrong", "missing"]


def test_request_checks(mock):
    bad = [("anthropic", {"model": "m", "messages": [{"role": "user", "content": "hello"}]}),
           ("anthropic", req("anthropic", "hello", max_tokens=0)),
           ("anthropic", {"model": "m", "max_tokens": 5,
                          "messages": [{"role": "assistant", "content": "hello"}]}),
           ("anthropic", dict(req("anthropic", "hello"), tools=[
               {"name": "t", "input_schema": {"type": "array"}}])),
           ("anthropic", dict(req("anthropic", "hello"), tool_choice={"type": "tool",
                                                                      "name": "nope"})),
           ("openai", {"model": "m", "messages": []}),
           ("openai", req("openai", "hello", response_format={"type": "json_schema",
                                                              "json_schema": {"name": "x"}})),
           ("openai", req("openai", "hello", max_tokens="5"))]
    for api, body in bad:
        st, _, raw = post(mock, api, body)
        assert st == 400, (api, body)
        e = json.loads(raw)
        assert (e["error"]["type"] == "invalid_request_error")
    st, _, _ = post(mock, "anthropic", req("anthropic", "hello"),
                    headers={"anthropic-version": ""})
    assert st == 400


@pytest.mark.parametrize("api", APIS)
def test_status_faults(mock, api):
    st, h, raw = post(mock, api, req(api, "RATE"))
    assert st == 429 and h["retry-after"] == "3"
    e = json.loads(raw)
    assert (e["error"]["type"] == "rate_limit_error" if api == "anthropic"
            else e["error"]["code"] == "rate_limit_exceeded")
    assert post(mock, api, req(api, "RATE"))[0] == 200  # fail_n 1
    st, h, _ = post(mock, api, req(api, "DATE"))
    assert st == 503 and h["retry-after-ms"] == "1500"
    ahead = email.utils.parsedate_to_datetime(h["retry-after"]).timestamp() - time.time()
    assert 25 < ahead <= 31
    st, _, raw = post(mock, api, req(api, "OVERLOAD"))
    assert st == 529
    if api == "anthropic":
        assert json.loads(raw)["error"]["type"] == "overloaded_error"
    st, _, raw = post(mock, api, req(api, "QUOTA"))
    e = json.loads(raw)
    assert st == 429
    if api == "anthropic":
        assert e["error"]["details"]["error_code"] == "enforced_spend_limit_reached"
    else:
        assert e["error"]["code"] == "insufficient_quota"
    st, _, raw = post(mock, api, req(api, "QUOTE-KEY"))
    assert st == 400 and KEY.encode() in raw  # the fault exists to quote the key


@pytest.mark.parametrize("api", APIS)
def test_connection_faults(mock, api):
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        post(mock, api, req(api, "DROP"))
    with pytest.raises(http.client.IncompleteRead):
        post(mock, api, req(api, "PARTIAL"))
    with pytest.raises(socket.timeout):
        post(mock, api, req(api, "SLOW"), timeout=0.1)
    calls = mock.calls()
    assert [c["fault"] for c in calls] == ["drop", "partial", "slow_ms"]


@pytest.mark.parametrize("api", APIS)
def test_answer_faults(mock, api):
    st, _, raw = post(mock, api, req(api, "MALFORMED"))
    assert st == 200
    with pytest.raises(ValueError):
        json.loads(raw)
    a = json.loads(post(mock, api, req(api, "BREAK", SCHEMA))[2])
    v = (a["content"][0]["input"] if api == "anthropic"
         else json.loads(a["choices"][0]["message"]["content"]))
    assert "ids" not in v  # the required property is gone
    a = json.loads(post(mock, api, req(api, "TRUNC"))[2])
    if api == "anthropic":
        assert a["stop_reason"] == "max_tokens" and a["content"][0]["text"] == "abcd"
        assert a["usage"]["output_tokens"] == 100
    else:
        assert a["choices"][0]["finish_reason"] == "length"
        assert a["choices"][0]["message"]["content"] == "abcd"
    a = json.loads(post(mock, api, req(api, "REFUSE", SCHEMA))[2])
    if api == "anthropic":
        assert a["stop_reason"] == "refusal" and a["content"] == []
    else:
        m = a["choices"][0]["message"]
        assert m["content"] is None and m["refusal"]


def test_control(mock):
    post(mock, "openai", req("openai", "hello"))
    c = mock.calls()[0]
    assert c["t"] <= c["t_end"] and c["inflight"] == 1 and c["headers"]["content-type"]
    assert "authorization" not in c["headers"]
    assert mock.max_inflight() == 1
    mock.reset()
    assert mock.calls() == [] and mock.max_inflight() == 0
    with pytest.raises(Exception):
        mock.script([{"match": {"regex": "("}}])


def test_https():
    with tempfile.TemporaryDirectory() as d:
        pki = make_pki(d)
        with MockLLM(key=KEY, rules=RULES, tls_cert=pki["server"], tls_key=pki["server_key"]) as m:
            assert m.url("openai").startswith("https://127.0.0.1:")
            st, _, raw = post(m, "openai", req("openai", "hello"), context=client_context(pki["ca"]))
            assert st == 200 and b"Hi there" in raw
            with pytest.raises(ssl.SSLError):
                post(m, "openai", req("openai", "hello"), context=client_context(pki["other_ca"]))
            assert len(m.calls()) == 1  # the control port stays plain
