"""Wire details shared by the blocking and the asyncio client: packing requests, reading
responses (ResponseReader), embeddings, and the retry policy. No I/O happens here."""
from __future__ import annotations

import random
import sys
import uuid
from array import array
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import msgpack

from ._api import IDEMPOTENT_METHODS, WRITE_METHODS
from .errors import ConnectionLost, EngramError, RateLimited, Unavailable

_np: Any
try:  # numpy is optional: used without copying when present
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None

LITTLE_ENDIAN = sys.byteorder == "little"
MAX_MSGID = 0xFFFFFFFF
MAX_MESSAGE = 64 << 20


@dataclass(frozen=True)
class RetryPolicy:
    """When a call is repeated automatically.

    - ``rate_limited``: always safe (the call had no effect); waits ``retry_after_ms``
      (when ``honor_rate_limits``).
    - ``unavailable`` and a lost connection: repeated only when repeating cannot apply a
      write twice: reads, and writes carrying an idempotency key (``memory.store`` and
      ``memory.store_batch``, for which the client generates one). A request that never
      reached the socket is always safe.
    ``max_retries`` bounds the repetitions of one call; every wait is capped by the call's
    timeout. Backoff: ``backoff_base`` doubled per attempt up to ``backoff_max``, jittered.
    """

    max_retries: int = 4
    honor_rate_limits: bool = True
    max_rate_limit_wait: float = 10.0
    backoff_base: float = 0.05
    backoff_max: float = 2.0

    def backoff(self, attempt: int) -> float:
        """The delay before reconnect or retry number ``attempt`` (1-based), in seconds."""
        d = min(self.backoff_max, self.backoff_base * (2 ** max(0, attempt - 1)))
        return float(d / 2 + random.random() * d / 2)


NO_RETRY = RetryPolicy(max_retries=0, honor_rate_limits=False)


def safe_to_repeat(method: str) -> bool:
    """True when sending ``method`` twice cannot apply it twice."""
    return method not in WRITE_METHODS or method in IDEMPOTENT_METHODS


def retry_delay(policy: RetryPolicy, method: str, exc: BaseException, attempt: int,
                sent: bool = True) -> float | None:
    """Seconds to wait before repeating a call that failed with ``exc`` on try number
    ``attempt`` (1-based), or None when it must not be repeated."""
    if attempt > policy.max_retries:
        return None
    if isinstance(exc, RateLimited):
        if not policy.honor_rate_limits:
            return None
        wait = exc.retry_after_ms / 1000.0
        if wait > policy.max_rate_limit_wait:
            return None
        return max(wait, 0.001)
    if isinstance(exc, Unavailable) or isinstance(exc, ConnectionLost):
        if sent and not safe_to_repeat(method):
            return None
        return policy.backoff(attempt)
    return None


def retry_connect(policy: RetryPolicy, reconnect: bool, attempt: int,
                  exc: BaseException) -> bool:
    """True when connection attempt number ``attempt`` (1-based), which failed with
    ``exc``, is to be followed by another. A refused or reset connection is tried again at
    most ``policy.max_retries`` times, after the policy's backoff (by default 4 more tries
    within about 0.75 s); an attempt that timed out is not (it already waited
    connect_timeout), nor is anything with reconnect off."""
    if not reconnect or attempt > policy.max_retries:
        return False
    return not isinstance(exc, TimeoutError)


def connect_failure(host: str, port: int, exc: BaseException, connect_timeout: float) -> str:
    """The message of a connection that could not be made."""
    if isinstance(exc, TimeoutError):
        return f"cannot connect to {host}:{port}: no answer within {connect_timeout:g} s"
    return f"cannot connect to {host}:{port}: {exc}"


def new_idempotency_key() -> str:
    return "py-" + uuid.uuid4().hex


# ---- embeddings -------------------------------------------------------------------------


def embedding_bytes(v: Any) -> Any:
    """A vector as the wire's compact form: bytes-like little-endian float32.

    numpy float32 arrays (C-contiguous, little-endian) and ``array('f')`` are passed as a
    memoryview of their own memory: no copy. Lists and other dtypes are converted once.
    bytes/bytearray/memoryview are taken to be float32 already."""
    if isinstance(v, (bytes, bytearray)):
        return v
    if isinstance(v, memoryview):
        return v.cast("B") if v.format != "B" else v
    if isinstance(v, array):
        if v.typecode == "f" and LITTLE_ENDIAN:
            return memoryview(v).cast("B")
        a = array("f", v)
        if not LITTLE_ENDIAN:
            a.byteswap()
        return a.tobytes()
    if _np is not None and isinstance(v, _np.ndarray):
        n = _np.ascontiguousarray(v.reshape(-1), dtype="<f4")  # no copy when already so
        return memoryview(n).cast("B")
    f = array("f", (float(x) for x in v))
    if not LITTLE_ENDIAN:
        f.byteswap()
    return f.tobytes()


def _fix_item_embedding(item: Any) -> Any:
    if isinstance(item, Mapping) and item.get("embedding") is not None \
            and not isinstance(item["embedding"], Mapping):
        item = dict(item)
        item["embedding"] = embedding_bytes(item["embedding"])
    return item


