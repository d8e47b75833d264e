"""Malformed and hostile frames close that connection only; others keep working."""
import socket
import struct
import time

import msgpack

from harness import Client


def recv_until_closed(sock, timeout=10):
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk


def hostile(server, payload):
    """Sends payload on a fresh connection; returns (decoded replies, closed)."""
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(payload)
    data, closed = recv_until_closed(s)
    s.close()
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(data)
    return list(up), closed


BOMBS = [
    b"\xdd\xff\xff\xff\xff",             # array32 of 4 billion
    b"\xdf\xff\xff\xff\xff",             # map32 of 4 billion
    b"\xdb\xff\xff\xff\xff",             # str32 of 4 GiB
    b"\xc6\xff\xff\xff\xff",             # bin32 of 4 GiB
    b"\x91" * 5000,                      # 5000-deep nesting
    b"\xc1",                             # reserved byte
    b"\x94\x00\x01\xa4ping\xc1",         # reserved byte inside a request
]


def test_bombs_close_only_their_connection(server, tenant):
    with server.client(key=tenant[1]) as bystander:
        for bomb in BOMBS:
            replies, closed = hostile(server, bomb)
            assert closed, bomb[:8]
            assert bystander.call("ping") == "pong"
        assert bystander.call("memory.search", query="still here", top_k=1) is not None


def test_error_response_when_msgid_readable(server):
    # a request whose method is not a string: msgid 77 is readable
    replies, closed = hostile(server, msgpack.packb([0, 77, 42, []]))
    assert closed
    assert replies and replies[0][0] == 1 and replies[0][1] == 77
    assert replies[0][2]["code"] == "malformed_request"
    # params that are not [map]
    replies, closed = hostile(server, msgpack.packb([0, 78, "ping", [1, 2]]))
    assert closed and replies[0][1] == 78 and replies[0][2]["code"] == "malformed_request"
    # a request too deep: the scanner stops it, the msgid still comes back
    deep = b"\x94\x00\x05\xa4ping\x91" + b"\x91" * 100 + b"\x80"
    replies, closed = hostile(server, deep)
    assert closed and replies and replies[0][1] == 5
    assert replies[0][2]["code"] == "malformed_request"


def test_oversized_message_rejected_before_it_arrives(server):
    # declares a 64 MiB string (over the 16 MiB default) and sends only the header
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"\x94\x00\x09\xa4ping\x91\x81\xa1x\xdb" + struct.pack(">I", 64 << 20))
    data, closed = recv_until_closed(s, timeout=10)
    s.close()
    assert closed
    up = msgpack.Unpacker(raw=False)
    up.feed(data)
    replies = list(up)
    assert replies and replies[0][1] == 9 and replies[0][2]["code"] == "malformed_request"


def test_wrong_shapes(server):
    for frame in [msgpack.packb({"a": 1}), msgpack.packb(5), msgpack.packb([0, 1, "ping"]),
                  msgpack.packb([3, 1, "ping", []]), msgpack.packb([0, -1, "ping", []])]:
        replies, closed = hostile(server, frame)
        assert closed, frame


def test_truncated_message_then_silence_is_closed_by_deadline(server):
    # a started message that never completes is closed at frame_timeout_ms; we only check
    # that the connection does not hold the server: others are served meanwhile
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"\x94\x00\x01")
    with Client(server.port) as c:
        assert c.call("ping") == "pong"
    s.close()


def test_invalid_utf8_is_invalid_argument(server, tenant):
    with server.client(key=tenant[1]) as c:
        frame = msgpack.packb([0, 3, "memory.store", [{"content": b"", "type": "fact", "importance": 0.5}]],
                              use_bin_type=False)
        # replace the empty str with a 2-byte invalid UTF-8 string
        frame = frame.replace(b"\xa7content\xa0", b"\xa7content\xa2\xc3\x28")
        c.send_raw(frame)
        err, _ = c.wait(3)
        assert err["code"] == "invalid_argument" and "UTF-8" in err["message"]
        assert c.call("ping") == "pong"


def test_slowloris_deadline():
    """A message trickled byte by byte is cut at the absolute deadline."""
    from harness import Server, new_database
    srv = Server(new_database("slow"), extra=["--frame-timeout-ms", "500"]).start()
    try:
        s = socket.create_connection(("127.0.0.1", srv.port))
        # a request whose 255-byte string argument arrives one byte every 100 ms
        s.sendall(b"\x94\x00\x01\xa4ping\x91\x81\xa1x\xda\x00\xff")
        closed = False
        t0 = time.time()
        for _ in range(100):
            try:
                s.sendall(b"a")
            except OSError:
                closed = True
                break
            time.sleep(0.1)  # wall clock: the trickle's pace is what is tested
            s.settimeout(0.01)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
                break
        assert closed, "trickling connection was not closed"
        assert time.time() - t0 < 5
        s.close()
        srv.stop()
    finally:
        srv.cleanup()
