// TLS against the engramd serving TLS 1.3 with a throwaway PKI (made by clients/run-tests
// with the openssl command line): a tenant's work over TLS; the server's certificate and
// name verified by default (another CA, another name and Node's bundled CAs refused at
// once, without retries); the admin key needs the operators' client certificate there;
// reconnects do a new handshake; pipelined and large requests share one session.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";

import { Client, TLSError, UnauthenticatedError } from "@engram/client";
import { HOST, PORT, Proxy, newTenant, tlsServer, vec } from "./helpers.mjs";

const t = tlsServer();

function tlsClient(apiKey, extra = {}) {
  return new Client({ host: t.host, port: t.port, apiKey, ca: t.ca, ...extra });
}

test("a tenant stores and searches over TLS", async () => {
  const key = await newTenant();
  const c = tlsClient(key);
  try {
    assert.match(String(c), /, tls\)$/);
    const { id } = await c.memory.store({ content: "The user prefers metric units", type: "preference", importance: 0.8, embedding: vec(0) });
    const hits = (await c.memory.search({ embedding: vec(0), top_k: 3 })).results;
    assert.deepEqual(hits.map((h) => h.id), [id]);
    assert.equal(hits[0].content, "The user prefers metric units");
    assert.equal((await c.memory.search({ query: "metric", mode: "text" })).results[0].id, id);
  } finally {
    c.close();
  }
  // the same database behind the plain port
  const plain = new Client({ host: HOST, port: PORT, apiKey: key });
  assert.equal((await plain.memory.stats()).total, 1);
  plain.close();
  // the certificate's DNS name, connecting to its address
  const byName = tlsClient(key, { servername: "localhost" });
  assert.equal((await byName.memory.stats()).total, 1);
  byName.close();
  // node:tls options of the caller's, here the CA and a TLS 1.3 floor of its own
  const opts = new Client({ host: t.host, port: t.port, apiKey: key, tls: { ca: t.ca, minVersion: "TLSv1.3" } });
  assert.equal((await opts.memory.stats()).total, 1);
  opts.close();
});

test("another CA, or Node's bundled CAs, are refused without retries", async () => {
  const key = await newTenant();
  for (const extra of [{ ca: t.otherCa }, { ca: undefined, tls: true }]) {
    const c = tlsClient(key, extra);
    try {
      await assert.rejects(c.memory.stats(), (e) => e instanceof TLSError && /certificate did not verify/.test(e.message));
    } finally {
      c.close();
    }
  }
});

test("another host name is refused", async () => {
  const c = tlsClient(await newTenant(), { servername: "engram.invalid" });
  try {
    await assert.rejects(c.memory.stats(), (e) => e instanceof TLSError && /engram\.invalid/.test(e.message));
  } finally {
    c.close();
  }
});

test("the admin key needs a client certificate", async () => {
  const admin = tlsClient(t.adminKey, { cert: t.clientCert, key: t.clientKey });
  let key;
  try {
    key = (await admin.admin.tenant.create({ name: "ts-tls-" + randomBytes(6).toString("hex"), tier: "premium" })).api_key;
    assert.ok((await admin.admin.tenant.list({ limit: 1 })).tenants.length > 0);
  } finally {
    admin.close();
  }
  const noCert = tlsClient(t.adminKey);
  try {
    await assert.rejects(noCert.admin.tenant.list({}), (e) => e instanceof UnauthenticatedError && /client certificate/.test(e.message));
  } finally {
    noCert.close();
  }
  const tenant = tlsClient(key); // a tenant key needs no certificate
  assert.equal((await tenant.tenant.usage()).tier, "premium");
  tenant.close();
  const rogue = tlsClient(t.adminKey, { cert: t.rogueCert, key: t.rogueKey });
  try {
    await assert.rejects(rogue.admin.tenant.list({}), (e) => e instanceof TLSError && /client certificate/.test(e.message));
  } finally {
    rogue.close();
  }
});

test("options are checked", () => {
  assert.throws(() => new Client({ port: t.port, tls: false, ca: t.ca }), TypeError);
  assert.throws(() => new Client({ port: t.port, ca: t.ca, key: t.clientKey }), TypeError);
  assert.throws(() => new Client({ port: t.port, tls: "yes" }), TypeError);
  assert.doesNotMatch(String(new Client({ port: t.port })), /tls/);
});

test("a reconnect does a new handshake", async () => {
  const key = await newTenant();
  const p = await new Proxy(t.port).listen(); // TCP only: the TLS session runs through it
  let c;
  try {
    c = tlsClient(key, { port: p.port });
    await c.memory.store({ content: "before the cut", type: "fact", importance: 0.5, embedding: vec(1) });
    p.cut();
    assert.equal((await c.memory.stats()).total, 1);
    assert.equal(p.accepted, 2);
  } finally {
    c?.close();
    await p.close();
  }
});

test("pipelined and large requests share one session", async () => {
  const c = tlsClient(await newTenant());
  try {
    const small = Array.from({ length: 200 }, (_, i) =>
      c.memory.store({ content: `p${i}`, type: "fact", importance: 0.5, embedding: vec(i) }));
    // about 4 MB in one request, while the answers to the others come back
    const big = c.memory.storeBatch({
      memories: Array.from({ length: 64 }, (_, i) => ({
        content: `${i} ` + "x".repeat(60000), type: "fact", importance: 0.5, embedding: vec(i),
      })),
    });
    const stored = await Promise.all(small);
    assert.equal(new Set(stored.map((r) => r.id)).size, 200);
    const { ids } = await big;
    assert.equal(ids.length, 64);
    const [m] = (await c.memory.get({ ids: [ids[0]] })).memories;
    assert.equal(m.content, "0 " + "x".repeat(60000));
    assert.equal((await c.memory.stats()).total, 264);
  } finally {
    c.close();
  }
});
