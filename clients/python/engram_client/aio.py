"""The asyncio client: the same methods as the blocking one, as coroutines. Concurrent
calls (``asyncio.gather``) are pipelined on one connection; answers are matched by msgid."""
from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any, Mapping

from . import _config, _tls, _wire
from ._api import AsyncRoot
from ._wire import RetryPolicy
from .errors import (ClientClosed, ClientError, ConnectionLost, EngramError, EngramTimeout,
                     RateLimited, TLSError, Unavailable, error_from_wire)

__all__ = ["AsyncClient"]


_TLS_SHUTDOWN_TIMEOUT = 1.0  # seconds close() waits for the server's TLS close_notify


class _NotSent(ConnectionLost):
    """The request was not written whole: the server cannot have executed it."""


class _ConnectFailed(ConnectionLost):
    """Connecting failed for good (reconnect disabled, or too many tries)."""


class _AConn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client: AsyncClient) -> None:
        self.reader = reader
        self.writer = writer
        self.client = client
        self.pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self.dead = False
        self.answered = False  # an answer came: TLS errors from now on are a lost connection
        self.packer = _wire.packer()
        self.task = asyncio.get_running_loop().create_task(self._read_loop())

    def send(self, method: str, params: Mapping[str, Any]) -> tuple[int, asyncio.Future[Any]]:
        if self.dead:
            raise _NotSent("connection closed")
        msgid = self.client._ids.take(self.pending)
        data = _wire.pack_request(self.packer, msgid, method, params)  # may raise TypeError
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[msgid] = (method, fut)
        try:
            self.writer.write(data)
        except (OSError, RuntimeError) as e:
            self.pending.pop(msgid, None)
            self.fail(ConnectionLost(f"send failed: {e}"))
            raise _NotSent(f"send failed: {e}") from e
        return msgid, fut

    async def _read_loop(self) -> None:
        responses = _wire.ResponseReader()
        try:
            while True:
                data = await self.reader.read(1 << 18)
                if not data:
                    raise ConnectionLost("connection closed by the server")
                for msgid, err, result in responses.feed(data):
                    self.answered = True
                    entry = self.pending.pop(msgid, None)
                    if entry is None or entry[1].done():
                        continue
                    method, fut = entry
                    if err is None:
                        fut.set_result(_wire.convert_embeddings(result, self.client._as_numpy))
                    else:
                        fut.set_exception(error_from_wire(err, method))
        except asyncio.CancelledError:
            self.fail(ConnectionLost("client closed"))
            raise
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, ConnectionLost):
                self.fail(e)
            elif not self.answered and _tls.is_final(e):
                # TLS 1.3: the server's refusal of our certificate comes on the first read
                self.fail(_tls.tls_error(e, self.client._host, self.client._port))
            else:
                self.fail(ConnectionLost(str(e)))

    def fail(self, exc: ClientError) -> None:
        if self.dead:
            return
        self.dead = True
        if self.client._conn is self:
            self.client._conn = None
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001
            pass
        pending = list(self.pending.values())
        self.pending.clear()
        for _, fut in pending:
            if not fut.done():
                # a TLS refusal stays one: it is final, never retried
                fut.set_exception(TLSError(str(exc)) if isinstance(exc, TLSError)
                                  else ConnectionLost(str(exc)))
                fut.exception()  # nobody may be waiting any more: no "never retrieved" noise


