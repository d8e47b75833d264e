// engram-mcp --http with several clients: MCP clients from the official SDK (and raw HTTP
// requests where a status code is the point) against a live engramd. Each MCP session has its
// own Engram session and scratchpad, acts with the tenant key its client sent, is refused to
// any other key and to Origins off the allow-list, and ends on DELETE, on an idle timeout or
// when the cap on sessions is reached for newcomers. No key is ever written to the log.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes, randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import * as net from "node:net";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Client as Engram } from "@engram/client";

const MAIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "main.js");
const PORT = process.env.ENGRAM_TEST_PORT;
const ADMIN_KEY_FILE = process.env.ENGRAM_TEST_ADMIN_KEY_FILE;
if (!PORT || !ADMIN_KEY_FILE) throw new Error("ENGRAM_TEST_PORT and ENGRAM_TEST_ADMIN_KEY_FILE must name a running engramd: run clients/run-tests");
const HOST = process.env.ENGRAM_TEST_HOST ?? "127.0.0.1";
const ADMIN_KEY = readFileSync(ADMIN_KEY_FILE, "utf8").trim();

const WRONG_KEY = "egk_" + randomBytes(24).toString("hex"); // well formed, never issued
let keyA; // tenant A
let keyB; // tenant B
let keyC; // tenant C: the server's own ENGRAM_API_KEY, which HTTP clients must not get
const servers = []; // every engram-mcp started, checked for keys in its log at the end

before(async () => {
  const admin = new Engram({ host: HOST, port: Number(PORT), apiKey: ADMIN_KEY });
  const tenant = async (n) =>
    (await admin.admin.tenant.create({ name: `mcp-http-${n}-` + randomBytes(6).toString("hex"), tier: "premium" })).api_key;
  keyA = await tenant("a");
  keyB = await tenant("b");
  keyC = await tenant("c");
  admin.close();
});

after(async () => {
  for (const s of servers) await s.stop();
  for (const s of servers) {
    for (const k of [keyA, keyB, keyC, WRONG_KEY, ADMIN_KEY]) {
      assert.ok(!s.stderr().includes(k), "a key was written to engram-mcp's log");
    }
  }
});

/** Starts engram-mcp --http 0 with args; resolves to {url, port, stderr(), stop()}. */
async function startServer(args = [], env = { ENGRAM_API_KEY: keyC }) {
  const child = spawn(process.execPath, [MAIN, "--http", "0", ...args], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ENGRAM_HOST: HOST, ENGRAM_PORT: PORT, ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let buf = "";
  child.stderr.on("data", (d) => (buf += d));
  const exited = new Promise((resolve) => child.on("exit", resolve));
  const url = await Promise.race([
    new Promise((resolve) => child.stderr.on("data", () => {
      const m = /listening on (http:\S+)/.exec(buf);
      if (m) resolve(m[1]);
    })),
    exited.then((code) => Promise.reject(new Error(`engram-mcp exited ${code}: ${buf}`))),
  ]);
  const s = {
    url,
    port: Number(new URL(url).port),
    stderr: () => buf,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
  servers.push(s);
  return s;
}

/** Runs engram-mcp with args expecting it to refuse to start: resolves to {code, stderr}. */
async function startFails(args, env) {
  const child = spawn(process.execPath, [MAIN, ...args], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ENGRAM_HOST: HOST, ENGRAM_PORT: PORT, ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let buf = "";
  child.stderr.on("data", (d) => (buf += d));
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  const code = await new Promise((resolve) => child.on("exit", resolve));
  clearTimeout(timer);
  return { code, stderr: buf };
}

/** An SDK client connected with key (none: no Authorization header) and extra headers. */
async function connect(url, key, headers = {}) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: key === undefined ? headers : { Authorization: `Bearer ${key}`, ...headers } },
  });
  const client = new McpClient({ name: "engram-mcp-http-test", version: "0.0.0" });
  await client.connect(transport);
  return { client, transport, sid: transport.sessionId };
}

/**
 * Waits until srv's log matches re (not global), at most limitMs: engram-mcp writes its
 * lines on its own time, and this process reads them from a pipe that may lag the HTTP
 * answer it has just had. Fails naming what it waited for, with the log's end.
 */
