"""Every method returns a typed result: a TypedDict generated from the server's result
schema (engram_client/results.py) or written by hand (types.py), never a plain dict, checked
by mypy --strict; and each hand-written result type names every field the schema has."""
import importlib.util
import json
import os
import subprocess
import sys
import typing

import engram_client.results as results
import engram_client.types as types
from engram_client._api import METHOD_PARAMS

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
CLIENTS = os.path.dirname(PKG)


def load_gen():
    spec = importlib.util.spec_from_file_location("engram_gen", os.path.join(CLIENTS, "gen.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def snapshot():
    with open(os.path.join(CLIENTS, "methods.json")) as f:
        return {m["name"]: m for m in json.load(f)}


def mypy(path):
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "--config-file", os.path.join(PKG, "pyproject.toml"), path],
                          cwd=PKG, capture_output=True, text=True, timeout=300)


def test_the_package_is_mypy_strict_clean():
    r = mypy("engram_client")
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_result_is_a_typed_dict_under_mypy(tmp_path):
    """For each method of each flavour, a field no result has is looked up in what it
    returns: mypy must refuse every one of those lines (a dict[str, Any] would let it pass)."""
    names = sorted(METHOD_PARAMS)
    lines = ["from __future__ import annotations",
             "from concurrent.futures import Future",
             "from typing import Awaitable, Callable, TypeVar",
             "from engram_client import AsyncClient, Client",
             "from engram_client._api import FutureRoot",
             "T = TypeVar('T')",
             "def ret(f: Callable[..., T]) -> T: raise NotImplementedError",
             "async def aret(f: Callable[..., Awaitable[T]]) -> T: raise NotImplementedError",
             "def fret(f: Callable[..., Future[T]]) -> T: raise NotImplementedError",
             "async def use(c: Client, a: AsyncClient, p: FutureRoot) -> None:"]
    expect = {}
    for n in names:
        # `methods` answers a list of MethodInfo; ping a string (a str index is refused too)
        tail = '[0]["no_such_field"]' if n == "methods" else '["no_such_field"]'
        for flavour, expr in (("sync", f"ret(c.{n})"), ("async", f"(await aret(a.{n}))"),
                              ("future", f"fret(p.{n})")):
            lines.append(f"    {expr}{tail}")
            expect[len(lines)] = (flavour, n)
    src = tmp_path / "use_results.py"
    src.write_text("\n".join(lines) + "\n")
    r = mypy(str(src))
    flagged = {int(l.split(":")[1]) for l in r.stdout.splitlines()
               if l.startswith(str(src)) and ": error:" in l}
    missed = sorted(v for k, v in expect.items() if k not in flagged)
    assert not missed, f"untyped results (no error for an unknown field): {missed}\n{r.stdout}"
    others = [l for l in r.stdout.splitlines() if ": error:" in l
              and int(l.split(":")[1]) not in expect]
    assert not others, others


def test_no_method_returns_a_plain_dict():
    text = open(os.path.join(PKG, "engram_client", "_api.py")).read()
    assert "-> dict[" not in text and "Future[dict[" not in text
    gen = load_gen()
    for name in METHOD_PARAMS:
        r = gen.RESULTS.get(name, (None,))[0] or snapshot()[name]["result"].get("title") \
            or gen.pascal(name.split(".")) + "Result"
        r = r.removeprefix("list[").removesuffix("]")
        if r == "str":
            continue
        cls = getattr(results, r, None) or getattr(types, r)
        assert typing.is_typeddict(cls), (name, r)


def keys(cls):
    return set(cls.__required_keys__) | set(cls.__optional_keys__)


def test_hand_written_results_name_every_schema_field():
    """types.py's result types say more than the schema (see gen.py); they must not say less."""
    gen = load_gen()
    snap = snapshot()
    checked = 0
    for name, (py, _) in gen.RESULTS.items():
        schema = snap[name].get("result")
        if py in ("str", "list[MethodInfo]") or schema is None:
            continue
        cls = getattr(types, py)
        props = dict(schema.get("properties", {}))
        required = set(schema.get("required", []))
        for part in schema.get("allOf", []):
            props.update(part.get("properties", {}))
            required |= set(part.get("required", []))
        assert props, name
        assert set(props) <= keys(cls), (name, py, sorted(set(props) - keys(cls)))
        checked += 1
    assert checked >= 20


def test_enum_parameters_take_only_their_words():
    """A parameter the server declares a set of strings for (`enum` in its `methods` answer)
    is typed as those words (a Literal, or a named alias gen.py checks against them), never
    as any str; mypy refuses a word outside the set."""
    import inspect

    snap = snapshot()
    enums = [(m, p) for m in snap.values() for p in m["params"] if "enum" in p]
    assert len(enums) >= 30
    for m, p in enums:
        ann = inspect.signature(getattr(sync_ns(m["name"]), m["name"].rsplit(".", 1)[-1]))\
            .parameters[p["name"]].annotation
        bare = ann.removesuffix(" | None")
        assert bare not in ("str", "Sequence[str]"), (m["name"], p["name"], ann)


def sync_ns(name):
    """The Sync* class holding method name."""
    import engram_client._api as api
    parts = name.split(".")[:-1]
    return getattr(api, "Sync" + load_gen().pascal(parts) if parts else "SyncRoot")


def test_mypy_refuses_a_word_outside_an_enum(tmp_path):
    src = tmp_path / "use_enums.py"
    src.write_text("\n".join([
        "from engram_client import Client",
        "def use(c: Client) -> None:",
        "    c.memory.search(query='x', mode='vector', scopes=['agent'])",
        "    c.memory.search(query='x', mode='fuzzy')",
        "    c.memory.context(query='x', format='html')",
        "    c.session.work_item.list(1, statuses=['open', 'lost'])",
    ]) + "\n")
    r = mypy(str(src))
    lines = {int(l.split(":")[1]) for l in r.stdout.splitlines() if ": error:" in l}
    assert lines == {4, 5, 6}, r.stdout
