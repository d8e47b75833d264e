// The fetch transport against the live engramd's HTTP port: HttpClient and the Node Client
// given an http:// URL, the same methods and error classes as over MessagePack-RPC.
import { test, before } from "node:test";
import assert from "node:assert/strict";

import {
  Client, HttpClient, InvalidArgumentError, NotFoundError, QuotaExceededError, RateLimitedError,
  UnauthenticatedError, UnavailableError, ConnectionLostError,
} from "@engram/client";
import { adminKey, closedPort, httpUrl, newTenant, vec } from "./helpers.mjs";

/** A direction of its own: the search finds it first. */
function axis(k) {
  const v = new Float32Array(8).fill(0.01);
  v[k] = 1;
  return v;
}

let key;
before(async () => {
  key = await newTenant();
});

for (const [name, make, v] of [
  ["HttpClient", (o) => new HttpClient({ url: httpUrl(), ...o }), axis(6)],
  ["Client with an http:// URL", (o) => new Client({ url: httpUrl(), env: {}, ...o }), axis(7)],
]) {
  test(`${name}: store, search, list with embeddings, update, errors`, async () => {
    const c = make({ apiKey: key });
    assert.doesNotMatch(String(c), /egk_/);
    const r = await c.memory.store({ content: `over ${name}`, type: "fact", importance: 0.5, embedding: v, agent_id: 3 });
    assert.equal(typeof r.id, "number");
    assert.equal(r.replayed, false);
    const [m] = (await c.memory.get({ ids: [r.id] })).memories;
    assert.equal(m.content, `over ${name}`);
    assert.equal(m.agent_id, 3);
    const hits = (await c.memory.search({ embedding: [...v], top_k: 1 })).results;
    assert.equal(hits[0].id, r.id);
    const listed = (await c.memory.list({ include_embedding: true, limit: 100 })).memories.find((x) => x.id === r.id);
    assert.ok(listed.embedding instanceof Float32Array);
    assert.deepEqual([...listed.embedding], [...v]);
    const batch = await c.memory.storeBatch({ memories: [
      { content: "b1", type: "fact", importance: 0.1, embedding: vec(1) },
      { content: "b2", type: "fact", importance: 0.2, embedding: new Float32Array(vec(2)) },
    ] });
    assert.equal(batch.ids.length, 2);
    assert.equal((await c.memory.update({ id: r.id, importance: 0.9 })).version, 2);
    const { session_id } = await c.session.create({ agent_id: 1, config: { model: "m" } });
    await c.session.append({ session_id, role: "user", content: "hello" });
    assert.equal((await c.session.messages({ session_id })).messages.length, 1);
    assert.equal(await c.ping(), "pong");
    await assert.rejects(c.memory.search({ query: "x", top_k: 0 }),
      (e) => e instanceof InvalidArgumentError && e.code === "invalid_argument" && e.field === "top_k");
    await assert.rejects(c.call("memory.store", { content: "x", type: "fact" }),
      (e) => e instanceof InvalidArgumentError && e.field === "importance");
    await assert.rejects(c.memory.history({ id: 999_999_999 }), NotFoundError);
    c.close();
    await assert.rejects(make({ apiKey: "egk_aaaaaaaaaaaa_" + "b".repeat(40) }).memory.stats(), UnauthenticatedError);
  });
}

test("HttpClient: rate limits carry Retry-After, quotas their limit", async () => {
  const free = new HttpClient({ url: httpUrl(), apiKey: await newTenant({ tier: "free" }), retry: { honorRateLimits: false } });
  let limited;
  for (let i = 0; i < 10 && !limited; i++) {
    try {
      await free.memory.stats();
    } catch (e) {
      limited = e;
    }
  }
  assert.ok(limited instanceof RateLimitedError, String(limited));
  assert.ok(limited.retryAfterMs > 0);
  // honoured: the call waits and goes through
  const patient = new HttpClient({ url: httpUrl(), apiKey: await newTenant({ tier: "free" }) });
  for (let i = 0; i < 6; i++) await patient.memory.stats();
  const std = new HttpClient({ url: httpUrl(), apiKey: await newTenant({ tier: "standard", dim: 0 }) });
  for (let i = 0; i < 3; i++) await std.memory.store({ content: `m${i}`, type: "fact", importance: 0.5 });
  await assert.rejects(std.memory.store({ content: "one too many", type: "fact", importance: 0.5 }),
    (e) => e instanceof QuotaExceededError && e.limit === 3 && e.usage === 3);
});