def prepare_params(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Drops None-valued parameters, converts embeddings, and adds an idempotency key to
    writes that take one. Returns a new dict (the caller's mapping is not changed)."""
    out = {k: v for k, v in params.items() if v is not None}
    e = out.get("embedding")
    if e is not None and not isinstance(e, Mapping):  # admin.tenant.create's is a map
        out["embedding"] = embedding_bytes(e)
    if method == "memory.store_batch" and "memories" in out:
        out["memories"] = [_fix_item_embedding(m) for m in out["memories"]]
    if method in IDEMPOTENT_METHODS and "idempotency_key" not in out:
        out["idempotency_key"] = new_idempotency_key()
    return out


def _pack_default(o: Any) -> Any:
    if _np is not None:
        if isinstance(o, _np.ndarray):
            return memoryview(_np.ascontiguousarray(o.reshape(-1), dtype="<f4")).cast("B")
        if isinstance(o, _np.generic):
            return o.item()
    if isinstance(o, array):
        return embedding_bytes(o)
    if isinstance(o, (tuple, set, frozenset)):
        return list(o)
    raise TypeError(f"cannot send a value of type {type(o).__name__}")


def packer() -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, default=_pack_default, autoreset=True)


def pack_request(pk: msgpack.Packer, msgid: int, method: str, params: Mapping[str, Any]) -> bytes:
    data: bytes = pk.pack([0, msgid, method, [params] if params else []])
    return data


def decode_embedding(b: bytes, as_numpy: bool) -> Any:
    """A bin of little-endian float32 as a numpy array (zero-copy view) or array('f')."""
    if as_numpy and _np is not None:
        return _np.frombuffer(b, dtype="<f4")
    a = array("f")
    a.frombytes(b)
    if not LITTLE_ENDIAN:
        a.byteswap()
    return a


def convert_embeddings(result: Any, as_numpy: bool) -> Any:
    """Turns ``embedding`` bins in memory maps (memory.list with include_embedding) into
    vectors, in place."""
    if isinstance(result, dict):
        mems = result.get("memories")
        if isinstance(mems, list):
            for m in mems:
                if isinstance(m, dict) and isinstance(m.get("embedding"), (bytes, bytearray)):
                    m["embedding"] = decode_embedding(m["embedding"], as_numpy)
    return result


def numpy_available() -> bool:
    return _np is not None


class MsgIds:
    """Allocates request ids: unsigned 32-bit, wrapping, skipping ids still in use."""

    def __init__(self) -> None:
        self._next = random.randint(1, 1 << 20)

    def take(self, in_use: Mapping[int, Any]) -> int:
        while True:
            i = self._next
            self._next = 1 if i >= MAX_MSGID else i + 1
            if i not in in_use:
                return i


def parse_response(msg: Any) -> tuple[int, Any, Any] | None:
    """(msgid, error, result) of a response, or None for anything else (notifications)."""
    if isinstance(msg, (list, tuple)) and len(msg) == 4 and msg[0] == 1:
        return msg[1], msg[2], msg[3]
    return None


class ResponseReader:
    """Turns the bytes a connection receives into the responses they carry, with no I/O:
    both clients feed it whatever each read returned (part of a message, or several) and
    get back the responses completed so far.

    ``feed(data)`` returns an iterator of ``(msgid, error, result)`` for every response
    that ``data`` completed, in arrival order; an incomplete message is kept for the next
    feed. Valid messages that are not responses (notifications) are skipped. The reader
    holds at most ``max_message`` bytes (MAX_MESSAGE by default), and no string, binary,
    array or map in a message may be longer. A stream that breaks these limits or is not
    MessagePack raises ConnectionLost, from feed or while iterating (after the responses
    before the fault were yielded); the stream cannot be resynchronised, so the caller
    drops the connection, and every later feed raises the same error."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._max = max_message
        self._up = msgpack.Unpacker(raw=False, strict_map_key=False,
                                    max_buffer_size=max_message)
        self._error: str | None = None

    def feed(self, data: bytes) -> Iterator[tuple[int, Any, Any]]:
        """Adds data (bytes-like, may be empty); returns the iterator described above.
        Raises ConnectionLost at once when the bytes held would exceed max_message."""
        if self._error is not None:
            raise ConnectionLost(self._error)
        try:
            self._up.feed(data)
        except msgpack.BufferFull:
            raise self._fail(f"the server sent a message over {self._max} bytes") from None
        return self._responses()

    def _responses(self) -> Iterator[tuple[int, Any, Any]]:
        while True:
            if self._error is not None:
                raise ConnectionLost(self._error)
            try:
                msg = next(self._up)
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001 - msgpack raises several kinds for bad bytes
                raise self._fail(f"the server sent a malformed message: "
                                 f"{type(e).__name__}: {e}".rstrip(": ")) from None
            r = parse_response(msg)
            if r is not None:
                yield r

    def _fail(self, why: str) -> ConnectionLost:
        self._error = why
        return ConnectionLost(why)


__all__ = ["RetryPolicy", "NO_RETRY", "EngramError"]
