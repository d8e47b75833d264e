// Pipelining, reconnects, lost answers, timeouts, rate limits and quotas.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Client, ConnectionLostError, QuotaExceededError, RateLimitedError, TimeoutError } from "@engram/client";
import { HOST, PORT, Proxy, newTenant, vec } from "./helpers.mjs";

test("pipelined calls on one connection get their own answers", async () => {
  const c = new Client({ host: HOST, port: PORT, apiKey: await newTenant() });
  const stored = await Promise.all(Array.from({ length: 200 }, (_, i) =>
    c.memory.store({ content: `p${i}`, type: "fact", importance: 0.5, embedding: vec(i) })));
  assert.equal(new Set(stored.map((r) => r.id)).size, 200);
  const got = await Promise.all(stored.map((r) => c.memory.get({ ids: [r.id] })));
  got.forEach((g, i) => assert.equal(g.memories[0].content, `p${i}`));
  c.close();
});

test("reconnects with backoff and authenticates again", async () => {
  const key = await newTenant();
  const p = await new Proxy().listen();
  const c = new Client({ host: "127.0.0.1", port: p.port, apiKey: key });
  try {
    assert.equal((await c.memory.stats()).total, 0);
    p.cut();
    assert.equal((await c.memory.stats()).total, 0); // a tenant method: auth was sent again
    p.refuse = 2;
    p.cut();
    assert.equal((await c.tenant.usage()).tier, "premium");
    assert.ok(p.accepted >= 5);
  } finally {
    c.close();
    await p.close();
  }
});

test("a lost answer: store is repeated with its idempotency key, append is reported", async () => {
  const key = await newTenant();
  const p = await new Proxy().listen();
  const c = new Client({ host: "127.0.0.1", port: p.port, apiKey: key });
  try {
    await c.connect();
    p.dropNextReply = true;
    const r = await c.memory.store({ content: "stored once", type: "fact", importance: 0.5, embedding: vec(0) });
    assert.equal(r.replayed, true);
    assert.equal((await c.memory.stats()).total, 1);
    const { session_id } = await c.session.create({ agent_id: 1, config: { model: "m" } });
    p.dropNextReply = true;
    await assert.rejects(c.session.append({ session_id, role: "user", content: "maybe" }),
      (e) => e instanceof ConnectionLostError && e.maybeCommitted === true);
    assert.equal((await c.session.messages({ session_id })).messages.length, 1);
  } finally {
    c.close();
    await p.close();
  }
});

test("timeouts", async () => {
  const key = await newTenant();
  const p = await new Proxy().listen();
  const c = new Client({ host: "127.0.0.1", port: p.port, apiKey: key, timeoutMs: 5000 });
  try {
    await c.connect();
    p.blackhole = true;
    const t0 = Date.now();
    await assert.rejects(c.memory.stats({ timeoutMs: 300 }), TimeoutError);
    assert.ok(Date.now() - t0 < 2000);
    p.blackhole = false;
    assert.equal((await c.memory.stats()).total, 0);
  } finally {
    c.close();
    await p.close();
  }
});

test("rate limits: raised with retryAfterMs, or honoured", async () => {
  const key = await newTenant({ tier: "free" }); // 2/s, burst 3 (clients/run-tests)
  const c = new Client({ host: HOST, port: PORT, apiKey: key, retry: { honorRateLimits: false } });
  await assert.rejects(async () => {
    for (let i = 0; i < 10; i++) await c.memory.stats();
  }, (e) => e instanceof RateLimitedError && e.retryAfterMs > 0);
  c.close();
  const d = new Client({ host: HOST, port: PORT, apiKey: key });
  for (let i = 0; i < 4; i++) await d.memory.stats();
  d.close();
});

test("quota exceeded carries limit and usage", async () => {
  const key = await newTenant({ tier: "standard" }); // 3 memories (clients/run-tests)
  const c = new Client({ host: HOST, port: PORT, apiKey: key });
  for (let i = 0; i < 3; i++) await c.memory.store({ content: `m${i}`, type: "fact", importance: 0.5, embedding: vec(i) });
  await assert.rejects(c.memory.store({ content: "too many", type: "fact", importance: 0.5, embedding: vec(9) }),
    (e) => e instanceof QuotaExceededError && e.limit === 3 && e.usage === 3 && e.requested === 1);
  c.close();
});

test("answers out of order reach their callers (msgid matching)", async () => {
  const { createServer } = await import("node:net");
  const { Decoder, encode } = await import("@msgpack/msgpack");
  const srv = createServer(async (sock) => {
    const reqs = [];
    for await (const msg of new Decoder().decodeStream(sock)) {
      reqs.push(msg);
      if (reqs.length === 20) {
        for (const [, msgid, , params] of reqs.reverse()) sock.write(encode([1, msgid, null, { echo: params[0].ids[0] }]));
      }
    }
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const c = new Client({ host: "127.0.0.1", port: srv.address().port });
  const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => c.memory.get({ ids: [i] })));
  assert.deepEqual(answers.map((a) => a.echo), Array.from({ length: 20 }, (_, i) => i));
  c.close();
  await new Promise((r) => srv.close(r));
});
