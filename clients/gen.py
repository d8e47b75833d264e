#!/usr/bin/python3
"""clients/gen.py: writes the typed method surface of the Python and TypeScript clients
from clients/methods.json, the server's own `methods` answer.

    gen.py              regenerate python/engram_client/_api.py and typescript/src/api.ts
    gen.py --check      exit 1 when either file is not what this script would write
    gen.py --snapshot F write methods.json from F (a JSON dump of a live `methods` answer)
    gen.py --fetch [HOST:]PORT   write methods.json from a running engramd's answer

The client tests compare a live engramd's `methods` answer with methods.json and with each
client's method list, so a method (or parameter) the server has and a client lacks fails a
test. The parameter names, order and required flags come from the server; this file adds
only what the server cannot say: a narrower type for some parameters, the result types,
and one line of documentation per method.
"""
import json
import keyword
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS_JSON = os.path.join(HERE, "methods.json")
PY_OUT = os.path.join(HERE, "python", "engram_client", "_api.py")
TS_OUT = os.path.join(HERE, "typescript", "src", "api.ts")
PY_RESULTS_OUT = os.path.join(HERE, "python", "engram_client", "results.py")
TS_RESULTS_OUT = os.path.join(HERE, "typescript", "src", "results.ts")

# One line per method, for docstrings and TSDoc. See docs/protocol.md for the full text.
DOCS = {
    "admin.key.create": "Creates a named API key for a tenant; the key is shown only in this answer.",
    "admin.key.list": "Lists a tenant's API keys (public prefixes only).",
    "admin.key.revoke": "Revokes an API key; connections using it fail from their next request.",
    "admin.tenant.create": "Creates a tenant with its first API key (shown only in this answer).",
    "admin.tenant.delete": "Deletes a tenant and everything it owns.",
    "admin.tenant.get": "Returns a tenant by id or name.",
    "admin.tenant.list": "Lists tenants in id order, one page at a time.",
    "admin.tenant.move": "On a Citus cluster: moves a tenant to another worker (isolated into "
                         "its own shard group first), online.",
    "admin.tenant.update": "Renames a tenant, moves it to another tier, or changes its "
                           "embedding model (re-embedded online; cancel_reembed stops it).",
    "auth": "Authenticates the connection with a tenant key or the admin key.",
    "memory.archive": "Archives live memories: kept, but skipped by searches.",
    "memory.consolidate": "Runs a consolidation of the tenant now (premium tier).",
    "memory.consolidation.runs": "Lists the tenant's consolidation runs, newest first.",
    "memory.context": "Searches and renders the results as an <agent_memory> block or search-result items within a token budget.",
    "memory.delete": "Deletes memories with their history: by ids, or all that pass a filter (with a dry-run count).",
    "memory.feedback": "Records which injected memories an answer cited (provenance feedback).",
    "memory.get": "Returns memories by id, in the order asked.",
    "memory.history": "Returns every version of a memory, oldest first.",
    "memory.list": "Lists memories that pass a filter, one keyset page at a time.",
    "memory.prompt": "Assembles a turn's prompt within one token budget: the <agent_memory> block for the query, the session's <working_memory> and its transcript tail with the summary.",
    "memory.provenance": "Estimates which injected memories a response used (word overlap or sentence embeddings) and records it.",
    "memory.restore": "Brings archived memories back.",
    "memory.search": "Searches memories by vector, text or both, ranked by similarity and importance.",
    "memory.stats": "Counts the tenant's memories by type and scope.",
    "memory.store": "Stores one memory; acknowledged after the commit.",
    "memory.store_batch": "Stores up to 1000 memories in one transaction: all or none.",
    "memory.update": "Changes a memory; the previous state is kept as a version.",
    "methods": "Lists every method of the server with its flags and parameters.",
    "ping": "Answers \"pong\".",
    "session.append": "Appends one message to a session's transcript.",
    "session.audit": "Returns one page of a session's append-only audit log, in seq order.",
    "session.checkpoint": "Captures a session's full state to resume from later.",
    "session.checkpoints": "Lists a session's unexpired checkpoints, oldest first.",
    "session.children": "Lists a session's sub-agents in spawn order.",
    "session.complete": "Records a sub-agent's output and marks it completed.",
    "session.context": "Renders a session's <working_memory> block (and resumed-session context) within a token budget.",
    "session.create": "Creates a session for an agent.",
    "session.delete": "Deletes a session, its sub-agents and everything they own (branches only with cascade).",
    "session.end": "Ends a session, optionally with a summary.",
    "session.extract": "Extracts the durable facts of a session's new messages into memories (chat model).",
    "session.get": "Returns a session with its costs, counters and constraints.",
    "session.handoff": "Returns the package another agent, a human or a recovering process needs.",
    "session.list": "Lists sessions, newest first, one page at a time.",
    "session.messages": "Returns one page of a session's history as a model should be given it.",
    "session.note.add": "Adds a structured note; a live note with the same key is superseded.",
    "session.notes": "Returns a session's live notes in creation order.",
    "session.resume": "Creates a new session from a checkpoint.",
    "session.scratchpad.get": "Returns a session's scratchpad document.",
    "session.scratchpad.update": "Replaces a session's scratchpad (optionally only at an expected version).",
    "session.spawn": "Creates a sub-agent session under a parent.",
    "session.summarize": "Records a compaction summary standing in for the entries it covers.",
    "session.task.complete": "Marks the current task done: clears its current_task notes.",
    "session.tombstone": "Hides a transcript entry from the transcript from now on.",
    "session.work_item.add": "Adds a work item to a session (a sub-agent's: to its parent).",
    "session.work_item.list": "Lists a session's work items in id order, one page at a time.",
    "session.work_item.update": "Changes a work item's title, description, status or owner.",
    "tenant.dream": "Returns the tenant's auto-dream state; with run, dreams now (chat model).",
    "tenant.usage": "Returns the tenant's usage and limits.",
}

