"""A small MessagePack-RPC client for the integration tests.

Written independently of the server's C codec (it uses python3-msgpack), so the tests also
check the wire format against a second implementation.
"""
import itertools
import socket

import msgpack


class RpcError(Exception):
    """An error response: code (stable string), message, and any extra fields."""

    def __init__(self, error):
        self.error = error
        self.code = error.get("code")
        self.message = error.get("message", "")
        super().__init__(f"{self.code}: {self.message}")


class Client:
    def __init__(self, port, host="127.0.0.1", timeout=30.0, key=None, ssl_context=None,
                 server_hostname=None):
        """ssl_context (an ssl.SSLContext): speak TLS, checking the server's certificate
        against server_hostname (default host)."""
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                self.sock = ssl_context.wrap_socket(self.sock,
                                                    server_hostname=server_hostname or host)
            except BaseException:
                self.sock.close()
                raise
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.ids = itertools.count(1)
        self.pending = {}
        if key is not None:
            self.call("auth", api_key=key)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def send(self, method, params=None, msgid=None):
        """Sends a request without waiting; returns its msgid."""
        if msgid is None:
            msgid = next(self.ids)
        args = [] if params is None else [params]
        self.sock.sendall(msgpack.packb([0, msgid, method, args], use_bin_type=True))
        return msgid

    def recv(self):
        """Returns the next message off the wire (any kind), or None on EOF."""
        for msg in self.unpacker:
            return msg
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self.unpacker.feed(data)
            for msg in self.unpacker:
                return msg

    def wait(self, msgid):
        """Waits for the response to msgid (buffering others); returns (error, result)."""
        while msgid not in self.pending:
            msg = self.recv()
            if msg is None:
                raise ConnectionError("connection closed by the server")
            assert msg[0] == 1 and len(msg) == 4, f"not a response: {msg!r}"
            self.pending[msg[1]] = (msg[2], msg[3])
        return self.pending.pop(msgid)

    def call(self, method, **params):
        err, result = self.wait(self.send(method, params))
        if err is not None:
            raise RpcError(err)
        return result

    def call_err(self, method, **params):
        """Calls and expects an error; returns the error map."""
        err, result = self.wait(self.send(method, params))
        assert err is not None, f"{method} unexpectedly succeeded: {result!r}"
        return err
