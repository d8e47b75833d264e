"""The blocking client: one TCP (or TLS) connection, a reader thread matching answers to
requests by msgid (so any number of threads, and the ``pipeline`` futures, share the
connection with requests in flight together), reconnect with backoff, re-authentication,
retries."""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Mapping

from . import _config, _tls, _wire
from ._api import FutureRoot, SyncRoot
from ._wire import RetryPolicy
from .errors import (ClientClosed, ClientError, ConnectionLost, EngramError, EngramTimeout,
                     TLSError, Unauthenticated, error_from_wire)

__all__ = ["Client", "Pipeline", "RetryPolicy"]


class _Request:
    __slots__ = ("method", "params", "future", "attempt", "deadline", "done", "msgid", "conn",
                 "retry", "internal")

    def __init__(self, method: str, params: dict[str, Any], deadline: float,
                 retry: RetryPolicy, internal: bool = False) -> None:
        self.internal = internal  # the client's own auth after (re)connecting
        self.method = method
        self.params = params
        self.future: Future[Any] = Future()
        self.future.set_running_or_notify_cancel()
        self.attempt = 0
        self.deadline = deadline
        self.done = False
        self.msgid = 0
        self.conn: _Conn | None = None
        self.retry = retry


class _PlainSocket:
    """A TCP socket as the connection uses it: the reader thread waits and reads while
    other threads write whole messages (a socket allows one of each at a time)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        self.sock = sock

    def wait_readable(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        return bool(ready)

    def recv(self, n: int) -> bytes | None:
        return self.sock.recv(n)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class _TLSSocket:
    """A TLS session as the connection uses it. An OpenSSL session must not be used by two
    threads at once, but the reader thread reads while other threads write: the socket is
    non-blocking, every SSL call is made under ``lock`` and never waits, and the waiting
    (select) happens outside it. A write that would block is repeated with the same bytes
    until done, as OpenSSL requires."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.lock = threading.Lock()
        self.closed = False

    def wait_readable(self, timeout: float) -> bool:
        with self.lock:
            if self.closed:
                raise ConnectionLost("connection closed")
            if self.sock.pending():  # decrypted bytes already inside OpenSSL
                return True
        ready, _, _ = select.select([self.sock], [], [], timeout)
        return bool(ready)

    def recv(self, n: int) -> bytes | None:
        """Up to n bytes, b"" at the end of the stream, None when the bytes that arrived
        held no application data (a session ticket, a partial record)."""
        with self.lock:
            if self.closed:
                raise ConnectionLost("connection closed")
            try:
                return self.sock.recv(n)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return None

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view.nbytes:
            with self.lock:
                if self.closed:
                    raise OSError("connection closed")
                try:
                    n = self.sock.send(view)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    n = 0
            if n:
                view = view[n:]
                continue
            try:
                select.select([], [self.sock], [], 0.25)
            except (ValueError, OSError) as e:  # closed by another thread meanwhile
                raise OSError(f"connection closed: {e}") from e

    def close(self) -> None:
        with self.lock:
            self.closed = True
            try:
                # the socket's own shutdown: SSLSocket.shutdown would drop the session
                # under a reader that may still be about to use it
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()


def _handshake(ctx: ssl.SSLContext, sock: socket.socket, server_hostname: str, host: str,
               port: int) -> ssl.SSLSocket:
    """Runs the TLS handshake on sock (blocking, within its timeout). Takes ownership of
    sock: it is closed on failure. Raises TLSError when retrying cannot help, OSError for a
    connection that broke or timed out."""
    try:
        return ctx.wrap_socket(sock, server_hostname=server_hostname)
    except OSError as e:
        sock.close()
        if _tls.is_final(e):
            raise _tls.tls_error(e, host, port) from e
        raise


