"""Temporary snapshot files a crash leaves behind are removed at start.

When no other engramd writes in the snapshot directory (none holds its .lock), every
temporary file is a leftover and goes at once; while another process holds the lock, only
those older than an hour go, since the other process may be writing a fresh one.
"""
import fcntl
import glob
import os
import time

from harness import Server, new_database, structured_vectors, vec_bin, wait_for


def snap_dir(srv):
    dirs = glob.glob(os.path.join(srv.data_dir, "index", "*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_leftover_temporaries_removed_at_start():
    srv = Server(new_database("stray"))
    try:
        srv.start()
        tid, key = srv.create_tenant()
        with srv.client(key=key) as c:
            mems = [{"content": f"m{i}", "type": "fact", "importance": 0.5,
                     "embedding": vec_bin(v)} for i, v in enumerate(structured_vectors(50, 384))]
            c.call("memory.store_batch", memories=mems)
            c.call("memory.search", embedding=mems[0]["embedding"], top_k=1)
        srv.stop()
        d = snap_dir(srv)
        assert os.path.exists(os.path.join(d, f"{tid}.idx"))

        # alone: a fresh leftover goes at start
        fresh = os.path.join(d, f"{tid}.idx.tmp.AbC123")
        open(fresh, "wb").write(b"half a snapshot")
        srv.start()
        assert wait_for(lambda: not os.path.exists(fresh), timeout=30), "fresh leftover kept"
        assert os.path.exists(os.path.join(d, f"{tid}.idx"))
        srv.stop()

        # another process writes here: only the hour-old leftover goes
        with open(os.path.join(d, ".lock"), "a+") as other:
            fcntl.flock(other, fcntl.LOCK_SH)
            fresh2 = os.path.join(d, f"{tid}.idx.tmp.Fresh2")
            old = os.path.join(d, f"{tid}.idx.tmp.OldOne")
            for p in (fresh2, old):
                open(p, "wb").write(b"x")
            two_hours_ago = time.time() - 7200
            os.utime(old, (two_hours_ago, two_hours_ago))
            srv.start()
            assert wait_for(lambda: not os.path.exists(old), timeout=30), "hour-old leftover kept"
            with srv.client(key=key) as c:  # the preload has run: the fresh one stays
                assert c.call("memory.stats")["total"] == 50
            assert os.path.exists(fresh2)
            assert "shared with another engramd" in srv.log_text()
            srv.stop()
    finally:
        srv.cleanup()
