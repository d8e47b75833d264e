"""Exceptions: one class per server error code, plus the client's own failures.

Every server error is an :class:`EngramError` carrying ``code``, ``message`` and the
error map's other fields in ``data``; the subclass is chosen by ``code`` (see
docs/protocol.md, "Errors"). Fields that some codes add (``limit``, ``usage``,
``retry_after_ms``, ...) are also attributes of the matching subclass.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = [
    "EngramError", "InvalidArgument", "MalformedRequest", "UnknownMethod", "Unauthenticated",
    "PermissionDenied", "NotFound", "AlreadyExists", "Conflict", "QuotaExceeded",
    "RateLimited", "CostLimitExceeded", "Unavailable", "InternalError",
    "ClientError", "ConnectionLost", "TLSError", "EngramTimeout", "ClientClosed",
    "error_from_wire", "field_from_message", "ResultTooLarge",
    "ERROR_CLASSES",
]


class EngramError(Exception):
    """An error answered by the server. ``code`` is the stable error code."""

    code: str = ""

    def __init__(self, message: str = "", code: str | None = None,
                 data: Mapping[str, Any] | None = None, method: str | None = None) -> None:
        if code is not None:
            self.code = code
        self.message = message
        self.data: dict[str, Any] = dict(data or {})
        self.method = method
        where = f" ({method})" if method else ""
        super().__init__(f"{self.code}: {message}{where}")


class InvalidArgument(EngramError):
    """A parameter is missing, of the wrong type, out of range or unknown. ``field`` names
    it: the server's ``field`` when it sends one, else the parameter its message quotes
    (``parameter 'top_k' must be ...``, ``unknown parameter 'x'``, ``missing required
    parameter 'x'``; a path such as ``memories[3].importance`` inside a batch), else None."""
    code = "invalid_argument"

    @property
    def field(self) -> str | None:
        v = self.data.get("field")
        if isinstance(v, str) and v:
            return v
        return field_from_message(self.message)


# The first quoted name in a message: after "parameter", "parameters" or "field"
# ("unknown parameter 'x'", "missing required parameter 'x'", "parameters 'type' and
# 'memory_type' ...", "unknown field 'metadata.x'"), or a quoted name that opens it
# ("'memories[3]' must be a map"). A batch item's errors open with its path
# ("memories[3]: parameter 'importance' ..."), which is put in front of the name.
_PREFIX = re.compile(r"^([A-Za-z_]\w*(?:\[\d+\])?(?:\.\w+(?:\[\d+\])?)*): ")
_QUOTED = re.compile(r"(?:\b(?:parameters?|field)\s+|^)'([^']+)'")


def field_from_message(message: str) -> str | None:
    """The parameter an invalid_argument message names (``memories[3].importance`` for a
    batch item's), or None."""
    prefix = ""
    m = _PREFIX.match(message)
    if m:
        prefix, message = m.group(1), message[m.end():]
    q = _QUOTED.search(message)
    if q is None:
        return None
    name = q.group(1)
    if prefix and name != prefix and not name.startswith((prefix + ".", prefix + "[")):
        name = f"{prefix}.{name}"
    return name


class MalformedRequest(EngramError):
    """The message itself was malformed; the server closed the connection."""
    code = "malformed_request"


class UnknownMethod(EngramError):
    """The server has no such method."""
    code = "unknown_method"


class Unauthenticated(EngramError):
    """The connection has not authenticated, or its key is invalid or revoked."""
    code = "unauthenticated"


class PermissionDenied(EngramError):
    """The connection may not call this method (admin-only, tenant-only, or the tier)."""
    code = "permission_denied"


class NotFound(EngramError):
    """The named object does not exist (or belongs to another tenant)."""
    code = "not_found"


class AlreadyExists(EngramError):
    """The object to create exists already."""
    code = "already_exists"


class Conflict(EngramError):
    """The object's state does not allow the call (stale version, ended session, ...)."""
    code = "conflict"


class QuotaExceeded(EngramError):
    """A tier limit was reached: ``limit`` and ``usage`` say which and how far."""
    code = "quota_exceeded"

    @property
    def limit(self) -> int | None:
        return self.data.get("limit")

    @property
    def usage(self) -> int | None:
        return self.data.get("usage")

    @property
    def requested(self) -> int | None:
        return self.data.get("requested")

    @property
    def resets_at(self) -> int | None:
        """For the daily query limit: the next 00:00 UTC, ms since the epoch."""
        return self.data.get("resets_at")


class RateLimited(EngramError):
    """Too many requests; the call had no effect. Retry after ``retry_after_ms``."""
    code = "rate_limited"

    @property
    def retry_after_ms(self) -> int:
        v = self.data.get("retry_after_ms")
        return int(v) if isinstance(v, (int, float)) else 0


class CostLimitExceeded(EngramError):
    """A session's cost cap would be passed; nothing was stored."""
    code = "cost_limit_exceeded"

    @property
    def limit(self) -> float | None:
        return self.data.get("limit")

    @property
    def usage(self) -> float | None:
        return self.data.get("usage")

    @property
    def cost(self) -> float | None:
        return self.data.get("cost")

    @property
    def session_id(self) -> int | None:
        return self.data.get("session_id")


class Unavailable(EngramError):
    """The database (or another dependency) cannot be reached right now."""
    code = "unavailable"


class InternalError(EngramError):
    """A bug or resource exhaustion in the server."""
    code = "internal"


class ResultTooLarge(EngramError):
    """The answer would pass the server's ``max_result_bytes`` (``limit``; ``size`` is the
    answer's): ask for less (fewer ids, a smaller ``top_k`` or page)."""
    code = "result_too_large"

    @property
    def limit(self) -> int | None:
        return self.data.get("limit")

    @property
    def size(self) -> int | None:
        return self.data.get("size")


ERROR_CLASSES: dict[str, type[EngramError]] = {
    c.code: c for c in (InvalidArgument, MalformedRequest, UnknownMethod, Unauthenticated,
                        PermissionDenied, NotFound, AlreadyExists, Conflict, QuotaExceeded,
                        RateLimited, CostLimitExceeded, Unavailable, InternalError, ResultTooLarge)
}


def error_from_wire(err: Any, method: str | None = None) -> EngramError:
    """Returns the exception for a response's error field (a map ``{code, message, ...}``)."""
    if not isinstance(err, Mapping):
        return EngramError(repr(err), code="internal", method=method)
    code = str(err.get("code", "internal"))
    message = str(err.get("message", ""))
    data = {k: v for k, v in err.items() if k not in ("code", "message")}
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return EngramError(message, code=code, data=data, method=method)
    return cls(message, data=data, method=method)


class ClientError(Exception):
    """A failure on the client's side of the connection (not an answer from the server)."""


class ConnectionLost(ClientError, ConnectionError):
    """The connection broke before the answer came.

    ``maybe_committed`` is true when the request had been sent and is a write that cannot
    be safely repeated (no idempotency key): it may or may not have taken effect."""

    def __init__(self, message: str, maybe_committed: bool = False) -> None:
        super().__init__(message)
        self.maybe_committed = maybe_committed


class TLSError(ClientError, ConnectionError):
    """TLS with the server failed in a way another attempt would meet again, so the call
    is not retried: the server's certificate did not verify against the CA (or the
    system's store), it does not name the host connected to, the server refused the
    client's certificate, or the port does not speak TLS 1.3. The message says which."""


class EngramTimeout(ClientError, TimeoutError):
    """No answer within the call's timeout (retries included)."""


class ClientClosed(ClientError):
    """The client was closed."""
