// Memory methods against a live engramd.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import {
  Client, ConflictError, EngramError, InvalidArgumentError, NotFoundError,
  PermissionDeniedError, UnauthenticatedError, embeddingBytes,
} from "@engram/client";
import { HOST, PORT, newTenant, vec } from "./helpers.mjs";

let c;
let key;
before(async () => {
  key = await newTenant();
  c = new Client({ host: HOST, port: PORT, apiKey: key });
});
after(() => c.close());

test("store, get, update, history, delete", async () => {
  const r = await c.memory.store({
    content: "Alice prefers tea", type: "preference", importance: 0.7, embedding: vec(0),
    metadata: { tokens: ["alice"], attrs: { k: 1 } }, agent_id: 7,
  });
  assert.equal(r.replayed, false);
  const [m] = (await c.memory.get({ ids: [r.id] })).memories;
  assert.equal(m.content, "Alice prefers tea");
  assert.deepEqual(m.metadata.tokens, ["alice"]);
  assert.equal(m.agent_id, 7);
  assert.equal((await c.memory.update({ id: r.id, content: "Alice prefers green tea" })).version, 2);
  const h = await c.memory.history({ id: r.id });
  assert.deepEqual(h.versions.map((v) => v.content), ["Alice prefers tea", "Alice prefers green tea"]);
  assert.deepEqual((await c.memory.delete({ ids: [r.id] })).deleted, [r.id]);
  await assert.rejects(c.memory.history({ id: r.id }), NotFoundError);
});

test("embeddings: Float32Array (no copy), number[] and bytes are the same vector", async () => {
  const f = vec(5);
  const view = embeddingBytes(f);
  assert.equal(view.buffer, f.buffer, "a Float32Array is sent from its own memory");
  const before = (await c.memory.stats()).total;
  const ids = [];
  for (const e of [f, Array.from(f), new Uint8Array(view)]) {
    ids.push((await c.memory.store({ content: "v", type: "fact", importance: 0.5, embedding: e })).id);
  }
  const page = await c.memory.list({ include_embedding: true, limit: 1000 });
  const mine = page.memories.filter((m) => ids.includes(m.id));
  assert.equal(mine.length, 3);
  for (const m of mine) {
    assert.ok(m.embedding instanceof Float32Array);
    assert.deepEqual(Array.from(m.embedding), Array.from(f));
  }
  const hits = (await c.memory.search({ embedding: f, top_k: 3 })).results;
  assert.ok(Math.abs(hits[0].similarity - 1) < 1e-5);
  assert.equal((await c.memory.stats()).total, before + 3);
});

test("text search and the memory context block", async () => {
  const k = new Client({ host: HOST, port: PORT, apiKey: await newTenant({ dim: 0 }) });
  try {
    await k.memory.storeBatch({ memories: [
      { content: "Never LP in pools with less than $100K TVL", type: "constraint", importance: 0.95 },
      { content: "The user lives in Lisbon", type: "fact", importance: 0.5 },
    ] });
    const hits = (await k.memory.search({ query: "Lisbon", mode: "text" })).results;
    assert.deepEqual(hits.map((h) => h.content), ["The user lives in Lisbon"]);
    const ctx = await k.memory.context({ query: "liquidity pools", budget_tokens: 200 });
    assert.match(ctx.text, /^<agent_memory>/);
    assert.ok(ctx.ids.length >= 1);
  } finally {
    k.close();
  }
});

test("errors are typed", async () => {
  await assert.rejects(c.memory.store({ content: "x", type: "nope", importance: 0.5 }), (e) =>
    e instanceof InvalidArgumentError && e.code === "invalid_argument" && /type/.test(e.serverMessage));
  await assert.rejects(c.admin.tenant.list(), PermissionDeniedError);
  await assert.rejects(c.call("no.such.method"), (e) => e instanceof EngramError && e.code === "unknown_method");
  const bad = new Client({ host: HOST, port: PORT, apiKey: "egk_not_a_key" });
  await assert.rejects(bad.memory.stats(), (e) => e instanceof UnauthenticatedError && !e.message.includes("egk_not"));
  bad.close();
  const { session_id } = await c.session.create({ agent_id: 1, config: { model: "m" } });
  await c.session.scratchpad.update({ session_id, content: "v1" });
  await assert.rejects(c.session.scratchpad.update({ session_id, content: "v2", expected_version: 0 }),
    (e) => e instanceof ConflictError && e.data.version === 1);
});

test("idempotency keys: explicit ones replay, generated ones differ per call", async () => {
  const a = await c.memory.store({ content: "once", type: "fact", importance: 0.5, embedding: vec(1), idempotency_key: "ts-k1" });
  const b = await c.memory.store({ content: "once", type: "fact", importance: 0.5, embedding: vec(1), idempotency_key: "ts-k1" });
  assert.equal(a.id, b.id);
  assert.equal(b.replayed, true);
  const x = await c.memory.store({ content: "twice", type: "fact", importance: 0.5, embedding: vec(1) });
  const y = await c.memory.store({ content: "twice", type: "fact", importance: 0.5, embedding: vec(1) });
  assert.notEqual(x.id, y.id);
});