# Base types: server type -> (Python, TypeScript).
BASE = {
    "any": ("Any", "unknown"),
    "bool": ("bool", "boolean"),
    "uint": ("int", "Id"),
    "int": ("int", "number"),
    "number": ("float", "number"),
    "string": ("str", "string"),
    "bin": ("bytes", "Uint8Array"),
    "array": ("Sequence[Any]", "unknown[]"),
    "map": ("Mapping[str, Any]", "Record<string, unknown>"),
    "vector": ("Embedding", "EmbeddingInput"),
    "string[]": ("Sequence[str]", "string[]"),
    "uint[]": ("Sequence[int]", "Id[]"),
    "time": ("int | str", "number | string"),
}

# Narrower parameter types: (method or "*", param) -> (Python, TypeScript). Each narrowing
# must be one the server enforces (docs/protocol.md).
FILTER_METHODS = ("memory.search", "memory.context", "memory.list", "memory.prompt")
NARROW = {
    ("*", "type_filter"): ("Sequence[MemoryType]", "MemoryType[]"),
    ("*", "scopes"): ("Sequence[Scope]", "Scope[]"),
    ("*", "attrs"): ("Mapping[str, Any]", "Record<string, unknown>"),
    ("*", "tier"): ("Tier", "Tier"),
    ("*", "created_at"): ("int", "number"),
    ("memory.store", "type"): ("MemoryType", "MemoryType"),
    ("memory.update", "type"): ("MemoryType", "MemoryType"),
    ("memory.store", "scope"): ("Scope", "Scope"),
    ("memory.store", "metadata"): ("Metadata", "Metadata"),
    ("memory.update", "metadata"): ("Metadata", "Metadata"),
    ("memory.store_batch", "memories"): ("Sequence[MemoryInput]", "MemoryInput[]"),
    ("memory.search", "mode"): ("SearchMode", "SearchMode"),
    ("memory.context", "mode"): ("SearchMode", "SearchMode"),
    ("memory.prompt", "mode"): ("SearchMode", "SearchMode"),
    ("memory.list", "order_by"): ("ListOrderBy", "ListOrderBy"),
    ("memory.delete", "filter"): ("MemoryFilter", "MemoryFilter"),
    ("memory.list", "order"): ("ListOrder", "ListOrder"),
    ("admin.tenant.create", "embedding"): ("EmbeddingConfig", "EmbeddingConfig"),
    ("session.create", "config"): ("SessionConfig", "SessionConfig"),
    ("session.append", "role"): ("Role", "Role"),
    ("session.note.add", "category"): ("NoteCategory", "NoteCategory"),
    ("session.note.add", "scope"): ("NoteScope", "NoteScope"),
    ("session.notes", "scopes"): ("Sequence[NoteScope]", "NoteScope[]"),
    ("session.notes", "categories"): ("Sequence[NoteCategory]", "NoteCategory[]"),
    ("session.list", "state"): ("SessionState", "SessionState"),
    ("session.spawn", "return_format"): ("ReturnFormat", "ReturnFormat"),
    ("session.handoff", "mode"): ("HandoffMode", "HandoffMode"),
}