class _Conn:
    """One connection and the requests waiting for an answer on it."""

    def __init__(self, core: _Core, sock: _PlainSocket | _TLSSocket) -> None:
        self.core = core
        self.sock = sock
        self.pending: dict[int, _Request] = {}
        self.dead = False
        self.error: ClientError | None = None  # why the connection died
        self.answered = False  # an answer came: TLS errors from now on are a lost connection
        self.send_lock = threading.Lock()
        self.packer = _wire.packer()
        self.reader = threading.Thread(target=self._read_loop, daemon=True,
                                       name="engram-client-reader")

    def send(self, req: _Request) -> None:
        """Registers req and writes it. Raises ConnectionLost when it could not be written
        whole (then the server cannot have executed it) unless the reader thread already
        handed req back to the core (then it returns: req is being retried or failed), and
        TLSError when the connection died of one before req was written; packing errors
        propagate."""
        core = self.core
        with core.lock:
            if self.dead:
                if isinstance(self.error, TLSError):  # read before the request was written
                    raise TLSError(str(self.error))
                raise ConnectionLost("connection closed")
            req.msgid = core.ids.take(self.pending)
            self.pending[req.msgid] = req
            req.conn = self
        try:
            with self.send_lock:
                data = _wire.pack_request(self.packer, req.msgid, req.method, req.params)
                self.sock.sendall(data)
        except OSError as e:
            if (isinstance(self.sock, _TLSSocket) and not self.answered
                    and self.reader is not threading.current_thread()):
                # TLS 1.3: a server refusing our certificate sends an alert and closes, and
                # a write racing it fails first. The reader reads the alert and fails this
                # connection with TLSError, handing req back with it: wait for that.
                self.reader.join(timeout=0.5)
                with core.lock:
                    if self.dead and self.pending.get(req.msgid) is not req:
                        return
            with core.lock:
                mine = self.pending.pop(req.msgid, None) is req
            self.fail(ConnectionLost(f"send failed: {e}"))
            if mine:
                raise ConnectionLost(f"send failed: {e}") from e
        except BaseException:
            with core.lock:
                self.pending.pop(req.msgid, None)
            raise

    def forget(self, req: _Request) -> None:
        with self.core.lock:
            if self.pending.get(req.msgid) is req:
                del self.pending[req.msgid]

    def _expire(self) -> None:
        """Fails the requests whose deadline passed (pipelined futures nobody waits on)."""
        now = time.monotonic()
        with self.core.lock:
            late = [r for r in self.pending.values() if r.deadline < now]
            for r in late:
                del self.pending[r.msgid]
        for r in late:
            self.core.resolve(r, exc=EngramTimeout(f"{r.method}: no answer in time"))

    def _read_loop(self) -> None:
        responses = _wire.ResponseReader()
        try:
            while True:
                if not self.sock.wait_readable(0.25):
                    self._expire()
                    continue
                data = self.sock.recv(1 << 18)
                if data is None:
                    continue
                if not data:
                    raise ConnectionLost("connection closed by the server")
                for msgid, err, result in responses.feed(data):
                    self.answered = True
                    with self.core.lock:
                        req = self.pending.pop(msgid, None)
                    if req is not None:
                        self.core.complete(req, err, result)
        except BaseException as e:  # noqa: BLE001 - the thread must end by failing the rest
            if isinstance(e, ConnectionLost):
                self.fail(e)
            elif not self.answered and _tls.is_final(e):
                # In TLS 1.3 the server checks the client's certificate after the client
                # finished its handshake: a refusal arrives as an alert on the first read.
                self.fail(_tls.tls_error(e, self.core.host, self.core.port))
            else:
                self.fail(ConnectionLost(str(e)))

    def fail(self, exc: ClientError) -> None:
        """Marks the connection dead, closes it, and hands every waiting request back to
        the core (retried or failed)."""
        core = self.core
        with core.lock:
            if self.dead:
                return
            self.dead = True
            self.error = exc
            pending = list(self.pending.values())
            self.pending.clear()
            if core.conn is self:
                core.conn = None
        self.sock.close()
        for req in pending:
            core.lost(req, exc, sent=True)