test("sessions: notes, scratchpad, checkpoint, resume, handoff", async () => {
  const { session_id } = await c.session.create({ agent_id: 42, config: { model: "m1" } });
  await c.session.append({ session_id, role: "user", content: "hello" });
  await c.session.scratchpad.update({ session_id, content: "# plan" });
  await c.session.note.add({ session_id, category: "blocker", key: "ci", value: "flaky", scope: "session" });
  const cp = await c.session.checkpoint({ session_id, label: "cp1" });
  await c.session.append({ session_id, role: "assistant", content: "after" });
  const r = await c.session.resume({ checkpoint_id: cp.checkpoint_id });
  const msgs = (await c.session.messages({ session_id: r.session_id })).messages;
  assert.deepEqual(msgs.map((m) => m.content), ["hello"]);
  const h = await c.session.handoff({ session_id, mode: "continue" });
  assert.equal(h.scratchpad.content, "# plan");
  assert.deepEqual(h.blockers.map((n) => n.key), ["ci"]);
  assert.equal((await c.session.end({ session_id })).state, "ended");
});

test("ids are numbers; { bigint: true } gives every id as an exact bigint", async () => {
  const big = 2n ** 64n - 1n;
  const r = await c.memory.store({ content: "u64 agent", type: "fact", importance: 0.5, embedding: vec(3), agent_id: big });
  assert.equal(typeof r.id, "number");
  // a number cannot hold this agent id: rejected rather than rounded
  await assert.rejects(c.memory.get({ ids: [r.id] }),
    (e) => e instanceof RangeError && /agent_id .* \{ bigint: true \}/.test(e.message));
  const b = new Client({ host: HOST, port: PORT, apiKey: key, bigint: true });
  try {
    const [m] = (await b.memory.get({ ids: [BigInt(r.id)] })).memories;
    assert.equal(m.agent_id, big);
    assert.equal(m.id, BigInt(r.id));
    assert.equal(typeof m.clade_id, "bigint");
    assert.equal(typeof m.created_at, "number");
    assert.equal(typeof m.version, "number");
    const { session_id } = await b.session.create({ agent_id: big, config: { model: "m" } });
    assert.equal(typeof session_id, "bigint");
    assert.equal((await b.session.get({ session_id })).agent_id, big);
    assert.equal(typeof (await b.memory.stats()).archived, "number"); // a count, not ids
    assert.deepEqual((await b.memory.get({ ids: [999_999_999n] })).missing, [999_999_999n]);
  } finally {
    b.close();
  }
});

test("min_similarity and memory.prompt", async () => {
  const k = new Client({ host: HOST, port: PORT, apiKey: await newTenant() });
  try {
    const near = await k.memory.store({
      content: "the near one", type: "fact", importance: 0.1,
      embedding: [1, 0.1, 0, 0, 0, 0, 0, 0],
    });
    await k.memory.store({ content: "the far one", type: "fact", importance: 1, embedding: [0, 0, 1, 0, 0, 0, 0, 0] });
    const q = [1, 0, 0, 0, 0, 0, 0, 0];
    assert.equal((await k.memory.search({ embedding: q, top_k: 5 })).results.length, 2);
    const hits = (await k.memory.search({ embedding: q, top_k: 5, min_similarity: 0.5 })).results;
    assert.deepEqual(hits.map((h) => h.id), [near.id]);
    assert.deepEqual((await k.memory.context({ embedding: q, min_similarity: 0.5 })).ids, [near.id]);
    await assert.rejects(k.memory.search({ embedding: q, min_similarity: 2 }),
      (e) => e instanceof InvalidArgumentError && e.field === "min_similarity");
    const { session_id: sid } = await k.session.create({ agent_id: 1, config: { model: "m" } });
    await k.session.append({ session_id: sid, role: "user", content: "hello" });
    await k.session.scratchpad.update({ session_id: sid, content: "plan: test the prompt" });
    const p = await k.memory.prompt({ session_id: sid, embedding: q, min_similarity: 0.5, budget_tokens: 1000 });
    assert.deepEqual(p.parts.agent_memory.ids, [near.id]);
    assert.ok(p.parts.working_memory.text.includes("plan: test the prompt"));
    assert.equal(p.text, p.parts.agent_memory.text + p.parts.working_memory.text + p.parts.transcript.text);
    assert.equal(p.messages[0].role, "system");
    assert.deepEqual(p.messages.slice(1), [{ role: "user", content: "hello" }]);
    assert.ok(p.tokens_used <= 1000);
    await assert.rejects(k.memory.prompt({ session_id: sid + 1000, query: "x" }), NotFoundError);
  } finally {
    k.close();
  }
});