# Result types written by hand (python/engram_client/types.py, typescript/src/types.ts),
# where they say more than the server's schema (nested shapes the schema leaves open,
# fields of some formats only); tests check they name every field the schema has. Every
# other method's result type is generated from its schema (the `result` of the `methods`
# answer) into python/engram_client/results.py and typescript/src/results.ts.
RESULTS = {
    "ping": ("str", "string"),
    "methods": ("list[MethodInfo]", "MethodInfo[]"),
    "auth": ("AuthResult", "AuthResult"),
    "memory.store": ("StoreResult", "StoreResult"),
    "memory.store_batch": ("StoreBatchResult", "StoreBatchResult"),
    "memory.get": ("MemoriesResult", "MemoriesResult"),
    "memory.list": ("ListResult", "ListResult"),
    "memory.search": ("SearchResult", "SearchResult"),
    "memory.context": ("ContextResult", "ContextResult"),
    "memory.prompt": ("PromptResult", "PromptResult"),
    "memory.update": ("UpdateResult", "UpdateResult"),
    "memory.delete": ("DeleteResult", "DeleteResult"),
    "memory.archive": ("ArchiveResult", "ArchiveResult"),
    "memory.restore": ("RestoreResult", "RestoreResult"),
    "memory.history": ("HistoryResult", "HistoryResult"),
    "memory.stats": ("StatsResult", "StatsResult"),
    "admin.tenant.create": ("TenantCreateResult", "TenantCreateResult"),
    "session.create": ("SessionCreateResult", "SessionCreateResult"),
    "session.append": ("AppendResult", "AppendResult"),
    "session.scratchpad.get": ("Scratchpad", "Scratchpad"),
    "session.scratchpad.update": ("Scratchpad", "Scratchpad"),
    "session.note.add": ("NoteAddResult", "NoteAddResult"),
    "session.notes": ("NotesResult", "NotesResult"),
    "session.checkpoint": ("CheckpointResult", "CheckpointResult"),
    "session.messages": ("MessagesResult", "MessagesResult"),
    "session.resume": ("ResumeResult", "ResumeResult"),
}
# The schema's components that have a hand-written type of the same name.
HAND_COMPONENTS = {"Memory", "SearchHit", "Scratchpad"}

PY_KEYWORDS = {"from", "import", "class", "def", "global", "lambda", "pass", "return"}


def load_methods():
    with open(METHODS_JSON) as f:
        return json.load(f)


def ptype(method, p, lang):
    """A parameter's type: a narrower one (NARROW), else from the set of strings the server
    declares for it (`enum`: a string-literal union), else from its server type."""
    i = 0 if lang == "py" else 1
    for key in ((method, p["name"]), ("*", p["name"])):
        if key in NARROW:
            t = NARROW[key][i]
            if "enum" in p:
                check_alias(method, p, t, lang)
            return t
    if "enum" in p:
        lit = literal(p["enum"], lang)
        if p["type"] == "string[]":
            return f"Sequence[{lit}]" if lang == "py" else f"({lit})[]"
        assert p["type"] == "string", (method, p)
        return lit
    return BASE[p["type"]][i]


def literal(words, lang):
    vals = [json.dumps(w) for w in words]
    return f"Literal[{', '.join(vals)}]" if lang == "py" else " | ".join(vals)


TYPES_PY = os.path.join(HERE, "python", "engram_client", "types.py")
TYPES_TS = os.path.join(HERE, "typescript", "src", "types.ts")


def check_alias(method, p, t, lang):
    """A named type NARROW gives an enum parameter must hold exactly the server's words (the
    aliases are written once, in types.py and types.ts, for readable signatures)."""
    name = re.sub(r"^Sequence\[(\w+)\]$|^(\w+)\[\]$", lambda m: m.group(1) or m.group(2), t)
    if lang == "py":
        with open(TYPES_PY) as f:
            m = re.search(rf"^{name} = Literal\[(.*)\]$", f.read(), re.M)
    else:
        with open(TYPES_TS) as f:
            m = re.search(rf"^export type {name} = (.*);$", f.read(), re.M)
    words = set(re.findall(r'"([^"]*)"', m.group(1))) if m else None
    if words != set(p["enum"]):
        raise SystemExit(f"gen.py: {method} {p['name']}: {name} in "
                         f"{'types.py' if lang == 'py' else 'types.ts'} is {sorted(words or [])}, "
                         f"the server takes {p['enum']}")


def rtype(method, lang):
    if method in RESULTS:
        return RESULTS[method][0 if lang == "py" else 1]
    return result_type_name(method)


def result_type_name(method):
    """The generated result type of a method: its component's name when the schema is one."""
    schema = METHOD_RESULTS.get(method)
    if schema is None:
        raise SystemExit(f"gen.py: {method} has no result schema in methods.json")
    return schema.get("title") or pascal(method.split(".")) + "Result"


METHOD_RESULTS = {}  # method name -> result schema (filled by main from methods.json)

# ---- result types from the schemas ---------------------------------------------------------