test("HttpClient: auth checks a key and keeps it, as on a connection", async () => {
  const c = new HttpClient({ url: httpUrl(), env: {} });
  await assert.rejects(c.memory.stats(), UnauthenticatedError);
  const who = await c.auth({ api_key: key });
  assert.equal(who.tier, "premium");
  assert.equal(typeof who.tenant_id, "number");
  assert.equal(typeof (await c.memory.stats()).total, "number");
  await assert.rejects(c.auth({ api_key: "egk_aaaaaaaaaaaa_" + "c".repeat(40) }), UnauthenticatedError);
  await assert.rejects(c.memory.stats(), UnauthenticatedError); // a failed auth drops the key
  assert.deepEqual(await new HttpClient({ url: httpUrl(), env: {} }).auth({ api_key: adminKey }), { admin: true });
});

test("HttpClient: bigint ids, exact past 2^53, in both directions", async () => {
  const big = 2n ** 64n - 2n;
  const c = new HttpClient({ url: httpUrl(), apiKey: key, bigint: true });
  const r = await c.memory.store({ content: "u64 over http", type: "fact", importance: 0.5, embedding: vec(4), agent_id: big });
  assert.equal(typeof r.id, "bigint");
  const [m] = (await c.memory.get({ ids: [r.id] })).memories;
  assert.equal(m.agent_id, big);
  assert.equal(typeof m.importance, "number");
  const n = new HttpClient({ url: httpUrl(), apiKey: key });
  await assert.rejects(n.memory.get({ ids: [Number(r.id)] }), RangeError); // not rounded
});

test("HttpClient: statuses without an Engram body, and Retry-After, map to the error classes", async () => {
  const fake = (status, body, headers = {}) => async () => new Response(body, { status, headers });
  const mk = (f) => new HttpClient({ url: "http://engram.invalid", fetch: f, retry: { maxRetries: 0, honorRateLimits: false } });
  await assert.rejects(mk(fake(502, "<html>bad gateway</html>")).memory.stats(), UnavailableError);
  await assert.rejects(mk(fake(429, '{"error":{"code":"rate_limited","message":"slow down"}}', { "Retry-After": "2" })).memory.stats(),
    (e) => e instanceof RateLimitedError && e.retryAfterMs === 2000);
  await assert.rejects(mk(fake(400, '{"error":{"code":"invalid_argument","message":"whatever","field":"top_k"}}')).memory.stats(),
    (e) => e instanceof InvalidArgumentError && e.field === "top_k");
  // the body a request sends: JSON, embeddings as base64, bigints exact
  let sent;
  const echo = async (url, init) => {
    sent = { url, init };
    return new Response('{"id": 12345678901234567890, "created_at": 1, "replayed": false}', { status: 200 });
  };
  const b = new HttpClient({ url: "http://engram.invalid/prefix/", fetch: echo, apiKey: "egk_test", bigint: true });
  const r = await b.memory.store({ content: "x", type: "fact", importance: 0.5, embedding: [1, 2], agent_id: 2n ** 63n });
  assert.equal(r.id, 12345678901234567890n);
  assert.equal(sent.url, "http://engram.invalid/prefix/v1/rpc/memory.store");
  assert.equal(sent.init.headers.Authorization, "Bearer egk_test");
  assert.match(sent.init.body, /"agent_id":9223372036854775808[,}]/);
  assert.match(sent.init.body, /"embedding":"AACAPwAAAEA="/); // float32 LE of [1, 2]
  assert.match(sent.init.body, /"idempotency_key":"ts-[0-9a-f-]{36}"/);
});

test("fetch transport: a refused connection rejects within a second", async () => {
  const port = await closedPort();
  for (const c of [new HttpClient({ url: `http://127.0.0.1:${port}`, apiKey: "egk_x" }),
    new Client({ url: `http://127.0.0.1:${port}`, apiKey: "egk_x", env: {} })]) {
    const t = Date.now();
    await assert.rejects(c.memory.stats(), (e) => e instanceof ConnectionLostError && /ECONNREFUSED|fetch failed/.test(e.message));
    const took = (Date.now() - t) / 1000;
    console.log(`${c}: refused port, rejected after ${took.toFixed(2)} s`);
    assert.ok(took < 3, `took ${took} s`);
  }
});
