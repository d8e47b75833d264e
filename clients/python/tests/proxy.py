"""A loopback TCP proxy in front of engramd whose connections the tests can cut, or whose
answers they can drop or hold back, to exercise reconnects, retries and timeouts."""
import socket
import threading


class Proxy:
    def __init__(self, host, port):
        self.target = (host, port)
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs = []
        self.drop_next_reply = False  # the next server->client bytes cut the connection
        self.blackhole = False        # answers are swallowed
        self.refuse = 0               # close this many new connections at once
        self.accepted = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                if self.refuse > 0:
                    self.refuse -= 1
                    c.close()
                    continue
            try:
                s = socket.create_connection(self.target)
            except OSError:
                c.close()
                continue
            for x in (c, s):
                x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.pairs.append((c, s))
            threading.Thread(target=self._pump, args=(c, s, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, True), daemon=True).start()

    def _pump(self, src, dst, is_reply):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if is_reply:
                    with self.lock:
                        drop = self.drop_next_reply
                        self.drop_next_reply = False
                    if drop:
                        break
                    if self.blackhole:
                        continue
                dst.sendall(data)
        except OSError:
            pass
        self._close_pair(src, dst)

    def _close_pair(self, a, b):
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()

    def cut(self):
        """Closes every proxied connection (both sides)."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for c, s in pairs:
            self._close_pair(c, s)

    def close(self):
        self.closed = True
        self.lsock.close()
        self.cut()
