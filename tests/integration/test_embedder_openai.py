"""The openai embedding provider against a small OpenAI-compatible endpoint the test runs on
loopback: requests, batching, the API key, retries, timeouts, and nothing stored on failure."""
import contextlib
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from harness import Server, new_database, vec_bin

DIM = 64


def word_vec(word):
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(DIM)


def fake_embedding(text):
    """A bag-of-words embedding: texts sharing words point the same way."""
    v = sum(word_vec(w) for w in text.lower().split()) if text.split() else word_vec("")
    return v / np.linalg.norm(v)


class Endpoint:
    """An OpenAI-compatible POST /v1/embeddings on loopback. Faults by content (FAIL: 500,
    WRONGDIM, SLOW) or scripted: faults is a list of what the next requests get, one each
    ("429": 429 with Retry-After: 1, "500", "wrongdim", "timeout": an answer after 1.5 s);
    clearing gate holds every request until it is set again (at most 60 s), or, with
    hold_after n, every request after the next n."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        self.faults = []
        self.gate = threading.Event()
        self.gate.set()
        self.hold_after = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    hold = outer.hold_after is None or outer.hold_after <= 0
                    if outer.hold_after is not None:
                        outer.hold_after -= 1
                if hold:
                    outer.gate.wait(60)
                with outer.lock:
                    outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                           "body": body})
                    fault = outer.faults.pop(0) if outer.faults else None
                inputs = body["input"]
                if any("SLOW" in t for t in inputs) or fault == "timeout":
                    time.sleep(3 if fault is None else 1.5)  # wall clock: a slow provider
                if any("FAIL" in t for t in inputs) or fault in ("429", "500"):
                    self.send_response(429 if fault == "429" else 500)
                    if fault == "429":
                        self.send_header("Retry-After", "1")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                dim = DIM - 1 if any("WRONGDIM" in t for t in inputs) or fault == "wrongdim" else DIM
                data = [{"object": "embedding", "index": i,
                         "embedding": [float(x) for x in fake_embedding(t)[:dim]]}
                        for i, t in enumerate(inputs)]
                out = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()

    def take(self):
        with self.lock:
            r, self.requests = self.requests, []
        return r


KEY_ENV = {"ENGRAM_TEST_OPENAI_KEY": "sk-test-sekrit"}


def provider_args(ep, retries=2):
    """engramd's options for the openai provider at ep (model test-embed-1, DIM)."""
    return ["--openai-url", f"http://127.0.0.1:{ep.port}/v1/embeddings", "--openai-dim", str(DIM),
            "--openai-model", "test-embed-1", "--openai-key-env", "ENGRAM_TEST_OPENAI_KEY",
            "--openai-batch", "128", "--openai-retries", str(retries), "--openai-timeout-ms",
            "800"]


@contextlib.contextmanager
def endpoint_server(prefix, retries=2, extra=()):
    """The mock endpoint and an engramd using it on a new database: (srv, ep, dsn) for the
    block; then engramd stops, its log is checked for the API key, and both are removed."""
    ep = Endpoint()
    dsn = new_database(prefix)
    srv = Server(dsn, extra=provider_args(ep, retries) + list(extra), env=KEY_ENV).start()
    try:
        yield srv, ep, dsn
        srv.stop()
        assert "sk-test-sekrit" not in srv.log_text()
    finally:
        srv.cleanup()
        ep.close()


@pytest.fixture(scope="module")
def setup():
    with endpoint_server("oai") as (srv, ep, _):
        with srv.admin() as a:
            key = a.call("admin.tenant.create", name="oai", tier="premium",
                         embedding={"provider": "openai"})["api_key"]
        yield srv, ep, key


def test_store_and_search_use_the_endpoint(setup):
    srv, ep, key = setup
    ep.take()
    with srv.client(key=key) as c:
        a = c.call("memory.store", content="curve pool imbalance", type="fact", importance=0.5)["id"]
        c.call("memory.store", content="gas prices on sunday", type="fact", importance=0.5)
        reqs = ep.take()
        assert len(reqs) == 2
        assert reqs[0]["path"] == "/v1/embeddings" and reqs[0]["auth"] == "Bearer sk-test-sekrit"
        assert reqs[0]["body"]["model"] == "test-embed-1" and reqs[0]["body"]["input"] == ["curve pool imbalance"]
        res = c.call("memory.search", query="curve imbalance", top_k=1, similarity_weight=1.0)["results"]
        assert res[0]["id"] == a
        want = float(fake_embedding("curve imbalance") @ fake_embedding("curve pool imbalance"))
        assert res[0]["similarity"] == pytest.approx(want, abs=1e-5)
        assert ep.take()[0]["body"]["input"] == ["curve imbalance"]


def test_batches_are_split_by_openai_batch(setup):
    srv, ep, key = setup
    with srv.client(key=key) as c:
        ep.take()
        items = [{"content": f"note number {i}", "type": "episode", "importance": 0.2} for i in range(300)]
        items[5]["embedding"] = vec_bin(fake_embedding("given"))  # a given vector skips the provider
        ids = c.call("memory.store_batch", memories=items)["ids"]
        assert len(ids) == 300
        reqs = ep.take()
        assert [len(r["body"]["input"]) for r in reqs] == [128, 128, 43]
        sent = [t for r in reqs for t in r["body"]["input"]]
        assert sent == [it["content"] for i, it in enumerate(items) if i != 5]


def test_provider_failure_stores_nothing(setup):
    srv, ep, key = setup
    with srv.client(key=key) as c:
        before = c.call("memory.stats")["total"]
        ep.take()
        err = c.call_err("memory.store_batch", memories=[
            {"content": "fine", "type": "fact", "importance": 0.1},
            {"content": "this will FAIL", "type": "fact", "importance": 0.1}])
        assert err["code"] == "unavailable" and "500" in err["message"]
        assert len(ep.take()) == 3  # one attempt and two retries
        err = c.call_err("memory.store", content="WRONGDIM please", type="fact", importance=0.1)
        assert err["code"] == "unavailable" and "dimension" in err["message"]
        t0 = time.time()
        err = c.call_err("memory.search", query="SLOW query")
        assert err["code"] == "unavailable"
        assert time.time() - t0 < 6  # three attempts of 0.8 s plus pauses, never a hang
        assert c.call("memory.stats")["total"] == before
        assert c.call("ping") == "pong"


def test_provider_choice_is_validated(setup):
    srv, _, _ = setup
    with srv.admin() as a:
        err = a.call_err("admin.tenant.create", name="bad-dim", tier="free",
                         embedding={"provider": "openai", "dim": 32})
        assert err["code"] == "invalid_argument" and "dim" in err["message"]
        err = a.call_err("admin.tenant.create", name="bad-prov", tier="free",
                         embedding={"provider": "cohere"})
        assert err["code"] == "invalid_argument"


def test_unconfigured_provider_is_refused(server):
    with server.admin() as a:
        err = a.call_err("admin.tenant.create", name="no-oai", tier="free", embedding={"provider": "openai"})
        assert err["code"] == "invalid_argument" and "not configured" in err["message"]
