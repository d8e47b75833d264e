"""Headless Chromium driven over the DevTools protocol, for the web console's tests.

Chromium (Debian's `chromium` package) is started with --remote-debugging-pipe: the
protocol's JSON messages, each ended by a NUL byte, go in on the browser's fd 3 and come out
on its fd 4. No websocket, no Python package beyond the standard library.

A missing chromium is a failure, never a skip (deploy/test installs it).
"""
import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time


class BrowserError(Exception):
    pass


def chromium_path():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    raise AssertionError("chromium is not installed (deploy/lib.sh installs Debian's chromium "
                         "for the tests)")


def high_fd(fd):
    """fd moved to a descriptor number of at least 10 (the old one is closed)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Browser:
    """One headless browser with one page. Use as a context manager.

    events: every protocol event received ({method, params}), for assertions on console
    errors and Content-Security-Policy violations (problems())."""

    def __init__(self, width=1280, height=900, timeout=30.0):
        self.timeout = timeout
        self.width, self.height = width, height
        self.tmp = tempfile.mkdtemp(prefix="engram-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the browser's ends moved above 10, so putting them on 3 and 4 clobbers neither
        to_browser_r, from_browser_w = (high_fd(to_browser_r), high_fd(from_browser_w))
        args = [chromium_path(), "--headless=new", "--remote-debugging-pipe", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-default-apps", "--mute-audio",
                "--hide-scrollbars", "--password-store=basic", "--use-mock-keychain",
                f"--user-data-dir={self.tmp}/profile", f"--window-size={width},{height}",
                "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
        # the shell puts the pipe ends on fds 3 and 4, where Chromium expects them
        shell = (f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} '
                 f'{to_browser_r}<&- {from_browser_w}>&-')
        self.log = open(os.path.join(self.tmp, "chromium.log"), "wb")
        self.proc = subprocess.Popen(["/bin/bash", "-c", shell] + args, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     pass_fds=(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._lock = threading.Lock()
        self._answers = {}
        self._cond = threading.Condition()
        self.events = []
        self._event_q = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session = None
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget",
                                     {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.cmd(f"{domain}.enable")
            self.cmd("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": height, "deviceScaleFactor": 1,
                      "mobile": False})
        except BaseException:
            self.close()
            raise

    # -- the protocol ------------------------------------------------------------------------
    def _read(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._answers["eof"] = True
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._answers[msg["id"]] = msg
                        self._cond.notify_all()
                else:
                    self.events.append(msg)

    def send(self, method, params=None, session=None, timeout=None):
        """One protocol command (browser-wide unless session); its result, or raises."""
        with self._lock:
            self._next += 1
            mid = self._next
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + (timeout or self.timeout)
        with self._cond:
            while mid not in self._answers:
                if self._answers.get("eof"):
                    raise BrowserError(f"chromium exited during {method}:\n{self.log_text()}")
                left = deadline - time.time()
                if left <= 0:
                    raise BrowserError(f"no answer to {method} within the timeout")
                self._cond.wait(left)
            answer = self._answers.pop(mid)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def cmd(self, method, params=None, timeout=None):
        """A command to the page."""
        return self.send(method, params, session=self.session, timeout=timeout)

    def log_text(self):
        try:
            with open(os.path.join(self.tmp, "chromium.log"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    # -- the page ----------------------------------------------------------------------------
    def js(self, expression):
        """Evaluates expression in the page (awaiting a promise); its JSON value."""
        r = self.cmd("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                          "returnByValue": True})
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text")
            raise BrowserError(f"script failed: {text}\n  in: {expression}")
        return r["result"].get("value")

    def wait(self, expression, timeout=20.0, what=None):
        """Polls expression until it is truthy; returns its value, or fails naming what."""
        deadline = time.time() + timeout
        while True:
            v = self.js(expression)
            if v:
                return v
            if time.time() >= deadline:
                problems = "\n".join(self.problems())
                raise AssertionError(f"timed out waiting for {what or expression}; page "
                                     f"errors: {problems or 'none'}; error box: "
                                     f"{self.js(ERROR_BOX)!r}")
            time.sleep(0.1)

    def goto(self, url):
        self.cmd("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete'", what=f"{url} to load")

    def click(self, selector):
        self.wait(f"!!document.querySelector({json.dumps(selector)})", what=selector)
        self.js(f"document.querySelector({json.dumps(selector)}).click()")

    def type(self, selector, text):
        """Focuses the element, clears it and types text as keyboard input."""
        self.wait(f"!!document.querySelector({json.dumps(selector)})", what=selector)
        self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                f"e.focus(); e.value = ''; }})()")
        self.cmd("Input.insertText", {"text": text})

    def press_enter(self):
        for kind in ("keyDown", "keyUp"):
            self.cmd("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                "windowsVirtualKeyCode": 13,
                                                "nativeVirtualKeyCode": 13})

    def screenshot(self, path, full_page=True, max_height=3000):
        """Writes a PNG of the page (the whole page, up to max_height CSS pixels)."""
        height = self.height
        if full_page:
            m = self.cmd("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m["contentSize"]
            height = int(min(max(size["height"], self.height), max_height))
            self.cmd("Emulation.setDeviceMetricsOverride",
                     {"width": self.width, "height": height, "deviceScaleFactor": 1,
                      "mobile": False})
        try:
            data = self.cmd("Page.captureScreenshot", {"format": "png"})["data"]
        finally:
            if full_page:
                self.cmd("Emulation.setDeviceMetricsOverride",
                         {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                          "mobile": False})
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def problems(self):
        """Console errors, uncaught exceptions and browser-reported errors (a
        Content-Security-Policy violation among them), as text."""
        out = []
        for ev in list(self.events):
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("exception: " + (d.get("exception", {}).get("description")
                                            or d.get("text", "")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}")
        return out

    def close(self):
        if self.proc and self.proc.poll() is None:
            try:
                self.send("Browser.close", timeout=5)
            except (BrowserError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


ERROR_BOX = "(document.getElementById('error') || {}).textContent || ''"
