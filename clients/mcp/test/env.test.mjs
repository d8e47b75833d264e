// The variables every Engram tool reads (ENGRAM_URL, ENGRAM_API_KEY, ENGRAM_API_KEY_FILE),
// ENGRAM_HOST/ENGRAM_PORT as the fallback they were, an http:// ENGRAM_URL through the
// HTTP/JSON port (over stdio and over --http), and an unreachable engramd failing fast.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";
import * as net from "node:net";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Client as Engram } from "@engram/client";

import { configFromEnv } from "../dist/server.js";

const MAIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "main.js");
const PORT = process.env.ENGRAM_TEST_PORT;
const HTTP_PORT = process.env.ENGRAM_TEST_HTTP_PORT;
const KEY_FILE = process.env.ENGRAM_TEST_ADMIN_KEY_FILE;
if (!PORT || !HTTP_PORT || !KEY_FILE) {
  throw new Error("ENGRAM_TEST_PORT, ENGRAM_TEST_HTTP_PORT and ENGRAM_TEST_ADMIN_KEY_FILE must name a running engramd: run clients/run-tests");
}
const HOST = process.env.ENGRAM_TEST_HOST ?? "127.0.0.1";

let tmp;
let keyFile;
let tenantKey;

before(async () => {
  const admin = new Engram({ host: HOST, port: Number(PORT), apiKey: readFileSync(KEY_FILE, "utf8").trim() });
  tenantKey = (await admin.admin.tenant.create({ name: "mcp-env-" + randomBytes(6).toString("hex"), tier: "premium" })).api_key;
  admin.close();
  tmp = mkdtempSync(join(tmpdir(), "engram-mcp-env-"));
  keyFile = join(tmp, "key");
  writeFileSync(keyFile, tenantKey + "\n", { mode: 0o600 });
});
after(() => rmSync(tmp, { recursive: true, force: true }));

async function closedPort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  const p = s.address().port;
  await new Promise((r) => s.close(r));
  return p;
}

/** An MCP client over stdio to engram-mcp run with exactly `env` (plus PATH). */
async function stdio(env) {
  const transport = new StdioClientTransport({
    command: process.execPath, args: [MAIN], env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env }, stderr: "pipe",
  });
  const client = new McpClient({ name: "engram-mcp-env-test", version: "0.0.0" });
  await client.connect(transport);
  return client;
}

const text = (r) => r.content.map((c) => c.text).join("\n");

async function rememberAndRecall(c, what) {
  const r = await c.callTool({ name: "remember", arguments: { content: `remembered via ${what}`, type: "fact" } });
  assert.equal(r.isError, undefined, text(r));
  const hits = await c.callTool({ name: "recall", arguments: { query: `remembered via ${what}`, mode: "text" } });
  assert.equal(hits.isError, undefined, text(hits));
  assert.match(text(hits), new RegExp(`remembered via ${what}`));
}

test("stdio: ENGRAM_URL and ENGRAM_API_KEY_FILE alone", async () => {
  const c = await stdio({ ENGRAM_URL: `engram://${HOST}:${PORT}`, ENGRAM_API_KEY_FILE: keyFile });
  try {
    await rememberAndRecall(c, "engram url");
  } finally {
    await c.close();
  }
});

test("stdio: an http:// ENGRAM_URL goes through engramd's HTTP/JSON port", async () => {
  const c = await stdio({ ENGRAM_URL: `http://${HOST}:${HTTP_PORT}`, ENGRAM_API_KEY: tenantKey });
  try {
    await rememberAndRecall(c, "http url");
    const r = await c.callTool({ name: "scratchpad_update", arguments: { content: "plan over http" } });
    assert.equal(r.isError, undefined, text(r));
    assert.match(text(await c.callTool({ name: "scratchpad_read", arguments: {} })), /plan over http/);
  } finally {
    await c.close();
  }
});

