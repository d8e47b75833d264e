"""The response reader both clients share (_wire.ResponseReader), without a socket: frames
split anywhere, several in one read, the size limit and bytes that are not MessagePack;
then each client against a stand-in server that sends such a stream."""
import asyncio
import socket
import struct
import threading

import msgpack
import pytest

from engram_client import AsyncClient, Client
from engram_client._wire import MAX_MESSAGE, ResponseReader
from engram_client.errors import ConnectionLost, NotFound


def resp(msgid, result=None, error=None):
    return msgpack.packb([1, msgid, error, result], use_bin_type=True)


def test_one_response_per_read():
    r = ResponseReader()
    assert list(r.feed(resp(7, {"pong": True}))) == [(7, None, {"pong": True})]
    err = {"code": "not_found", "message": "no such memory"}
    assert list(r.feed(resp(8, error=err))) == [(8, err, None)]


def test_frames_split_anywhere():
    """Every split point of a stream of three responses, and one byte per read, give the
    same three responses in order; nothing comes out before a frame is complete."""
    frames = [resp(1, {"content": "a" * 300, "embedding": b"\x00" * 64}), resp(2, [1, 2, 3]),
              resp(0xFFFFFFFF, None, {"code": "unavailable", "message": "x"})]
    stream = b"".join(frames)
    want = [(1, None, {"content": "a" * 300, "embedding": b"\x00" * 64}), (2, None, [1, 2, 3]),
            (0xFFFFFFFF, {"code": "unavailable", "message": "x"}, None)]
    for cut in range(len(stream) + 1):
        r = ResponseReader()
        got = list(r.feed(stream[:cut]))
        complete = 0
        while complete < len(frames) and len(b"".join(frames[:complete + 1])) <= cut:
            complete += 1
        assert got == want[:complete], cut
        got += list(r.feed(stream[cut:]))
        assert got == want, cut
    r = ResponseReader()
    got = []
    for i in range(len(stream)):
        got += list(r.feed(stream[i:i + 1]))
    assert got == want


def test_several_frames_in_one_read():
    r = ResponseReader()
    data = b"".join(resp(i, {"i": i}) for i in range(1, 501))
    assert [m for m, _, _ in r.feed(data)] == list(range(1, 501))
    assert list(r.feed(b"")) == []


def test_notifications_and_other_messages_are_skipped():
    r = ResponseReader()
    data = (msgpack.packb([2, "event", [{}]]) + resp(3, "ok") + msgpack.packb("hello")
            + msgpack.packb([1, 4, None]) + resp(5, "ok"))
    assert list(r.feed(data)) == [(3, None, "ok"), (5, None, "ok")]


def test_message_at_the_limit_is_read():
    r = ResponseReader(max_message=1000)
    frame = resp(1, b"x" * 900)
    assert len(frame) <= 1000
    assert list(r.feed(frame)) == [(1, None, b"x" * 900)]
    # the bytes of answers already read do not count against the next one
    for i in range(2, 6):
        assert list(r.feed(resp(i, b"y" * 900))) == [(i, None, b"y" * 900)]


def test_oversize_message_is_refused():
    r = ResponseReader(max_message=1000)
    frame = resp(1, b"x" * 2000)
    with pytest.raises(ConnectionLost, match="over 1000 bytes"):
        for chunk in range(0, len(frame), 256):
            list(r.feed(frame[chunk:chunk + 256]))
    # the stream is broken for good: later bytes are not decoded
    with pytest.raises(ConnectionLost, match="over 1000 bytes"):
        r.feed(resp(2, "ok"))