# Result fields holding identifiers (TypeScript's `I`): the rule of typescript/src/wire.ts's
# normalize(), which turns exactly these into number or bigint.
TS_ID_FIELDS = {"superseded_by", "merged_into", "superseded", "supersedes", "resumed_from"}
TS_ID_LIST_FIELDS = {"deleted", "archived", "restored", "unknown", "missing", "notes_added",
                     "notes_removed", "children_missing"}


def is_id_field(k):
    return k == "id" or k.endswith("_id") or k in TS_ID_FIELDS


def is_id_list_field(k):
    return k == "ids" or k.endswith("_ids") or k in TS_ID_LIST_FIELDS


def singular(word):
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word + "_item"


class ResultTypes:
    """Named types (TypedDicts / interfaces) for result schemas, in definition order."""

    def __init__(self, lang):
        self.lang = lang
        self.defs = {}  # name -> text, in the order needed (bases first)
        self.used_hand = set()

    def scalar(self, t, key):
        py = self.lang == "py"
        if t == "integer":
            return "int" if py else ("I" if key is not None and is_id_field(key) else "number")
        return {"number": ("float", "number"), "string": ("str", "string"),
                "boolean": ("bool", "boolean"), "null": ("None", "null"),
                "object": ("dict[str, Any]", "Record<string, unknown>"),
                "array": ("list[Any]", "unknown[]")}[t][0 if py else 1]

    def type_of(self, schema, name, key=None):
        """The type expression of schema; objects with properties become named types."""
        py = self.lang == "py"
        if not schema:
            return "Any" if py else "unknown"
        if "const" in schema:
            return f"Literal[{json.dumps(schema['const'])}]" if py else json.dumps(schema["const"])
        if "enum" in schema:
            vals = [json.dumps(v) for v in schema["enum"]]
            return f"Literal[{', '.join(vals)}]" if py else " | ".join(vals)
        t = schema.get("type")
        if ("allOf" in schema or "properties" in schema) and isinstance(t, list) and "null" in t:
            # a nullable object (an object or null): its named type, or None
            return self.named(schema, name) + (" | None" if py else " | null")
        if "allOf" in schema or "properties" in schema:
            return self.named(schema, name)
        if isinstance(t, list):
            return " | ".join(self.type_of({**schema, "type": x}, name, key) for x in t)
        if t == "array" and "items" in schema:
            items = schema["items"]
            if items.get("type") == "integer" and key is not None and is_id_list_field(key):
                return "list[int]" if py else "I[]"
            inner = self.type_of(items, name + "Item", None)
            return f"list[{inner}]" if py else (f"({inner})[]" if "|" in inner else f"{inner}[]")
        return self.scalar(t, key)

    def named(self, schema, name):
        """Defines the type of an object schema (properties, or allOf of a titled base and
        an object) under its title or name; returns the reference to it."""
        name = schema.get("title", name)
        ref = name if self.lang == "py" else f"{name}<I>"
        if name in HAND_COMPONENTS:
            self.used_hand.add(name)
            return ref
        if name in self.defs:
            return ref
        base = None
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        if "allOf" in schema:
            first, rest = schema["allOf"][0], schema["allOf"][1:]
            assert "title" in first and len(rest) == 1 and "properties" in rest[0], name
            base = self.named(first, first["title"])  # defined first: Python needs the base
            props, required = rest[0].get("properties", {}), set(rest[0].get("required", []))
        self.defs[name] = None  # reserved: a recursive schema refers to itself
        fields = []
        for key, sub in props.items():
            sub_name = name + pascal([singular(key)] if sub.get("type") == "array" else [key])
            if sub.get("type") == "array" and "items" in sub:
                items = sub["items"]
                if items.get("type") == "integer" and is_id_list_field(key):
                    t = "list[int]" if self.lang == "py" else "I[]"
                else:
                    inner = self.type_of(items, sub_name, None)
                    t = f"list[{inner}]" if self.lang == "py" else (
                        f"({inner})[]" if "|" in inner else f"{inner}[]")
            else:
                t = self.type_of(sub, sub_name, key)
            fields.append((key, t, key in required))
        self.defs[name] = self.render(name, base, fields)
        return ref

    def render(self, name, base, fields):
        if self.lang == "py" and any(keyword.iskeyword(k) or not k.isidentifier()
                                     for k, _, _ in fields):
            # a field Python cannot name in a class body (tenant.dream's "pass"): the
            # functional form, whose keys are strings
            if base:
                raise SystemExit(f"gen.py: {name} extends {base} and has a field that is not "
                                 "a Python identifier")
            items = ", ".join(f"{json.dumps(k)}: {t if req else f'NotRequired[{t}]'}"
                              for k, t, req in fields)
            return f"{name} = TypedDict({json.dumps(name)}, {{{items}}})\n"
        if self.lang == "py":
            head = f"class {name}({base or 'TypedDict'}):"
            lines = [head]
            for key, t, req in fields:
                lines.append(f"    {key}: {t if req else f'NotRequired[{t}]'}")
            if not fields:
                lines.append("    pass")
            return "\n".join(lines) + "\n"
        ext = f" extends {base}" if base else ""
        lines = [f"export interface {name}<I extends Id = number>{ext} {{"]
        for key, t, req in fields:
            lines.append(f"  {key}{'' if req else '?'}: {t};")
        lines.append("}")
        return "\n".join(lines) + "\n"


