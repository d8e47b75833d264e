"""SIGHUP reloads the configuration: the settings marked reloadable take effect at once,
the others keep their running value with a warning, a broken file changes nothing; and
engramd tells the service manager about it through sd_notify (NOTIFY_SOCKET)."""
import os
import re
import signal
import socket
import tempfile
import time

from harness import Server, new_database, wait_for
from rpc import RpcError


def metric(srv, name):
    status, text = srv.http_get("/metrics")
    assert status == 200
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def write(path, text):
    # written whole and renamed, as an editor or a config manager would
    with open(path + ".tmp", "w") as f:
        f.write("[engramd]\n" + text)
    os.replace(path + ".tmp", path)


def hup_and_wait(srv, result="ok"):
    name = f'engram_config_reloads_total{{result="{result}"}}'
    before = metric(srv, name)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: metric(srv, name) == before + 1, timeout=20), srv.log_text()[-3000:]


def test_sighup_applies_reloadable_settings_and_keeps_the_others():
    dsn = new_database("reload")
    d = tempfile.mkdtemp(prefix="engram-reload-")
    conf = os.path.join(d, "engramd.conf")
    write(conf, "premium_rate_per_s = 1000\npremium_rate_burst = 1000\nmax_top_k = 5\n"
                "premium_max_memories = 0\n")
    srv = Server(dsn, extra=["--config", conf])
    try:
        srv.start()
        _, key = srv.create_tenant(tier="premium")
        with srv.client(key=key) as c:
            c.call("memory.store", content="hello", type="fact", importance=0.5)
            usage = c.call("tenant.usage")
            assert usage["rate"] == {"per_second": 1000, "burst": 1000}
            assert usage["memories"]["limit"] is None
            for _ in range(10):  # well inside the burst
                c.call("memory.stats")
            assert c.call_err("memory.search", query="x", top_k=6)["code"] == "invalid_argument"

        # reloadable: the premium rate, its burst, the memory limit, the maintenance
        # interval; needs a restart: max_top_k
        write(conf, "premium_rate_per_s = 0.01\npremium_rate_burst = 3\nmax_top_k = 7\n"
                    "premium_max_memories = 1\nmaintenance_interval_s = 5\n")
        hup_and_wait(srv)
        log = srv.log_text()
        assert "reload: premium_rate_per_s = 0.01" in log
        assert "reload: maintenance_interval_s = 5 (was 30)" in log
        assert re.search(r"warn .*max_top_k is now '7' in the configuration but needs a "
                         r"restart; engramd keeps '5'", log), log[-3000:]
        with srv.client(key=key) as c:
            usage = c.call("tenant.usage")
            assert usage["rate"] == {"per_second": 0.01, "burst": 3}
            assert usage["memories"]["limit"] == 1
            # the new burst holds: 3 requests from a full bucket at most, then rate_limited
            codes = []
            for _ in range(6):
                try:
                    c.call("memory.stats")
                    codes.append("ok")
                except RpcError as e:
                    codes.append(e.code)
            assert codes.count("ok") <= 2 and "rate_limited" in codes, codes

        # a file with an error changes nothing, and says why
        write(conf, "premium_rate_per_s = fast\n")
        hup_and_wait(srv, result="failed")
        assert re.search(r"error .*reload: the configuration has an error, nothing changed: "
                         r".*premium_rate_per_s", srv.log_text())
        # back to a generous rate: the old max_top_k is still the one in force
        write(conf, "premium_rate_per_s = 1000\npremium_rate_burst = 1000\nmax_top_k = 7\n")
        hup_and_wait(srv)
        with srv.client(key=key) as c:
            assert c.call("tenant.usage")["rate"] == {"per_second": 1000, "burst": 1000}
            err = c.call_err("memory.search", query="x", top_k=6)
            assert err["code"] == "invalid_argument" and "between 1 and 5" in err["message"]
            assert c.call("memory.search", query="x", top_k=5) is not None
        srv.stop()
    finally:
        srv.cleanup()


class Notifications:
    """A NOTIFY_SOCKET of our own: the datagrams engramd sends, as systemd would get them."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="engram-notify-")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.seen = []

    def next_with(self, field, timeout=60):
        """Returns the next message holding field (e.g. READY=1), keeping all in seen."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                msg = self.sock.recv(4096).decode()
            except socket.timeout:
                break
            self.seen.append(msg)
            if field in msg.split("\n"):
                return msg
        raise AssertionError(f"no {field} within {timeout} s; got {self.seen}")

    def close(self):
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


def test_sd_notify_ready_reloading_stopping_and_watchdog():
    dsn = new_database("notify")
    n = Notifications()
    # WATCHDOG_USEC without WATCHDOG_PID: sd_watchdog_enabled accepts it for this process
    srv = Server(dsn, env={"NOTIFY_SOCKET": n.path, "WATCHDOG_USEC": "400000"})
    try:
        srv.start(wait=False)
        ready = n.next_with("READY=1")
        assert "STATUS=serving: rpc 127.0.0.1:%d" % srv.port in ready and "indexes loaded" in ready
        srv.wait_ready()  # READY=1 came when it serves
        assert srv.http_get("/healthz")[0] == 200
        # the watchdog pings every WATCHDOG_USEC / 2
        n.next_with("WATCHDOG=1", timeout=10)
        n.next_with("WATCHDOG=1", timeout=10)

        srv.proc.send_signal(signal.SIGHUP)
        reloading = n.next_with("RELOADING=1", timeout=20)
        assert re.search(r"^MONOTONIC_USEC=\d+$", reloading, re.M), reloading
        ready2 = n.next_with("READY=1", timeout=20)
        assert "configuration reloaded" in ready2
        # RELOADING=1 came before the READY=1 that ends the reload, and only one of each
        i_rel = n.seen.index(reloading)
        i_ready = len(n.seen) - 1
        assert i_rel < i_ready
        assert sum("READY=1" in m.split("\n") for m in n.seen) == 2

        srv.proc.send_signal(signal.SIGTERM)
        stopping = n.next_with("STOPPING=1", timeout=20)
        assert "STOPPING=1" in stopping
        srv.stop()  # exits 0, no sanitizer report
    finally:
        srv.cleanup()
        n.close()
