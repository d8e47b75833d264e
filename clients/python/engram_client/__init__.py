"""engram_client: Python client for Engram, the memory server for agents.

    from engram_client import Client
    with Client("127.0.0.1", 7420, api_key=KEY) as c:   # or Client(): ENGRAM_URL, ENGRAM_API_KEY
        c.memory.store(content="The user prefers metric units", type="preference",
                       importance=0.8)
        print(c.memory.search(query="units", top_k=3)["results"])

``AsyncClient`` has the same methods as coroutines. Errors are subclasses of
:class:`EngramError`, one per error code (``engram_client.errors``).
"""
from ._wire import NO_RETRY, RetryPolicy
from .aio import AsyncClient
from .client import Client, Pipeline
from .errors import (AlreadyExists, ClientClosed, ClientError, Conflict, ConnectionLost,
                     CostLimitExceeded, EngramError, EngramTimeout, InternalError,
                     InvalidArgument, MalformedRequest, NotFound, PermissionDenied,
                     QuotaExceeded, RateLimited, ResultTooLarge, TLSError, Unauthenticated,
                     Unavailable, UnknownMethod)

__version__ = "0.2.0"

__all__ = [
    "Client", "AsyncClient", "Pipeline", "RetryPolicy", "NO_RETRY",
    "EngramError", "InvalidArgument", "MalformedRequest", "UnknownMethod", "Unauthenticated",
    "PermissionDenied", "NotFound", "AlreadyExists", "Conflict", "QuotaExceeded",
    "RateLimited", "CostLimitExceeded", "Unavailable", "InternalError", "ResultTooLarge",
    "ClientError", "ConnectionLost", "TLSError", "EngramTimeout", "ClientClosed",
]