PY_RESULTS_HEADER = '''"""The result types of the Engram methods whose results have no hand-written type in
types.py. GENERATED by clients/gen.py from the result schemas of clients/methods.json (the
server's `methods` answer, server/methods/results.c): do not edit by hand.

A field the server always sends is required; the others are ``NotRequired``. A result may
carry further fields (the server adds fields without a new version).
"""
from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from .types import __HAND__

__all__ = [
__ALL__]
'''

TS_RESULTS_HEADER = """// The result types of the Engram methods whose results have no hand-written type in
// types.ts. GENERATED by clients/gen.py from the result schemas of clients/methods.json (the
// server's `methods` answer, server/methods/results.c): do not edit by hand.
//
// A field the server always sends is required; the others are optional. A result may carry
// further fields (the server adds fields without a new version). `I` is the client's id
// type (number, or bigint from a client made with { bigint: true }).
import type { __HAND__ } from "./types.js";
"""


def gen_results(methods, lang):
    rt = ResultTypes(lang)
    for m in methods:
        if m["name"] in RESULTS:
            continue
        rt.named(m["result"], result_type_name(m["name"]))
    names = list(rt.defs)
    if lang == "py":
        hand = ", ".join(sorted(rt.used_hand))
        head = PY_RESULTS_HEADER.replace("__HAND__", hand).replace(
            "__ALL__", "".join(f'    "{n}",\n' for n in names))
    else:
        hand = ", ".join(sorted(rt.used_hand | {"Id"}))
        head = TS_RESULTS_HEADER.replace("__HAND__", hand)
    sep = "\n\n" if lang == "py" else "\n"
    return head + sep + sep.join(rt.defs[n] for n in names), names


def tree(methods):
    """Nested namespaces: {"memory": {"consolidation": {"runs": m}, "store": m}, "ping": m}."""
    root = {}
    for m in methods:
        parts = m["name"].split(".")
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            assert isinstance(node, dict), m["name"]
        assert parts[-1] not in node, m["name"]
        node[parts[-1]] = m
    return root


def camel(s):
    head, *rest = s.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def pascal(parts):
    return "".join(camel(p)[:1].upper() + camel(p)[1:] for p in parts)


# ---- Python --------------------------------------------------------------------------------

PY_HEADER = '''"""The typed method surface of the Engram clients. GENERATED by clients/gen.py from
clients/methods.json (the server's `methods` answer): do not edit by hand.

Three flavours share one shape: ``Sync*`` classes return results, ``Async*`` classes return
coroutines, ``Future*`` classes return ``concurrent.futures.Future`` (pipelining from one
thread). The identifiers of what a call acts on may be given by position (a session
method's ``session_id`` first, the ``ids`` or ``id`` of memory methods); every other
parameter is keyword-only. ``None`` means "not sent". Calls in the old style (every
required parameter by position) still work, with a DeprecationWarning.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence, cast

from ._compat import legacy_positional

if TYPE_CHECKING:
__IMPORTS__
'''


# Argument style (Python): the identifiers of what a call acts on may be given by position,
# everything else is keyword-only, required or not:
#   - a session method's session first (`session_id`; `parent_id` of session.spawn,
#     `checkpoint_id` of session.resume), then the object inside it that the method is named
#     after (`work_item_id` of session.work_item.update);
#   - `ids` / `id` of the memory methods that act on given memories;
#   - `key_id` of admin.key.revoke.
# session.summarize and session.tombstone take session_id first too, though the server may
# infer it (None: not sent). Calls in the old style (every required parameter by position,
# in the server's order) still work through _compat.legacy_positional, with a
# DeprecationWarning.
PY_TARGETS = {
    "memory.get": ("ids",), "memory.archive": ("ids",), "memory.restore": ("ids",),
    "memory.delete": ("ids",), "memory.history": ("id",), "memory.update": ("id",),
    "admin.key.revoke": ("key_id",), "memory.prompt": ("session_id",),
    "session.spawn": ("parent_id",), "session.resume": ("checkpoint_id",),
    "session.work_item.update": ("session_id", "work_item_id"),
}
# What the old style took by position beyond the required parameters.
PY_LEGACY_EXTRA = {"memory.delete": ("ids",)}