async function logged(srv, re, what, limitMs = 10_000) {
  const t0 = Date.now();
  while (!re.test(srv.stderr())) {
    if (Date.now() - t0 > limitMs) {
      assert.fail(`waited ${limitMs} ms for ${what} (${re}) in engram-mcp's log; it ends:\n` +
        srv.stderr().slice(-2000));
    }
    await sleep(50);
  }
}

const text = (r) => r.content.map((c) => c.text).join("\n");
const call = async (c, name, args) => {
  const r = await c.client.callTool({ name, arguments: args });
  assert.equal(r.isError, undefined, `${name}: ${text(r)}`);
  return text(r);
};

const INIT = {
  jsonrpc: "2.0", id: 1, method: "initialize",
  params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "0" } },
};
const LIST = { jsonrpc: "2.0", id: 2, method: "tools/list", params: {} };
const remember = (content) => ({ jsonrpc: "2.0", id: 3, method: "tools/call", params: { name: "remember", arguments: { content } } });

/** A raw HTTP request to the MCP endpoint; the body is read whole (an SSE answer ends with it). */
async function raw(url, { method = "POST", key, sid, origin, body, headers = {} } = {}) {
  const h = { Accept: "application/json, text/event-stream", ...headers };
  if (method === "POST") h["Content-Type"] = "application/json";
  if (key !== undefined) h.Authorization = `Bearer ${key}`;
  if (sid !== undefined) h["Mcp-Session-Id"] = sid;
  if (origin !== undefined) h.Origin = origin;
  if (sid !== undefined) h["Mcp-Protocol-Version"] = "2025-06-18";
  const res = await fetch(url, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: res.status, headers: res.headers, body: await res.text() };
}

/** What a tenant's memories say, read straight from engramd. */
async function memoriesOf(key, query) {
  const e = new Engram({ host: HOST, port: Number(PORT), apiKey: key });
  try {
    return (await e.memory.search({ query, mode: "text", top_k: 50 })).results.map((m) => m.content);
  } finally {
    e.close();
  }
}

test("each client has its own session: two tenant keys, and one key twice, at once", async () => {
  const srv = await startServer();
  const clients = {
    a1: await connect(srv.url, keyA),
    a2: await connect(srv.url, keyA),
    b: await connect(srv.url, keyB),
  };
  try {
    assert.equal(new Set(Object.values(clients).map((c) => c.sid)).size, 3);
    const names = Object.keys(clients);
    // all at once: each writes its scratchpad and a note in its current session
    const sessions = await Promise.all(names.map(async (n) => {
      const r = await call(clients[n], "scratchpad_update", { content: `plan of ${n}` });
      await call(clients[n], "note_add", { category: "context", key: "who", value: `written by ${n}` });
      return /session (\d+)/.exec(r)[1];
    }));
    // session ids count per tenant: a1's and a2's must differ (b's is in another tenant)
    assert.notEqual(sessions[0], sessions[1], "a1 and a2 share an Engram session");
    await Promise.all(names.map(async (n) => {
      const pad = await call(clients[n], "scratchpad_read", {});
      assert.match(pad, new RegExp(`plan of ${n}$`));
      assert.equal(await call(clients[n], "notes", {}), `[context/session] who: written by ${n}`);
    }));

    // long-term memory is the tenant's: a1's memory is a2's, never b's, never the server's key's
    await call(clients.a1, "remember", { content: "Zanzibar note stored by a1" });
    await call(clients.b, "remember", { content: "Zanzibar note stored by b" });
    assert.match(await call(clients.a2, "recall", { query: "Zanzibar", mode: "text" }), /stored by a1/);
    assert.doesNotMatch(await call(clients.a2, "recall", { query: "Zanzibar", mode: "text" }), /stored by b/);
    assert.deepEqual(await memoriesOf(keyA, "Zanzibar"), ["Zanzibar note stored by a1"]);
    assert.deepEqual(await memoriesOf(keyB, "Zanzibar"), ["Zanzibar note stored by b"]);
    assert.deepEqual(await memoriesOf(keyC, "Zanzibar"), []);
  } finally {
    for (const c of Object.values(clients)) await c.client.close();
  }
});

