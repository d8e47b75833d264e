"""Each limit /v1/openapi.json declares on a request parameter is the server's real one:
for every parameter with a maximum, maxLength or maxItems (and a minimum, minLength or
minItems above zero), a request that is otherwise minimal and valid but carries a value one
over (under) the limit is refused with invalid_argument, error.field naming the parameter
and the message quoting the limit."""
import json

import pytest

from test_http_api import post

# bodies up to this size are sent (max_message_bytes, 16 MiB by default, bounds the body);
# a declared limit that needs more would not be checked, and fails the test
BODY_MAX = 4 << 20


@pytest.fixture(scope="module")
def doc(server):
    status, body = server.http_get("/v1/openapi.json")
    assert status == 200
    return json.loads(body)


def plain(schema):
    """The schema of a parameter without null (alias properties are skipped by callers)."""
    t = schema.get("type")
    if isinstance(t, list):
        t = [x for x in t if x != "null"][0]
    return t


def minimal(schema):
    """A small value the schema accepts."""
    t = plain(schema)
    if "enum" in schema:
        return schema["enum"][0]
    if t == "integer":
        return max(1, schema.get("minimum", 1))
    if t == "number":
        return schema.get("minimum", 0) if schema.get("minimum", 0) > 0 else 0.5
    if t == "string":
        return "x" * max(1, schema.get("minLength", 1))
    if t == "boolean":
        return False
    if t == "array":
        item = minimal(schema.get("items", {"type": "integer"}))
        return [item] * max(1, schema.get("minItems", 1))
    if t == "object":
        return {}
    if "oneOf" in schema:  # a vector
        return [0.5]
    return "x"


def over(schema):
    """(a value one over the schema's limit, the limit), or None without a limit."""
    t = plain(schema)
    if t in ("integer", "number") and "maximum" in schema:
        m = schema["maximum"]
        return (m + 1 if t == "integer" else m * 2 + 1), m
    if t == "string" and "maxLength" in schema:
        return "x" * (schema["maxLength"] + 1), schema["maxLength"]
    if t == "array" and "maxItems" in schema:
        return [minimal(schema.get("items", {"type": "integer"}))] * (schema["maxItems"] + 1), \
            schema["maxItems"]
    return None


def under(schema):
    """(a value one under the schema's lower limit, the limit), or None without one (or
    when the lower limit is a type's own: 0 for an unsigned integer or a length)."""
    t = plain(schema)
    if t in ("integer", "number") and schema.get("minimum", 0) > 0:
        m = schema["minimum"]
        return (m - 1 if t == "integer" else m / 2), m
    if t == "string" and schema.get("minLength", 0) > 0:
        return "x" * (schema["minLength"] - 1), schema["minLength"]
    if t == "array" and schema.get("minItems", 0) > 0:
        return [minimal(schema.get("items", {"type": "integer"}))] * (schema["minItems"] - 1), \
            schema["minItems"]
    return None


def cases(doc, bound=None):
    bound = bound or over
    for path, item in sorted(doc["paths"].items()):
        if not path.startswith("/v1/rpc/"):
            continue  # the seeds' REST paths: the same methods (test_seed_rules)
        method = path[len("/v1/rpc/"):]
        body = item["post"]["requestBody"]["content"]["application/json"]["schema"]
        props = body.get("properties", {})
        required = body.get("required", [])
        for name, schema in props.items():
            if "allOf" in schema:
                continue  # another name of a parameter checked under its own name
            o = bound(schema)
            if o is None:
                continue
            params = {r: minimal(props[r]) for r in required}
            params[name] = o[0]
            yield method, name, params, o[1]


@pytest.mark.parametrize("bound", [over, under], ids=["over", "under"])
def test_every_declared_limit_is_the_servers(server, tenant, doc, bound):
    key = tenant[1]
    checked, too_big, wrong = 0, [], []
    for method, name, params, limit in cases(doc, bound):
        raw = json.dumps(params)
        if len(raw) > BODY_MAX:
            too_big.append((method, name, limit))
            continue
        k = server.admin_key() if method.startswith("admin.") else key
        status, _, body = post(server, method, params, k)
        err = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        if not (status == 400 and err.get("code") == "invalid_argument"
                and err.get("field") == name and str(limit) in err.get("message", "")):
            wrong.append((method, name, limit, status, err))
        checked += 1
    assert not wrong, "\n".join(map(str, wrong))
    assert not too_big, too_big
    # 140 upper and 77 lower limits when this was written
    assert checked >= (100 if bound is over else 1)