def py_positional(m):
    """The parameter names of method m that may be given by position, in order."""
    names = {p["name"] for p in m["params"]}
    if m["name"] in PY_TARGETS:
        pos = PY_TARGETS[m["name"]]
    elif m["name"].startswith("session.") and "session_id" in names:
        pos = ("session_id",)
    else:
        pos = ()
    assert all(n in names for n in pos), m["name"]
    return list(pos)


def py_legacy(m):
    """The positional parameters of the old style: the required ones in the server's order."""
    return [p["name"] for p in m["params"] if p["required"]] + list(PY_LEGACY_EXTRA.get(m["name"], ()))


def py_method(m, flavour, name):
    byname = {p["name"]: p for p in m["params"]}
    pos = [byname[n] for n in py_positional(m)]
    kw_req = [p for p in m["params"] if p["required"] and p not in pos]
    kw_opt = [p for p in m["params"] if not p["required"] and p not in pos]
    args = ["self"]
    for p in pos:
        default = "" if p["required"] else " | None = None"
        args.append(f"{p['name']}: {ptype(m['name'], p, 'py')}{default}")
    if kw_req or kw_opt:
        args.append("*")
    for p in kw_req:
        args.append(f"{p['name']}: {ptype(m['name'], p, 'py')}")
    for p in kw_opt:
        args.append(f"{p['name']}: {ptype(m['name'], p, 'py')} | None = None")
    r = rtype(m["name"], "py")
    ret = {"sync": r, "async": r, "future": f"Future[{r}]"}[flavour]
    kw = "async def" if flavour == "async" else "def"
    inner = {"sync": "self._r._call", "async": "await self._r._acall",
             "future": "self._r._submit"}[flavour]
    call = f'return cast("{ret}", {inner}'
    params = ", ".join(f'"{p["name"]}": {p["name"]}' for p in m["params"])
    sig = ", ".join(args)
    lines = []
    legacy = py_legacy(m)
    if legacy != [p["name"] for p in pos][:len(legacy)] or len(legacy) > len(pos):
        names = "".join(f'"{n}", ' for n in legacy)
        lines.append(f'    @legacy_positional("{m["name"]}", ({names}))')
    head = f"    {kw} {name}({sig}) -> {ret}:"
    if len(head) > 100:
        lines.append(f"    {kw} {name}(")
        for a in args:
            lines.append(f"        {a},")
        lines.append(f"    ) -> {ret}:")
    else:
        lines.append(head)
    lines.append(f'        """{DOCS[m["name"]]} (``{m["name"]}``)"""')
    one = f'        {call}("{m["name"]}", {{{params}}}))'
    if len(one) <= 100:
        lines.append(one)
    else:
        lines.append(f'        {call}("{m["name"]}", {{')
        for p in m["params"]:
            lines.append(f'            "{p["name"]}": {p["name"]},')
        lines.append("        }))")
    return "\n".join(lines)


def py_namespace(flavour, path, node, out):
    """Emits the classes of one namespace (children first); returns the class name."""
    prefix = {"sync": "Sync", "async": "Async", "future": "Future"}[flavour]
    cls = prefix + (pascal(path) if path else "Root")
    children = []
    for key, val in sorted(node.items()):
        if "name" not in val:  # a sub-namespace
            children.append((key, py_namespace(flavour, path + [key], val, out)))
    body = []
    dotted = ".".join(path)
    doc = f"``{dotted}.*`` methods." if path else "The root of the method tree."
    body.append(f"class {cls}:\n    \"\"\"{doc}\"\"\"\n")
    if path:
        body.append("    __slots__ = (\"_r\", " + "".join(f'"{k}", ' for k, _ in children) + ")\n")
        body.append("    def __init__(self, r: Any) -> None:")
        body.append("        self._r = r")
    else:
        body.append("    _r: Any\n")
        body.append("    def _init_api(self, r: Any) -> None:")
        body.append("        self._r = r")
    for key, ccls in children:
        body.append(f"        self.{key} = {ccls}(r)")
    for key, val in sorted(node.items()):
        if "name" in val:
            body.append("")
            body.append(py_method(val, flavour, key))
    out.append("\n".join(body) + "\n")
    return cls


def py_type_names():
    names = {"Embedding"}
    for py, _ in list(NARROW.values()) + list(RESULTS.values()):
        names.update(re.findall(r"\b[A-Z][A-Za-z]+\b", py))
    names -= {"Sequence", "Mapping", "Any", "Future"}
    return sorted(names)