def test_message_over_the_default_limit_is_refused():
    """A response announcing MAX_MESSAGE + 1 bytes is refused once the bytes held pass
    MAX_MESSAGE, not after the whole of it arrived; one just under the limit is read."""
    chunk = b"\x00" * (1 << 20)
    r = ResponseReader()
    fed = 0
    with pytest.raises(ConnectionLost, match=f"over {MAX_MESSAGE} bytes"):
        list(r.feed(b"\x94\x01\x01\xc0\xc6" + struct.pack(">I", MAX_MESSAGE + 1)))
        while fed <= MAX_MESSAGE + len(chunk):
            list(r.feed(chunk))
            fed += len(chunk)
    assert MAX_MESSAGE - len(chunk) <= fed <= MAX_MESSAGE
    r = ResponseReader()
    n = MAX_MESSAGE - 64
    assert list(r.feed(b"\x94\x01\x01\xc0\xc6" + struct.pack(">I", n))) == []
    for i in range(0, n, len(chunk)):
        got = list(r.feed(chunk[:min(len(chunk), n - i)]))
    assert len(got) == 1 and got[0][0] == 1 and len(got[0][2]) == n


@pytest.mark.parametrize("garbage", [
    b"\xc1",                             # a byte MessagePack never uses
    b"\x94\x01\x01\xc0\xa3\xff\xfe\xfd",  # a string that is not UTF-8
    b"\x91" * 5000,                      # nesting deeper than the decoder allows
], ids=["reserved-byte", "bad-utf8", "too-deep"])
def test_garbage_fails_the_stream_after_the_good_responses(garbage):
    r = ResponseReader()
    got = []
    with pytest.raises(ConnectionLost, match="malformed message"):
        for x in r.feed(resp(1, "before") + garbage + resp(2, "after")):
            got.append(x)
    assert got == [(1, None, "before")]
    with pytest.raises(ConnectionLost, match="malformed message"):
        list(r.feed(resp(3, "later")))


# ---- each client over a socket, against a stand-in server -----------------------------------


class StandIn:
    """A one-connection server: reads one request, answers with whatever ``answer(msgid)``
    returns, sent in chunks of ``chunk`` bytes, then waits for the client to close."""

    def __init__(self, answer, chunk=None):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(1)
        self.port = self.ls.getsockname()[1]
        self.answer, self.chunk = answer, chunk
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        conn, _ = self.ls.accept()
        with conn:
            up = msgpack.Unpacker(raw=False)
            while True:
                up.feed(conn.recv(65536))
                reqs = list(up)
                if reqs:
                    break
            data = self.answer(reqs[0][1])
            step = self.chunk or len(data)
            try:
                for i in range(0, len(data), step):
                    conn.sendall(data[i:i + step])
                conn.recv(1)
            except OSError:  # the client dropped the connection
                pass

    def close(self):
        self.ls.close()
        self.t.join(timeout=5)


def answers_split_and_batched(msgid):
    """A notification, then the answer one byte at a time."""
    return msgpack.packb([2, "hello", []]) + resp(msgid, None,
                                                  {"code": "not_found", "message": "gone"})


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_clients_read_split_answers(chunk):
    s = StandIn(answers_split_and_batched, chunk)
    with Client("127.0.0.1", s.port, timeout=10, reconnect=False) as c:
        with pytest.raises(NotFound):
            c.memory.get([1])
    s.close()

    async def main():
        async with AsyncClient("127.0.0.1", s2.port, timeout=10, reconnect=False) as c:
            with pytest.raises(NotFound):
                await c.memory.get([1])
    s2 = StandIn(answers_split_and_batched, chunk)
    asyncio.run(main())
    s2.close()


@pytest.mark.parametrize("answer,match", [
    (lambda msgid: b"\xc1" + resp(msgid, "ok"), "malformed message"),
    (lambda msgid: b"\x94\x01" + struct.pack(">BI", 0xCE, msgid) + b"\xc0\xc6"
     + struct.pack(">I", MAX_MESSAGE + 1) + b"\x00" * (MAX_MESSAGE + 1), "over 67108864 bytes"),
], ids=["garbage", "oversize"])
def test_clients_drop_a_connection_that_sends_garbage(answer, match):
    s = StandIn(answer)
    with Client("127.0.0.1", s.port, timeout=10, reconnect=False) as c:
        with pytest.raises(ConnectionLost, match=match):
            c.memory.get([1])
    s.close()

    async def main():
        async with AsyncClient("127.0.0.1", s2.port, timeout=10, reconnect=False) as c:
            with pytest.raises(ConnectionLost, match=match):
                await c.memory.get([1])
    s2 = StandIn(answer)
    asyncio.run(main())
    s2.close()
