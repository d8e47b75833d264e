"""SIGTERM: stop accepting, finish what is in flight, exit cleanly; nothing acked is lost."""
import signal
import socket

import msgpack

from harness import Server, new_database, structured_vectors, vec_bin


def test_graceful_shutdown_keeps_every_acknowledged_write():
    srv = Server(new_database("term")).start()
    try:
        _, key = srv.create_tenant()
        vecs = structured_vectors(400, 384, seed=21)
        with srv.client(key=key) as c:
            frames = [msgpack.packb([0, i + 1, "memory.store",
                                     [{"content": f"s{i}", "type": "fact", "importance": 0.5,
                                       "embedding": vec_bin(v)}]], use_bin_type=True)
                      for i, v in enumerate(vecs)]
            c.send_raw(b"".join(frames))
            acked = {}
            n_refused = 0

            def take(msg):
                nonlocal n_refused
                assert msg[0] == 1
                if msg[2] is None:
                    acked[msg[1]] = msg[3]["id"]
                else:
                    # anything refused during shutdown must say so plainly
                    assert msg[2]["code"] in ("unavailable",), msg[2]
                    n_refused += 1

            # the first answer shows the server is working through the burst: the signal
            # lands with requests in flight
            take(c.recv())
            srv.proc.send_signal(signal.SIGTERM)
            while True:
                try:
                    msg = c.recv()
                except (ConnectionResetError, socket.timeout):
                    break
                if msg is None:
                    break
                take(msg)
            # in flight when the signal came: answered, not dropped (the first one at least)
            assert acked and len(acked) + n_refused <= len(frames)
        srv.proc.wait(timeout=60)
        assert srv.proc.returncode == 0, srv.log_text()[-3000:]
        srv.proc = None
        srv.logf.close()
        srv.check_log_clean()
        # new connections are refused once the server is gone
        try:
            socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()
            refused = False
        except OSError:
            refused = True
        assert refused
        srv.start()
        with srv.client(key=key) as c:
            ids = list(acked.values())
            got = c.call("memory.get", ids=ids[:1000])["memories"]
            assert len(got) == len(ids), "an acknowledged store was lost"
        srv.stop()
    finally:
        srv.cleanup()