def gen_python(methods, result_names):
    t = tree(methods)
    imports = "    from .results import (\n" + "".join(f"        {n},\n" for n in result_names) \
        + "    )\n"
    imports += "    from .types import (\n" + "".join(f"        {n},\n" for n in py_type_names()) \
        + "    )\n"
    out = [PY_HEADER.replace("__IMPORTS__\n", imports)]
    writes = sorted(m["name"] for m in methods if "write" in m["flags"])
    idem = sorted(m["name"] for m in methods
                  if "write" in m["flags"] and any(p["name"] == "idempotency_key"
                                                   for p in m["params"]))
    out.append("# Methods that change data, and those of them that take an idempotency key.\n")
    out.append("WRITE_METHODS = frozenset({\n" + "".join(f'    "{n}",\n' for n in writes) + "})\n")
    out.append("IDEMPOTENT_METHODS = frozenset({\n" + "".join(f'    "{n}",\n' for n in idem)
               + "})\n")
    out.append("# Every method: name -> parameter names, in the server's order.\n")
    out.append("METHOD_PARAMS: dict[str, tuple[str, ...]] = {\n")
    for m in methods:
        names = "".join(f'"{p["name"]}", ' for p in m["params"])
        out.append(f'    "{m["name"]}": ({names}),\n')
    out.append("}\n\n")
    for flavour in ("sync", "async", "future"):
        classes = []
        py_namespace(flavour, [], t, classes)
        out.append("\n\n".join(classes))
        out.append("\n\n")
    text = "".join(out).rstrip() + "\n"
    return text


# ---- TypeScript ----------------------------------------------------------------------------

TS_HEADER = """// The typed method surface of @engram/client. GENERATED by clients/gen.py from
// clients/methods.json (the server's `methods` answer): do not edit by hand.
__IMPORTS__
/** What the generated methods call: the client's request path. */
export interface Caller {
  call(method: string, params: Record<string, unknown>, options?: CallOptions): Promise<unknown>;
}

/** Every method of the server: its parameters (in the server's order) and flags. */
export const METHODS: Readonly<Record<string, { params: readonly string[]; required: readonly string[]; flags: readonly string[] }>> = {
"""


def ts_result(method):
    """The TypeScript result type of a method: the named ones take the client's id type."""
    r = rtype(method, "ts")
    return r if r in ("string", "MethodInfo[]") else f"{r}<I>"


def ts_type_names():
    names = {"CallOptions", "Id", "EmbeddingInput"}
    for _, ts in list(NARROW.values()) + list(RESULTS.values()):
        names.update(re.findall(r"\b[A-Z][A-Za-z]+\b", ts))
    names.discard("Record")
    return sorted(names)


def gen_ts(methods, result_names):
    names = ts_type_names()
    imports = "import type {\n" + "".join(f"  {n},\n" for n in result_names) \
        + '} from "./results.js";\n'
    imports += "import type {\n" + "".join(f"  {n},\n" for n in names) + '} from "./types.js";\n'
    out = [TS_HEADER.replace("__IMPORTS__\n", imports)]
    for m in methods:
        ps = ", ".join(json.dumps(p["name"]) for p in m["params"])
        rq = ", ".join(json.dumps(p["name"]) for p in m["params"] if p["required"])
        fl = ", ".join(json.dumps(f) for f in m["flags"])
        out.append(f'  "{m["name"]}": {{ params: [{ps}], required: [{rq}], flags: [{fl}] }},\n')
    out.append("};\n\n")
    # parameter interfaces
    for m in methods:
        if not m["params"]:
            continue
        iname = pascal(m["name"].split(".")) + "Params"
        out.append(f"/** Parameters of `{m['name']}`. */\n")
        out.append(f"export interface {iname} {{\n")
        for p in m["params"]:
            opt = "" if p["required"] else "?"
            out.append(f"  {p['name']}{opt}: {ptype(m['name'], p, 'ts')};\n")
        out.append("}\n\n")
    # namespaces
    t = tree(methods)

    def emit(path, node):
        cls = "Api" + pascal(path) if path else "ApiRoot"
        children = [(k, v) for k, v in sorted(node.items()) if "name" not in v]
        child_classes = [(k, emit(path + [k], v)) for k, v in children]
        lines = []
        dotted = ".".join(path)
        doc = f"`{dotted}.*` methods." if path else "The root of the method tree."
        lines.append(f"/** {doc} */")
        lines.append(f"export class {cls}<I extends Id = number> {{")
        for k, c in child_classes:
            lines.append(f"  readonly {camel(k)}: {c}<I>;")
        lines.append("  /** @internal */")
        lines.append("  protected readonly _caller: Caller;")
        lines.append("  constructor(caller: Caller) {")
        lines.append("    this._caller = caller;")
        for k, c in child_classes:
            lines.append(f"    this.{camel(k)} = new {c}<I>(caller);")
        lines.append("  }")
        for key, m in sorted(node.items()):
            if "name" not in m:
                continue
            r = ts_result(m["name"])
            lines.append(f"  /** {DOCS[m['name']]} (`{m['name']}`) */")
            if m["params"]:
                iname = pascal(m["name"].split(".")) + "Params"
                anyreq = any(p["required"] for p in m["params"])
                pdecl = f"params: {iname}" if anyreq else f"params: {iname} = {{}}"
                lines.append(f"  {camel(key)}({pdecl}, options?: CallOptions): Promise<{r}> {{")
                lines.append(f"    return this._caller.call(\"{m['name']}\", "
                             f"params as unknown as Record<string, unknown>, options) as Promise<{r}>;")
            else:
                lines.append(f"  {camel(key)}(options?: CallOptions): Promise<{r}> {{")
                lines.append(f"    return this._caller.call(\"{m['name']}\", {{}}, options) as Promise<{r}>;")
            lines.append("  }")
        lines.append("}")
        out_classes.append("\n".join(lines) + "\n")
        return cls

    out_classes = []
    emit([], t)
    out.append("\n".join(out_classes))
    # method name -> path of the JS property chain (camelCase), for the method-list test
    out.append("\n/** Method name -> the property path of its function on a client. */\n")
    out.append("export const METHOD_PATHS: Readonly<Record<string, readonly string[]>> = {\n")
    for m in methods:
        parts = m["name"].split(".")
        path = ", ".join(json.dumps(camel(p)) for p in parts)
        out.append(f'  "{m["name"]}": [{path}],\n')
    out.append("};\n")
    return "".join(out)