test("no key or a wrong key: 401 with WWW-Authenticate, and no session", async () => {
  const srv = await startServer(); // ENGRAM_API_KEY is set, and still not lent to HTTP clients
  let r = await raw(srv.url, { body: INIT });
  assert.equal(r.status, 401);
  assert.match(r.headers.get("www-authenticate"), /^Bearer realm="engram-mcp"$/);
  assert.equal(r.headers.get("mcp-session-id"), null);

  r = await raw(srv.url, { body: INIT, key: WRONG_KEY });
  assert.equal(r.status, 401);
  assert.match(r.headers.get("www-authenticate"), /^Bearer .*error="invalid_token"/);
  assert.equal(r.headers.get("mcp-session-id"), null);
  assert.ok(!r.body.includes(WRONG_KEY));

  r = await raw(srv.url, { body: INIT, headers: { Authorization: "Basic dXNlcjpwYXNz" } });
  assert.equal(r.status, 401);
  r = await raw(srv.url, { body: remember("stored without a key") });
  assert.equal(r.status, 401);
  assert.deepEqual(await memoriesOf(keyC, "without"), []);

  // the admin key authenticates but has no tenant: refused too
  r = await raw(srv.url, { body: INIT, key: ADMIN_KEY });
  assert.equal(r.status, 403);
  assert.equal(r.headers.get("mcp-session-id"), null);

  // no OAuth: nothing to discover
  r = await raw(srv.url.replace(/\/mcp$/, "/.well-known/oauth-protected-resource"), { method: "GET" });
  assert.equal(r.status, 404);

  // the SDK client sees the 401
  await assert.rejects(connect(srv.url, WRONG_KEY), (e) => e.code === 401);
  await assert.rejects(connect(srv.url, undefined), (e) => e.code === 401);
  assert.match(srv.stderr(), /listening on/);
  assert.doesNotMatch(srv.stderr(), /session \w+ opened/);
});

test("engramd unreachable at initialize: 503, and no session", async () => {
  const closedPort = await new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const srv = await startServer([], { ENGRAM_PORT: String(closedPort), ENGRAM_TIMEOUT_MS: "1500" });
  const r = await raw(srv.url, { body: INIT, key: keyA });
  assert.equal(r.status, 503);
  assert.ok(Number(r.headers.get("retry-after")) > 0);
  assert.equal(r.headers.get("mcp-session-id"), null);
  await logged(srv, /cannot authenticate against engramd/, "the failed authentication");
});

