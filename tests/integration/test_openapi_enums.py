"""Each parameter the method table declares a fixed set of strings for (its ENUMS) carries
that set as `enum` in /v1/openapi.json (`items.enum` for an array of strings) and in the
`methods` answer, and a live engramd refuses a value outside it: invalid_argument,
error.field naming the parameter (with the element's index for an array), the message
listing every allowed value, in the table's order. One source: the dispatcher's check, its
message, the document and the `methods` answer all read the same words."""
import json

import pytest

from test_http_api import post
from test_openapi_limits import minimal


@pytest.fixture(scope="module")
def doc(server):
    status, body = server.http_get("/v1/openapi.json")
    assert status == 200
    return json.loads(body)


def enum_params(doc):
    """(method, name, words, is_array, required params) for every declared enum."""
    for path, item in sorted(doc["paths"].items()):
        if not path.startswith("/v1/rpc/"):
            continue  # the seeds' REST paths: the same methods (test_seed_rules)
        method = path[len("/v1/rpc/"):]
        body = item["post"]["requestBody"]["content"]["application/json"]["schema"]
        props = body.get("properties", {})
        for name, schema in props.items():
            if "allOf" in schema:  # an alias: its own case below
                continue
            if "enum" in schema:
                words, arr = [w for w in schema["enum"] if w is not None], False
            elif "enum" in schema.get("items", {}):
                words, arr = schema["items"]["enum"], True
            else:
                continue
            required = {r: minimal(props[r]) for r in body.get("required", []) if r != name}
            yield method, name, words, arr, required


def test_every_declared_enum_is_the_servers(server, tenant, doc):
    key = tenant[1]
    checked, wrong = [], []
    for method, name, words, arr, required in enum_params(doc):
        k = server.admin_key() if method.startswith("admin.") else key
        params = dict(required)
        # a valid first element, so the index in the field is the offending one's
        params[name] = [words[0], "no_such_value"] if arr else "no_such_value"
        status, _, body = post(server, method, params, k)
        err = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        field = f"{name}[1]" if arr else name
        msg = f"parameter '{field}' must be one of {', '.join(words)}"
        if not (status == 400 and err.get("code") == "invalid_argument"
                and err.get("field") == field and err.get("message") == msg):
            wrong.append((method, name, status, err, msg))
        checked.append((method, name))
    assert not wrong, "\n".join(map(str, wrong))
    # 35 when this was written: type, scope, mode, tier, role, state, ... over 18 methods
    assert len(checked) >= 30, checked
    names = {n for _, n in checked}
    assert {"type", "scope", "scopes", "type_filter", "mode", "role", "state", "tier",
            "status", "statuses", "category", "categories", "branch_type",
            "return_format", "order_by", "order", "format", "index_engine"} <= names


def test_an_alias_is_checked_as_the_parameter_it_names(server, tenant):
    status, _, body = post(server, "memory.store",
                           {"content": "x", "memory_type": "opinion", "importance": 0.5},
                           tenant[1])
    assert status == 400, body
    assert body["error"]["field"] == "type"
    assert body["error"]["message"] == (
        "parameter 'type' must be one of fact, preference, episode, strategy_outcome, "
        "constraint")


def test_a_valid_value_passes(server, tenant):
    """The check refuses only values outside the set (each word of one enum accepted)."""
    for mode in ("vector", "text", "hybrid"):
        status, _, body = post(server, "memory.search", {"query": "x", "mode": mode}, tenant[1])
        assert status == 200, (mode, body)


def test_the_methods_answer_lists_the_same_words(server, doc):
    status, _, live = post(server, "methods")
    assert status == 200
    declared = {(m, n): w for m, n, w, _, _ in enum_params(doc)}
    listed = {(m["name"], p["name"]): p["enum"] for m in live for p in m["params"]
              if "enum" in p}
    assert listed == declared


def test_a_batch_items_words_are_the_same_sets(server, tenant):
    """memory.store_batch's items take memory.store's parameters: the same sets, the same
    message, the item named in the field."""
    for item, field, words in (
            ({"type": "opinion"}, "memories[1].type",
             "fact, preference, episode, strategy_outcome, constraint"),
            ({"type": "fact", "scope": "planet"}, "memories[1].scope", "agent, clade, tenant")):
        good = {"content": "x", "type": "fact", "importance": 0.5}
        status, _, body = post(server, "memory.store_batch",
                               {"memories": [good, {**good, **item}]}, tenant[1])
        assert status == 400, body
        assert body["error"]["field"] == field, body
        assert body["error"]["message"] == f"parameter '{field}' must be one of {words}"