class _Core:
    """State shared by a Client and its with_options() views."""

    def __init__(self, host: str, port: int, api_key: str | None, connect_timeout: float,
                 reconnect: bool, numpy_embeddings: bool | None, tls: ssl.SSLContext | None,
                 server_hostname: str | None) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.server_hostname = server_hostname or host
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.as_numpy = _wire.numpy_available() if numpy_embeddings is None else numpy_embeddings
        self.lock = threading.Lock()
        self.connect_lock = threading.Lock()
        self.conn: _Conn | None = None
        self.ids = _wire.MsgIds()
        self.closed = False
        self.connected_once = False

    # -- connection ------------------------------------------------------------------------

    def connection(self, deadline: float, retry: RetryPolicy) -> _Conn:
        """The live connection, connecting (with backoff) and authenticating if needed."""
        with self.lock:
            if self.closed:
                raise ClientClosed("client is closed")
            if self.conn is not None:
                return self.conn
        with self.connect_lock:
            with self.lock:
                if self.conn is not None:
                    return self.conn
            attempt = 0
            while True:
                attempt += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EngramTimeout(f"could not connect to {self.host}:{self.port} in time")
                try:
                    sock = socket.create_connection((self.host, self.port),
                                                    timeout=min(self.connect_timeout, remaining))
                    if self.tls is not None:
                        sock = _handshake(self.tls, sock, self.server_hostname, self.host,
                                          self.port)
                except TLSError:
                    raise
                except OSError as e:
                    if self.closed:
                        raise ClientClosed("client is closed") from e
                    if not _wire.retry_connect(retry, self.reconnect, attempt, e):
                        raise ConnectionLost(_wire.connect_failure(self.host, self.port, e,
                                                                   self.connect_timeout)) from None
                    time.sleep(min(retry.backoff(attempt), max(0.0, remaining)))
                    continue
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                wrapped: _PlainSocket | _TLSSocket
                if isinstance(sock, ssl.SSLSocket):
                    wrapped = _TLSSocket(sock)
                else:
                    wrapped = _PlainSocket(sock)
                conn = _Conn(self, wrapped)
                conn.reader.start()
                try:
                    if self.api_key is not None:
                        self._authenticate(conn, deadline)
                except ConnectionLost as e:
                    conn.fail(ConnectionLost("connection lost during auth"))
                    if not _wire.retry_connect(retry, self.reconnect, attempt, e):
                        raise ConnectionLost(f"cannot connect to {self.host}:{self.port}: "
                                             "the connection was lost during auth") from None
                    time.sleep(min(retry.backoff(attempt),
                                   max(0.0, deadline - time.monotonic())))
                    continue
                except BaseException:
                    conn.fail(ConnectionLost("auth failed"))
                    raise
                with self.lock:
                    if self.closed:
                        conn.fail(ConnectionLost("client is closed"))
                        raise ClientClosed("client is closed")
                    self.conn = conn
                    self.connected_once = True
                return conn

    def _authenticate(self, conn: _Conn, deadline: float) -> None:
        req = _Request("auth", {"api_key": self.api_key}, deadline, _wire.NO_RETRY, True)
        req.attempt = 1
        conn.send(req)
        try:
            req.future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            conn.forget(req)
            raise EngramTimeout("auth timed out") from None

    # -- requests --------------------------------------------------------------------------

    def dispatch(self, req: _Request) -> None:
        """Sends req (again): on the caller's thread for the first try, on a timer thread
        for retries. Never raises: failures land in req.future."""
        if req.done:
            return
        req.attempt += 1
        try:
            conn = self.connection(req.deadline, req.retry)
        except BaseException as e:  # noqa: BLE001
            self.resolve(req, exc=e)
            return
        try:
            conn.send(req)
        except ConnectionLost as e:
            self.lost(req, e, sent=False)
        except BaseException as e:  # noqa: BLE001 - e.g. a value msgpack cannot pack
            self.resolve(req, exc=e)

    def complete(self, req: _Request, err: Any, result: Any) -> None:
        if req.method == "auth" and not req.internal:
            # The connection is now bound to this key (or, after a failure, to none):
            # reconnects authenticate the same way.
            self.api_key = req.params.get("api_key") if err is None else None
        if err is None:
            self.resolve(req, result=_wire.convert_embeddings(result, self.as_numpy))
            return
        exc = error_from_wire(err, req.method)
        delay = _wire.retry_delay(req.retry, req.method, exc, req.attempt)
        if delay is not None and time.monotonic() + delay < req.deadline:
            self.schedule(req, delay)
        else:
            self.resolve(req, exc=exc)

    def lost(self, req: _Request, exc: ClientError, sent: bool) -> None:
        if self.closed:
            self.resolve(req, exc=ClientClosed("client is closed"))
            return
        if isinstance(exc, TLSError):  # another attempt would be refused the same way
            self.resolve(req, exc=exc)
            return
        delay = None
        if self.reconnect:
            delay = _wire.retry_delay(req.retry, req.method, exc, req.attempt, sent)
        if delay is not None and time.monotonic() + delay < req.deadline:
            self.schedule(req, delay)
            return
        maybe = sent and not _wire.safe_to_repeat(req.method)
        msg = f"{exc} during {req.method}"
        if maybe:
            msg += "; the write may or may not have been applied"
        self.resolve(req, exc=ConnectionLost(msg, maybe_committed=maybe))

    def schedule(self, req: _Request, delay: float) -> None:
        t = threading.Timer(delay, self.dispatch, (req,))
        t.daemon = True
        t.start()

    def resolve(self, req: _Request, result: Any = None, exc: BaseException | None = None) -> None:
        with self.lock:
            if req.done:
                return
            req.done = True
        if exc is not None:
            req.future.set_exception(exc)
        else:
            req.future.set_result(result)

    def cancel(self, req: _Request) -> None:
        with self.lock:
            req.done = True
        if req.conn is not None:
            req.conn.forget(req)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            conn = self.conn
            self.conn = None
        if conn is not None:
            conn.fail(ConnectionLost("client closed"))
            if conn.reader is not threading.current_thread():
                conn.reader.join(timeout=5)