test("a session is bound to the key that created it", async () => {
  const srv = await startServer();
  const a = await connect(srv.url, keyA);
  try {
    await call(a, "scratchpad_update", { content: "A's secret plan" });
    const read = { jsonrpc: "2.0", id: 9, method: "tools/call", params: { name: "scratchpad_read", arguments: {} } };
    let r = await raw(srv.url, { sid: a.sid, key: keyB, body: read });
    assert.equal(r.status, 403);
    assert.doesNotMatch(r.body, /secret plan/);
    r = await raw(srv.url, { sid: a.sid, body: read });
    assert.equal(r.status, 401);
    r = await raw(srv.url, { sid: a.sid, key: WRONG_KEY, body: read });
    assert.equal(r.status, 403);
    r = await raw(srv.url, { method: "GET", sid: a.sid, key: keyB, headers: { Accept: "text/event-stream" } });
    assert.equal(r.status, 403);
    r = await raw(srv.url, { method: "DELETE", sid: a.sid, key: keyB });
    assert.equal(r.status, 403);
    // the owner's key still works, the session was not ended
    r = await raw(srv.url, { sid: a.sid, key: keyA, body: read });
    assert.equal(r.status, 200);
    assert.match(r.body, /A's secret plan/);
    assert.match(await call(a, "scratchpad_read", {}), /A's secret plan/);
  } finally {
    await a.client.close();
  }
});

test("Origin: 403 before anything else off the allow-list; loopback origins work", async () => {
  const srv = await startServer();
  const evil = "http://evil.example";
  let r = await raw(srv.url, { body: INIT, origin: evil, key: keyA });
  assert.equal(r.status, 403);
  assert.equal(r.headers.get("mcp-session-id"), null);
  assert.equal(r.headers.get("access-control-allow-origin"), null);
  r = await raw(srv.url, { body: INIT, origin: evil }); // before authentication
  assert.equal(r.status, 403);
  r = await raw(srv.url, { body: remember("Quokka from evil.example, no session"), origin: evil });
  assert.equal(r.status, 403);
  assert.deepEqual(await memoriesOf(keyC, "Quokka"), []);

  // a live session: a call carrying a foreign Origin does nothing
  const a = await connect(srv.url, keyA);
  try {
    r = await raw(srv.url, { sid: a.sid, key: keyA, origin: evil, body: remember("Quokka from evil.example") });
    assert.equal(r.status, 403);
    r = await raw(srv.url, { method: "DELETE", sid: a.sid, key: keyA, origin: evil });
    assert.equal(r.status, 403);
    for (const o of ["http://localhost.evil.example", "https://localhost", "http://127.0.0.1.evil.example:80",
      "null", "http://localhost, http://evil.example", "https://app.example.com"]) {
      r = await raw(srv.url, { sid: a.sid, key: keyA, origin: o, body: LIST });
      assert.equal(r.status, 403, o);
    }
    r = await raw(srv.url, { method: "OPTIONS", origin: evil });
    assert.equal(r.status, 403);
    assert.deepEqual(await memoriesOf(keyA, "Quokka"), []);
    assert.equal((await a.client.listTools()).tools.length, 15); // not deleted

    // loopback origins, on any port
    for (const o of [`http://localhost:${srv.port}`, "http://127.0.0.1:5173", "http://[::1]:8080", "http://LOCALHOST"]) {
      r = await raw(srv.url, { sid: a.sid, key: keyA, origin: o, body: LIST });
      assert.equal(r.status, 200, o);
      assert.equal(r.headers.get("access-control-allow-origin"), o);
      assert.match(r.headers.get("access-control-expose-headers"), /Mcp-Session-Id/);
    }
    r = await raw(srv.url, { method: "OPTIONS", origin: "http://localhost:5173" });
    assert.equal(r.status, 204);
    assert.match(r.headers.get("access-control-allow-headers"), /Authorization/);
    assert.match(r.headers.get("access-control-allow-headers"), /Mcp-Session-Id/);
  } finally {
    await a.client.close();
  }
  // an SDK client sending an allowed Origin works end to end; a foreign one does not
  const local = await connect(srv.url, keyA, { Origin: `http://localhost:${srv.port}` });
  try {
    await call(local, "remember", { content: "Quokka from localhost" });
    assert.deepEqual(await memoriesOf(keyA, "Quokka"), ["Quokka from localhost"]);
  } finally {
    await local.client.close();
  }
  await assert.rejects(connect(srv.url, keyA, { Origin: evil }), (e) => e.code === 403);
});

test("Origin: --allow-origin and ENGRAM_MCP_ALLOWED_ORIGINS add exact origins", async () => {
  const srv = await startServer(["--allow-origin", "https://app.example.com"],
    { ENGRAM_API_KEY: keyC, ENGRAM_MCP_ALLOWED_ORIGINS: "https://other.example.org:8443, http://dev.example.net" });
  const a = await connect(srv.url, keyA, { Origin: "https://app.example.com" });
  try {
    for (const o of ["https://app.example.com", "https://app.example.com:443", "https://other.example.org:8443",
      "http://dev.example.net", "http://127.0.0.1:9000"]) {
      const r = await raw(srv.url, { sid: a.sid, key: keyA, origin: o, body: LIST });
      assert.equal(r.status, 200, o);
    }
    for (const o of ["https://app.example.com:8443", "http://app.example.com", "https://other.example.org",
      "https://dev.example.net", "http://evil.example"]) {
      const r = await raw(srv.url, { sid: a.sid, key: keyA, origin: o, body: LIST });
      assert.equal(r.status, 403, o);
    }
  } finally {
    await a.client.close();
  }
  // an allow-list entry that is not an origin stops the server at start
  for (const o of ["https://app.example.com/path", "*", "app.example.com"]) {
    const bad = await startFails(["--http", "0", "--allow-origin", o], {});
    assert.equal(bad.code, 2, o);
    assert.match(bad.stderr, /not an origin/);
  }
});

test("DELETE ends a session; unknown sessions get 404, requests without one 400", async () => {
  const srv = await startServer();
  const a = await connect(srv.url, keyA);
  await call(a, "scratchpad_update", { content: "soon gone" });
  const sid = a.sid;
  await a.transport.terminateSession();
  let r = await raw(srv.url, { sid, key: keyA, body: LIST });
  assert.equal(r.status, 404);
  r = await raw(srv.url, { method: "GET", sid, key: keyA, headers: { Accept: "text/event-stream" } });
  assert.equal(r.status, 404);
  await a.client.close();
  await logged(srv, new RegExp(`session ${sid.slice(0, 8)} closed \\(deleted by the client\\)`),
    "the deleted session's close");

  r = await raw(srv.url, { sid: randomUUID(), key: keyA, body: LIST });
  assert.equal(r.status, 404);
  r = await raw(srv.url, { key: keyA, body: LIST });
  assert.equal(r.status, 400);
  r = await raw(srv.url, { key: keyA, body: remember("stored without a session") });
  assert.equal(r.status, 400);
  assert.deepEqual(await memoriesOf(keyA, "without"), []);
  r = await raw(srv.url, { method: "GET", key: keyA, headers: { Accept: "text/event-stream" } });
  assert.equal(r.status, 400);
  // an initialize the transport refuses makes no session
  r = await raw(srv.url, { key: keyA, body: INIT, headers: { Accept: "application/json" } });
  assert.equal(r.status, 406);
  assert.equal(r.headers.get("mcp-session-id"), null);
  await logged(srv, / opened /, "the session's opening");
  assert.equal(srv.stderr().match(/ opened /g).length, 1);
});

test("sessions are capped, and closed after the idle timeout once their client is gone", async () => {
  const srv = await startServer(["--max-sessions", "2", "--idle-timeout", "1"]);
  const c1 = await connect(srv.url, keyA);
  const c2 = await connect(srv.url, keyB);
  let r = await raw(srv.url, { body: INIT, key: keyA });
  assert.equal(r.status, 503);
  assert.ok(Number(r.headers.get("retry-after")) > 0);
  await assert.rejects(connect(srv.url, keyA), (e) => e.code === 503);

  // c1 goes away (its SSE stream closes); c2 stays connected, its GET stream open
  const sid1 = c1.sid;
  await c1.client.close();
  const t0 = Date.now();
  const closed = new RegExp(`session ${sid1.slice(0, 8)} closed \\(idle\\)`);
  // expected 1 to 1.5 s from now, bounded for a loaded machine (a request would be activity)
  await logged(srv, closed, "the idle session's close", 15_000);
  assert.ok(Date.now() - t0 >= 900, "closed before its idle timeout");
  r = await raw(srv.url, { sid: sid1, key: keyA, body: LIST });
  assert.equal(r.status, 404);
  assert.equal((await c2.client.listTools()).tools.length, 15);
  const c3 = await connect(srv.url, keyA); // the slot c1 held
  assert.equal((await c3.client.listTools()).tools.length, 15);
  await c3.client.close();
  await c2.client.close();
});

test("--http-env-key lends ENGRAM_API_KEY to requests without a key, on loopback only", async () => {
  const srv = await startServer(["--http-env-key"], { ENGRAM_API_KEY: keyA });
  const anon = await connect(srv.url, undefined);
  const b = await connect(srv.url, keyB);
  try {
    await call(anon, "remember", { content: "Wombat stored with the server's key" });
    await call(b, "remember", { content: "Wombat stored with B's key" });
    assert.deepEqual(await memoriesOf(keyA, "Wombat"), ["Wombat stored with the server's key"]);
    assert.deepEqual(await memoriesOf(keyB, "Wombat"), ["Wombat stored with B's key"]);
    // the keyless session is bound to the server's key: another key cannot take it over
    const r = await raw(srv.url, { sid: anon.sid, key: keyB, body: LIST });
    assert.equal(r.status, 403);
  } finally {
    await anon.client.close();
    await b.client.close();
  }

  let bad = await startFails(["--http", "0", "--http-env-key", "--host", "0.0.0.0"], { ENGRAM_API_KEY: keyA });
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /non-loopback/);
  bad = await startFails(["--http", "0", "--http-env-key"], {});
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /needs ENGRAM_API_KEY/);
  bad = await startFails(["--max-sessions", "3"], {});
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /needs --http/);
});

test("binding a non-loopback host logs a warning", async () => {
  const srv = await startServer(["--host", "0.0.0.0"]);
  assert.match(srv.stderr(), /warning: listening on 0\.0\.0\.0, not loopback/);
  const r = await raw(`http://127.0.0.1:${srv.port}/mcp`, { body: INIT });
  assert.equal(r.status, 401);
  await srv.stop();
});