class AsyncClient(AsyncRoot):
    """An asyncio Engram client with the methods of :class:`engram_client.Client` as
    coroutines: ``await client.memory.store(...)``. Use ``async with AsyncClient(...)``
    or call :meth:`close`. Calls may run concurrently; they share one connection.
    Timeouts, retries, reconnects, idempotency keys and the TLS options (``tls``,
    ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``, ``tls_server_hostname``) behave as
    in the blocking client.
    """

    def __init__(self, host: str | None = None, port: int | None = None, *,
                 url: str | None = None, api_key: str | None = None, timeout: float = 30.0,
                 connect_timeout: float = 1.0, retry: RetryPolicy | None = None,
                 reconnect: bool = True, numpy_embeddings: bool | None = None,
                 tls: bool | ssl.SSLContext | None = None, tls_ca_file: str | None = None,
                 tls_cert_file: str | None = None, tls_key_file: str | None = None,
                 tls_server_hostname: str | None = None) -> None:
        cfg = _config.resolve(host, port, url, api_key, tls, tls_ca_file, tls_cert_file,
                              tls_key_file, tls_server_hostname)
        self._tls = _tls.make_context(cfg.tls, cfg.tls_ca_file, cfg.tls_cert_file,
                                      cfg.tls_key_file)
        self._server_hostname = cfg.tls_server_hostname or cfg.host
        self._host = cfg.host
        self._port = cfg.port
        self._api_key = cfg.api_key
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._retry = retry or RetryPolicy()
        self._reconnect = reconnect
        self._as_numpy = _wire.numpy_available() if numpy_embeddings is None else numpy_embeddings
        self._ids = _wire.MsgIds()
        self._conn: _AConn | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._closed = False
        self._init_api(self)

    def __repr__(self) -> str:  # never shows the key
        tls = ", tls=True" if self._tls is not None else ""
        return f"AsyncClient({self._host!r}, {self._port}{tls})"

    async def connect(self) -> AsyncClient:
        """Connects (and authenticates) now instead of on the first call."""
        await self._connection(asyncio.get_running_loop().time() + self._timeout)
        return self

    async def close(self) -> None:
        """Closes the connection; waiting calls fail with ConnectionLost."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail(ConnectionLost("client closed"))
            conn.task.cancel()
            try:
                await conn.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            try:
                await conn.writer.wait_closed()
            except Exception:  # noqa: BLE001
                pass

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        """Calls any method by name: ``await call("memory.get", ids=[1])``."""
        p = dict(params or {})
        p.update(kw)
        return await self._acall(method, p)

    # -- connection ------------------------------------------------------------------------

    async def _connection(self, deadline: float) -> _AConn:
        if self._closed:
            raise ClientClosed("client is closed")
        if self._conn is not None:
            return self._conn
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        async with self._connect_lock:
            attempt = 0
            while self._conn is None:
                attempt += 1
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise EngramTimeout(f"could not connect to {self._host}:{self._port} in time")
                tls_args: dict[str, Any] = {}
                if self._tls is not None:
                    # closing sends close_notify; a server that never answers it must
                    # not hold close() for asyncio's default of 30 s
                    tls_args = {"ssl": self._tls, "server_hostname": self._server_hostname,
                                "ssl_shutdown_timeout": _TLS_SHUTDOWN_TIMEOUT}
                try:
                    r, w = await asyncio.wait_for(
                        asyncio.open_connection(self._host, self._port, limit=1 << 20,
                                                **tls_args),
                        min(self._connect_timeout, remaining))
                except (OSError, asyncio.TimeoutError) as e:
                    if _tls.is_final(e):  # a certificate or name that does not verify
                        raise _tls.tls_error(e, self._host, self._port) from e
                    if self._closed:
                        raise ClientClosed("client is closed") from e
                    if not _wire.retry_connect(self._retry, self._reconnect, attempt, e):
                        raise _ConnectFailed(_wire.connect_failure(
                            self._host, self._port, e, self._connect_timeout)) from None
                    await asyncio.sleep(min(self._retry.backoff(attempt), max(0.0, remaining)))
                    continue
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = _AConn(r, w, self)
                if self._api_key is not None:
                    try:
                        _, fut = conn.send("auth", {"api_key": self._api_key})
                        await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
                    except ConnectionLost as e:
                        conn.fail(ConnectionLost("connection lost during auth"))
                        if not _wire.retry_connect(self._retry, self._reconnect, attempt, e):
                            raise _ConnectFailed(f"cannot connect to {self._host}:{self._port}: "
                                                 "the connection was lost during auth") from None
                        await asyncio.sleep(min(self._retry.backoff(attempt),
                                                max(0.0, deadline - loop.time())))
                        continue
                    except asyncio.TimeoutError:
                        conn.fail(ConnectionLost("auth timed out"))
                        raise EngramTimeout("auth timed out") from None
                    except BaseException:
                        conn.fail(ConnectionLost("auth failed"))
                        raise
                if self._closed:
                    conn.fail(ConnectionLost("client closed"))
                    raise ClientClosed("client is closed")
                self._conn = conn
            return self._conn

    # -- what the generated methods use ----------------------------------------------------

    async def _once(self, method: str, params: Mapping[str, Any], deadline: float) -> Any:
        loop = asyncio.get_running_loop()
        conn = await self._connection(deadline)
        msgid, fut = conn.send(method, params)
        try:
            await conn.writer.drain()  # backpressure; a broken connection shows in fut
        except (OSError, RuntimeError):
            pass
        try:
            return await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            conn.pending.pop(msgid, None)
            raise EngramTimeout(f"{method}: no answer in time") from None

    async def _acall(self, method: str, params: Mapping[str, Any]) -> Any:
        return await self._request(method, params, self._timeout, self._retry)

    async def _request(self, method: str, params: Mapping[str, Any], timeout: float,
                       retry: RetryPolicy) -> Any:
        params = _wire.prepare_params(method, params)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            attempt += 1
            sent = True
            try:
                result = await self._once(method, params, deadline)
            except _ConnectFailed:
                raise
            except _NotSent as e:
                exc: EngramError | ConnectionLost = e
                sent = False
            except (ConnectionLost, RateLimited, Unavailable) as e:
                exc = e
            else:
                if method == "auth":
                    self._api_key = params.get("api_key")
                return result
            if method == "auth" and isinstance(exc, EngramError):
                self._api_key = None
            delay = None
            if self._reconnect or not isinstance(exc, ConnectionLost):
                delay = _wire.retry_delay(retry, method, exc, attempt, sent)
            if delay is None or loop.time() + delay >= deadline:
                if isinstance(exc, ConnectionLost):
                    maybe = sent and not _wire.safe_to_repeat(method)
                    msg = f"{exc} during {method}"
                    if maybe:
                        msg += "; the write may or may not have been applied"
                    raise ConnectionLost(msg, maybe_committed=maybe) from None
                raise exc
            await asyncio.sleep(delay)

    def with_options(self, *, timeout: float | None = None,
                     retry: RetryPolicy | None = None) -> AsyncClient:
        """A view of this client (same connection) with another timeout or retry policy."""
        view = _AsyncView(self, timeout if timeout is not None else self._timeout,
                          retry or self._retry)
        return view  # type: ignore[return-value]


class _AsyncView(AsyncRoot):
    """with_options(): the methods of an AsyncClient with other defaults."""

    def __init__(self, base: AsyncClient, timeout: float, retry: RetryPolicy) -> None:
        self._base = base
        self._timeout = timeout
        self._retry = retry
        self._init_api(self)

    async def _acall(self, method: str, params: Mapping[str, Any]) -> Any:
        return await self._base._request(method, params, self._timeout, self._retry)

    async def call(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        p = dict(params or {})
        p.update(kw)
        return await self._acall(method, p)