class Client(SyncRoot):
    """A blocking Engram client.

    ``Client(host, port, api_key=...)`` connects on first use (or :meth:`connect`) and
    authenticates with ``api_key``; after a lost connection the next call reconnects with
    backoff and authenticates again. ``url="engram://host:port"`` (``engrams://`` for TLS)
    may stand for host and port. Left out, the address comes from ``ENGRAM_URL`` (with the
    ``ENGRAM_TLS*`` variables) and the key from ``ENGRAM_API_KEY`` or the file
    ``ENGRAM_API_KEY_FILE``; without them, 127.0.0.1:7420 and no key. ``connect_timeout``
    bounds each connection attempt; a refused one is tried again at most
    ``retry.max_retries`` times after a short backoff, so an unreachable server raises
    :class:`ConnectionLost` within about a second. Every server method is a typed method:
    ``client.memory.store(...)``, ``client.session.checkpoint(...)``,
    ``client.admin.tenant.create(...)``. Results are dicts as in docs/protocol.md; errors
    raise :class:`engram_client.errors.EngramError` subclasses.

    A Client is thread-safe: calls from several threads are pipelined on its one
    connection. ``client.pipeline`` has the same methods returning futures, to send many
    requests from one thread before waiting for any.

    ``timeout`` bounds each call, retries and reconnects included. ``retry`` says when a
    call is repeated (see :class:`RetryPolicy`); ``memory.store`` and
    ``memory.store_batch`` get a generated idempotency key, so a retry never stores twice.

    TLS: ``tls=True`` (or any ``tls_*_file``) connects over TLS 1.3, verifying the server's
    certificate against ``tls_ca_file`` (PEM; the system's CA store without it) and the
    host name or address connected to (``tls_server_hostname`` names another);
    ``tls_cert_file`` and ``tls_key_file`` present a client certificate (an admin needs one
    on a server with ``tls_admin_require_client_cert``). ``tls`` may instead be an
    ``ssl.SSLContext``, used as it is. A certificate that does not verify raises
    :class:`engram_client.errors.TLSError`, which is never retried.
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
        ctx = _tls.make_context(cfg.tls, cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file)
        self._core = _Core(cfg.host, cfg.port, cfg.api_key, connect_timeout, reconnect,
                           numpy_embeddings, ctx, cfg.tls_server_hostname)
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._init_api(self)
        self.pipeline = Pipeline(self)

    def __repr__(self) -> str:  # never shows the key
        tls = ", tls=True" if self._core.tls is not None else ""
        return f"Client({self._core.host!r}, {self._core.port}{tls})"

    def with_options(self, *, timeout: float | None = None,
                     retry: RetryPolicy | None = None) -> Client:
        """A view of this client (same connection) with another timeout or retry policy."""
        view = object.__new__(Client)
        view._core = self._core
        view._timeout = self._timeout if timeout is None else timeout
        view._retry = self._retry if retry is None else retry
        view._init_api(view)
        view.pipeline = Pipeline(view)
        return view

    def connect(self) -> Client:
        """Connects (and authenticates) now instead of on the first call."""
        self._core.connection(time.monotonic() + self._timeout, self._retry)
        return self

    def close(self) -> None:
        """Closes the connection; waiting calls fail with ClientClosed."""
        self._core.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        """Calls any method by name: ``call("memory.get", ids=[1])``."""
        p = dict(params or {})
        p.update(kw)
        return self._call(method, p)

    # -- what the generated methods use --------------------------------------------------------

    def _start(self, method: str, params: Mapping[str, Any]) -> _Request:
        req = _Request(method, _wire.prepare_params(method, params),
                       time.monotonic() + self._timeout, self._retry)
        self._core.dispatch(req)
        return req

    def _call(self, method: str, params: Mapping[str, Any]) -> Any:
        req = self._start(method, params)
        try:
            return req.future.result(timeout=max(0.0, req.deadline - time.monotonic()) + 0.05)
        except FutureTimeout:
            self._core.cancel(req)
            if req.future.done():
                return req.future.result()
            raise EngramTimeout(f"{method}: no answer in {self._timeout:g} s") from None

    def _submit(self, method: str, params: Mapping[str, Any]) -> Future[Any]:
        return self._start(method, params).future


class Pipeline(FutureRoot):
    """The client's methods returning ``concurrent.futures.Future``: each call is sent at
    once and the answers are matched as they come, in any order.

        f1 = client.pipeline.memory.store(content="a", type="fact", importance=0.5)
        f2 = client.pipeline.memory.search(query="a")
        print(f1.result()["id"], f2.result()["results"])
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._init_api(self)

    def _submit(self, method: str, params: Mapping[str, Any]) -> Future[Any]:
        return self._client._submit(method, params)


# Keep the names importable for type checkers that look here.
_ = (EngramError, Unauthenticated)