def snapshot(src):
    with open(src) as f:
        methods = json.load(f)
    methods = sorted(methods, key=lambda m: m["name"])
    lines = ["["]
    for i, m in enumerate(methods):
        lines.append(f'  {{"name": {json.dumps(m["name"])}, "flags": {json.dumps(m["flags"])}, '
                     '"params": [')
        for j, p in enumerate(m["params"]):
            comma = "," if j + 1 < len(m["params"]) else ""
            lines.append(f"    {json.dumps(p, sort_keys=True)}{comma}")
        lines.append("  ]" + (f', "result": {json.dumps(m["result"], sort_keys=True)}'
                              if "result" in m else "") + "}" + ("," if i + 1 < len(methods) else ""))
    lines.append("]")
    with open(METHODS_JSON, "w") as f:
        f.write("\n".join(lines) + "\n")


def fetch(where):
    """The `methods` answer of the engramd at [HOST:]PORT (needs no authentication)."""
    import socket

    import msgpack

    host, _, port = where.rpartition(":")
    with socket.create_connection((host or "127.0.0.1", int(port)), timeout=10) as s:
        s.sendall(msgpack.packb([0, 1, "methods", []]))
        up = msgpack.Unpacker(raw=False)
        while True:
            data = s.recv(65536)
            if not data:
                raise SystemExit("gen.py: connection closed before the answer")
            up.feed(data)
            for msg in up:
                if msg[2] is not None:
                    raise SystemExit(f"gen.py: methods failed: {msg[2]}")
                return msg[3]


def main(argv):
    if len(argv) == 3 and argv[1] in ("--snapshot", "--fetch"):
        if argv[1] == "--fetch":
            import tempfile
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(fetch(argv[2]), f)
            snapshot(f.name)
            os.unlink(f.name)
        else:
            snapshot(argv[2])
        return 0
    methods = load_methods()
    missing = [m["name"] for m in methods if m["name"] not in DOCS]
    if missing:
        print("gen.py: no DOCS line for " + ", ".join(missing), file=sys.stderr)
        return 1
    METHOD_RESULTS.update({m["name"]: m.get("result") for m in methods})
    py_results, py_names = gen_results(methods, "py")
    ts_results, ts_names = gen_results(methods, "ts")
    returned = {result_type_name(m["name"]) for m in methods if m["name"] not in RESULTS}
    py_names = [n for n in py_names if n in returned]
    ts_names = [n for n in ts_names if n in returned]
    outputs = {PY_OUT: gen_python(methods, py_names), TS_OUT: gen_ts(methods, ts_names),
               PY_RESULTS_OUT: py_results, TS_RESULTS_OUT: ts_results}
    if len(argv) == 2 and argv[1] == "--check":
        stale = []
        for path, text in outputs.items():
            try:
                with open(path) as f:
                    if f.read() != text:
                        stale.append(path)
            except OSError:
                stale.append(path)
        for path in stale:
            print(f"gen.py: {os.path.relpath(path, HERE)} is out of date; run clients/gen.py",
                  file=sys.stderr)
        return 1 if stale else 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for path, text in outputs.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