test("stdio: ENGRAM_URL wins over ENGRAM_HOST/ENGRAM_PORT, which still work alone", async () => {
  const dead = String(await closedPort());
  const c = await stdio({ ENGRAM_URL: `engram://${HOST}:${PORT}`, ENGRAM_HOST: HOST, ENGRAM_PORT: dead, ENGRAM_API_KEY: tenantKey });
  try {
    await rememberAndRecall(c, "url over port");
  } finally {
    await c.close();
  }
  const old = await stdio({ ENGRAM_HOST: HOST, ENGRAM_PORT: PORT, ENGRAM_API_KEY_FILE: keyFile });
  try {
    await rememberAndRecall(old, "host and port");
  } finally {
    await old.close();
  }
});

test("an unreachable engramd fails a tool call within a second or two (0.1: the whole 15 s deadline)", async () => {
  const c = await stdio({ ENGRAM_URL: `engram://127.0.0.1:${await closedPort()}`, ENGRAM_API_KEY: tenantKey });
  try {
    const t = Date.now();
    const r = await c.callTool({ name: "remember", arguments: { content: "x" } });
    const took = (Date.now() - t) / 1000;
    console.log(`engram-mcp, refused port: the tool call failed after ${took.toFixed(2)} s`);
    assert.equal(r.isError, true);
    assert.match(text(r), /cannot connect/);
    assert.ok(took < 3, `took ${took} s`);
  } finally {
    await c.close();
  }
});

test("--http with an http:// ENGRAM_URL: each client's key is checked over HTTP/JSON", async () => {
  const child = spawn(process.execPath, [MAIN, "--http", "0"], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ENGRAM_URL: `http://${HOST}:${HTTP_PORT}` },
    stdio: ["ignore", "ignore", "pipe"],
  });
  try {
    const url = await new Promise((resolve, reject) => {
      let buf = "";
      child.stderr.on("data", (d) => {
        buf += d;
        const m = /listening on (http:\S+)/.exec(buf);
        if (m) resolve(m[1]);
      });
      child.on("exit", (code) => reject(new Error(`engram-mcp exited ${code}: ${buf}`)));
    });
    const bad = await fetch(url, {
      method: "POST",
      headers: { Authorization: "Bearer egk_aaaaaaaaaaaa_" + "d".repeat(40), "Content-Type": "application/json",
        Accept: "application/json, text/event-stream" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize",
        params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "0" } } }),
    });
    assert.equal(bad.status, 401);
    const transport = new StreamableHTTPClientTransport(new URL(url),
      { requestInit: { headers: { Authorization: `Bearer ${tenantKey}` } } });
    const c = new McpClient({ name: "engram-mcp-env-http", version: "0.0.0" });
    await c.connect(transport);
    try {
      await rememberAndRecall(c, "mcp over http to http");
    } finally {
      await c.close();
    }
  } finally {
    child.kill("SIGTERM");
  }
});

test("configFromEnv: URLs, fallbacks and errors", () => {
  assert.deepEqual(
    (({ host, port, tls, httpUrl }) => ({ host, port, tls, httpUrl }))(configFromEnv({ ENGRAM_URL: "engrams://db.internal:9000" })),
    { host: "db.internal", port: 9000, tls: {}, httpUrl: undefined });
  assert.equal(configFromEnv({ ENGRAM_URL: "https://engram.example.com/api/" }).httpUrl, "https://engram.example.com/api");
  const legacy = configFromEnv({ ENGRAM_HOST: "10.0.0.1", ENGRAM_PORT: "7000" });
  assert.deepEqual([legacy.host, legacy.port, legacy.httpUrl], ["10.0.0.1", 7000, undefined]);
  assert.throws(() => configFromEnv({ ENGRAM_URL: "gopher://x" }), /ENGRAM_URL: unknown scheme/);
  assert.throws(() => configFromEnv({ ENGRAM_URL: "http://x:1", ENGRAM_TLS: "1" }), /ENGRAM_URL: the ENGRAM_TLS\* variables/);
  assert.throws(() => configFromEnv({ ENGRAM_API_KEY_FILE: join(tmp, "missing") }), /ENGRAM_API_KEY_FILE: cannot read/);
  writeFileSync(join(tmp, "two-lines"), "egk_first\nsecond\n");
  assert.equal(configFromEnv({ ENGRAM_API_KEY_FILE: join(tmp, "two-lines") }).apiKey, "egk_first");
});
