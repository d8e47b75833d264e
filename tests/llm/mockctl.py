#!/usr/bin/env python3
"""tests/llm/mockctl.py: start and drive mock_llm.py from tests.

    from mockctl import MockLLM
    with MockLLM(key="sk-test-...") as m:
        m.script([{"match": "hello", "reply": {"text": "hi"}}])
        url = m.url("anthropic")          # what engramd's llm base_url would be
        ...
        calls = m.calls()                 # what the mock received, for assertions

The mock runs as a subprocess (its own interpreter, so a busy test process cannot slow its
answers), on a free loopback port, and stops with the object (or when this process dies:
it exits when its stdin closes).

Command line, for tests in other languages:
    mockctl.py pki DIR      write a throwaway PKI into DIR (tests/integration/tlsutil.py's
                            make_pki) and print its paths as JSON
"""
import json
import os
import ssl
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MOCK = os.path.join(HERE, "mock_llm.py")


class MockLLM:
    def __init__(self, key="sk-mock-key", rules=None, tls_cert=None, tls_key=None,
                 python=None):
        """Starts the mock. rules: a list of rules (see mock_llm.py); tls_cert/tls_key: serve
        the APIs over HTTPS with that certificate (the control port stays plain)."""
        args = [python or sys.executable, MOCK, "--port", "0"]
        if tls_cert:
            args += ["--tls-cert", tls_cert, "--tls-key", tls_key]
        env = dict(os.environ, MOCK_LLM_KEY=key, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)
        line = self.proc.stdout.readline().split()
        if len(line) != 4 or line[0] != "PORT":
            self.stop()
            raise RuntimeError(f"mock_llm did not start: {line!r}")
        self.port, self.control = int(line[1]), int(line[3])
        self.scheme = "https" if tls_cert else "http"
        if rules is not None:
            self.script(rules)

    def url(self, api):
        """The base URL of an API as the providers' SDKs (and llm.h) take it."""
        base = f"{self.scheme}://127.0.0.1:{self.port}"
        return base if api == "anthropic" else base + "/v1"

    def _ctl(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.control}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def script(self, rules):
        """Replaces the rules (hit counters restart)."""
        self._ctl("POST", "/_script", {"rules": rules})

    def calls(self):
        """The requests received since the last reset: a list of dicts (see mock_llm.py)."""
        return self._ctl("GET", "/_calls")["calls"]

    def max_inflight(self):
        """The most requests the mock held at once since the last reset."""
        return self._ctl("GET", "/_calls")["max_inflight"]

    def reset(self):
        self._ctl("POST", "/_reset", {})

    def release(self):
        """Lets the answers of rules with "hold" go (held ones and later ones)."""
        self._ctl("POST", "/_release", {})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def make_pki(d):
    """The project's throwaway PKI (tests/integration/tlsutil.py) in directory d."""
    sys.path.insert(0, os.path.join(HERE, "..", "integration"))
    import tlsutil
    return tlsutil.make_pki(d)


def client_context(ca):
    """An ssl.SSLContext that trusts ca, for talking HTTPS to the mock from Python."""
    return ssl.create_default_context(cafile=ca)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "pki":
        print(json.dumps(make_pki(os.path.abspath(sys.argv[2]))))
    else:
        sys.exit(__doc__)
