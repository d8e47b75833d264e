"""The old argument style of the generated methods, kept working with a DeprecationWarning.

Before 0.2 every required parameter could be given by position, in the server's order
(``memory.store("text", "fact", 0.8)``, ``session.summarize(summary, through, n,
session_id=s)``). Now only the identifiers of what a call acts on are positional (see
clients/gen.py, PY_TARGETS) and everything else is keyword-only. Type checkers see only the
new signature; at run time :func:`legacy_positional` maps an old-style call onto it."""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def legacy_positional(method: str, old: tuple[str, ...]) -> Callable[[F], F]:
    """Wraps a generated method so that a call in the old style, ``old`` being the names it
    took by position, still works: the positional values are passed by those names and a
    DeprecationWarning says what to write instead. A call that fits the new signature is
    passed through untouched; one that fits neither gets Python's own TypeError."""

    def deco(fn: F) -> F:
        params = list(inspect.signature(fn).parameters.values())[1:]  # without self
        new = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        required = {p.name for p in params if p.default is p.empty}

        def bind(args: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any] | None:
            """The keywords of an old-style call, or None when the call is not one."""
            if len(args) <= len(new) and required <= set(new[:len(args)]) | kw.keys():
                return None  # the new style
            if len(args) > len(old):
                return None
            moved = dict(zip(old, args))
            if moved.keys() & kw.keys() or not required <= moved.keys() | kw.keys():
                return None
            keywords = ", ".join(f"{n}=" for n in old[:len(args)] if n not in new)
            warnings.warn(
                f"{method}: pass {keywords} by keyword; only "
                + (", ".join(new) if new else "nothing") + " may be given by position "
                "(the positional form of engram_client 0.1 is deprecated)",
                DeprecationWarning, stacklevel=3)
            moved.update(kw)
            return moved

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(self: Any, *args: Any, **kw: Any) -> Any:
                moved = bind(args, kw)
                if moved is None:
                    return await fn(self, *args, **kw)
                return await fn(self, **moved)
            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
            moved = bind(args, kw)
            if moved is None:
                return fn(self, *args, **kw)
            return fn(self, **moved)
        return wrapper  # type: ignore[return-value]

    return deco
