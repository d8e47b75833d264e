// End to end: an MCP client from the official SDK spawns engram-mcp over stdio (and over
// Streamable HTTP), lists the tools, and remembers and recalls through a live engramd.
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

const MAIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "main.js");
const PORT = process.env.ENGRAM_TEST_PORT;
const KEY_FILE = process.env.ENGRAM_TEST_ADMIN_KEY_FILE;
if (!PORT || !KEY_FILE) throw new Error("ENGRAM_TEST_PORT and ENGRAM_TEST_ADMIN_KEY_FILE must name a running engramd: run clients/run-tests");
const HOST = process.env.ENGRAM_TEST_HOST ?? "127.0.0.1";

const TOOL_NAMES = ["checkpoint", "forget", "handoff", "memory_context", "memory_get", "memory_list", "note_add",
  "notes", "recall", "remember", "resume", "scratchpad_read", "scratchpad_update", "session_append", "update_memory"];

let tmp;
let keyFile;
let tenantKey;

before(async () => {
  const admin = new Engram({ host: HOST, port: Number(PORT), apiKey: readFileSync(KEY_FILE, "utf8").trim() });
  tenantKey = (await admin.admin.tenant.create({ name: "mcp-" + randomBytes(6).toString("hex"), tier: "premium" })).api_key;
  admin.close();
  tmp = mkdtempSync(join(tmpdir(), "engram-mcp-test-"));
  keyFile = join(tmp, "key");
  writeFileSync(keyFile, tenantKey + "\n", { mode: 0o600 });
});
after(() => rmSync(tmp, { recursive: true, force: true }));

function baseEnv(extra) {
  return { PATH: process.env.PATH ?? "/usr/bin:/bin", ENGRAM_HOST: HOST, ENGRAM_PORT: PORT, ...extra };
}

async function stdioClient(env) {
  const transport = new StdioClientTransport({ command: process.execPath, args: [MAIN], env: baseEnv(env), stderr: "pipe" });
  const client = new McpClient({ name: "engram-mcp-test", version: "0.0.0" });
  await client.connect(transport);
  return client;
}

const text = (r) => r.content.map((c) => c.text).join("\n");

async function call(client, name, args) {
  return client.callTool({ name, arguments: args });
}

test("stdio: tools are listed with schemas and descriptions", async () => {
  const c = await stdioClient({ ENGRAM_API_KEY_FILE: keyFile, ENGRAM_AGENT_ID: "7" });
  try {
    const { tools } = await c.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), TOOL_NAMES);
    for (const t of tools) {
      assert.equal(t.inputSchema.type, "object", t.name);
      assert.ok(t.description.length > 40, t.name);
    }
    const remember = tools.find((t) => t.name === "remember");
    assert.deepEqual(remember.inputSchema.required, ["content"]);
    assert.deepEqual(remember.inputSchema.properties.type.enum,
      ["fact", "preference", "episode", "strategy_outcome", "constraint"]);
  } finally {
    await c.close();
  }
});

test("stdio: remember, recall, memory_context, update_memory, forget", async () => {
  const c = await stdioClient({ ENGRAM_API_KEY_FILE: keyFile, ENGRAM_AGENT_ID: "7" });
  try {
    let r = await call(c, "remember", { content: "The user's favourite editor is Helix", type: "preference", importance: 0.8, tags: ["editor"] });
    assert.equal(r.isError, undefined, text(r));
    const id = Number(/Stored memory (\d+)/.exec(text(r))[1]);
    await call(c, "remember", { content: "Deployments happen on Tuesdays", tags: ["ops"] });

    r = await call(c, "recall", { query: "Helix editor", mode: "text" });
    assert.match(text(r), new RegExp(`\\[id ${id}\\] \\(preference, importance 0\\.80`));
    r = await call(c, "recall", { query: "which editor does the user like", tags: ["editor"] });
    assert.match(text(r), /Helix/);
    assert.doesNotMatch(text(r), /Tuesdays/);

    r = await call(c, "memory_context", { query: "editor preferences", budget_tokens: 500 });
    assert.match(text(r), /^<agent_memory>/);
    assert.match(text(r), /Helix/);

    r = await call(c, "update_memory", { id, content: "The user's favourite editor is Zed" });
    assert.match(text(r), /version 2/);
    r = await call(c, "recall", { query: "Zed", mode: "text" });
    assert.match(text(r), /Zed/);

    r = await call(c, "forget", { ids: [id, 999999999] });
    assert.match(text(r), /Deleted 1 memory .*not found: 999999999/);
    r = await call(c, "recall", { query: "Zed", mode: "text" });
    assert.equal(text(r), "No matching memories.");
  } finally {
    await c.close();
  }
});

test("stdio: session working memory tools", async () => {
  const c = await stdioClient({ ENGRAM_API_KEY: tenantKey, ENGRAM_AGENT_ID: "7" });
  try {
    let r = await call(c, "scratchpad_update", { content: "# Plan\n- [x] read the code\n- [ ] write tests" });
    assert.match(text(r), /version 1/);
    const sid = Number(/session (\d+)/.exec(text(r))[1]);
    r = await call(c, "scratchpad_read", {});
    assert.match(text(r), /write tests/);
    r = await call(c, "note_add", { category: "decision", key: "db", value: "PostgreSQL", scope: "carry_forward" });
    assert.match(text(r), /Added note/);
    await call(c, "note_add", { category: "blocker", key: "ci", value: "CI is red" });
    r = await call(c, "notes", { categories: ["blocker"] });
    assert.equal(text(r), "[blocker/session] ci: CI is red");
    r = await call(c, "checkpoint", { label: "before refactor" });
    const cp = Number(/Checkpoint (\d+)/.exec(text(r))[1]);
    await call(c, "scratchpad_update", { content: "changed after the checkpoint" });
    r = await call(c, "resume", { checkpoint_id: cp });
    assert.match(text(r), /now current/);
    assert.match(text(r), /write tests/);
    assert.match(text(r), /\[decision\/carry_forward\] db: PostgreSQL/);
    r = await call(c, "scratchpad_read", {}); // the resumed session is current
    assert.doesNotMatch(text(r), new RegExp(`session ${sid},`));
    assert.match(text(r), /write tests/);
    r = await call(c, "handoff", { mode: "continue", session_id: sid, format: "json" });
    const h = JSON.parse(text(r));
    assert.equal(h.scratchpad.content, "changed after the checkpoint");
    assert.deepEqual(h.blockers.map((n) => n.key), ["ci"]);
  } finally {
    await c.close();
  }
});

test("stdio: concurrent first calls share one new session", async () => {
  const c = await stdioClient({ ENGRAM_API_KEY: tenantKey, ENGRAM_AGENT_ID: "7" });
  try {
    const rs = await Promise.all([1, 2, 3, 4].map(() => call(c, "scratchpad_read", {})));
    const ids = rs.map((r) => /Scratchpad of session (\d+),/.exec(text(r))[1]);
    assert.equal(new Set(ids).size, 1, `sessions ${ids}`);
  } finally {
    await c.close();
  }
});

test("stdio: failures are tool errors, never crashes", async () => {
  const c = await stdioClient({ ENGRAM_API_KEY_FILE: keyFile });
  try {
    let r = await call(c, "recall", {});
    assert.equal(r.isError, true);
    assert.match(text(r), /missing required argument 'query'/);
    r = await call(c, "remember", { content: "x", type: "gossip" });
    assert.equal(r.isError, true);
    assert.match(text(r), /must be one of/);
    r = await call(c, "update_memory", { id: 987654321, content: "nothing there" });
    assert.equal(r.isError, true);
    assert.match(text(r), /Engram error not_found/);
    r = await call(c, "scratchpad_read", { session_id: 987654321 });
    assert.equal(r.isError, true);
    assert.match(text(r), /not_found/);
    r = await call(c, "no_such_tool", {});
    assert.equal(r.isError, true);
    // still serving
    assert.equal((await c.listTools()).tools.length, TOOL_NAMES.length);
  } finally {
    await c.close();
  }

  const bad = await stdioClient({ ENGRAM_API_KEY: "egk_not_a_key" });
  try {
    const r = await call(bad, "recall", { query: "x" });
    assert.equal(r.isError, true);
    assert.match(text(r), /unauthenticated/);
    assert.doesNotMatch(text(r), /egk_not_a_key/);
  } finally {
    await bad.close();
  }

  const closedPort = await new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const down = await stdioClient({ ENGRAM_API_KEY: tenantKey, ENGRAM_PORT: String(closedPort), ENGRAM_TIMEOUT_MS: "1500" });
  try {
    const r = await call(down, "remember", { content: "x" });
    assert.equal(r.isError, true);
    assert.match(text(r), /unreachable|connect/);
    assert.equal((await down.listTools()).tools.length, TOOL_NAMES.length);
  } finally {
    await down.close();
  }
});

test("streamable HTTP: the same tools over --http, with the client's key", async () => {
  const child = spawn(process.execPath, [MAIN, "--http", "0"], {
    env: baseEnv({ ENGRAM_AGENT_ID: "8" }),
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
    const c = new McpClient({ name: "engram-mcp-test", version: "0.0.0" });
    await c.connect(new StreamableHTTPClientTransport(new URL(url),
      { requestInit: { headers: { Authorization: `Bearer ${tenantKey}` } } }));
    assert.deepEqual((await c.listTools()).tools.map((t) => t.name).sort(), TOOL_NAMES);
    let r = await call(c, "remember", { content: "HTTP transport works", tags: ["http"] });
    assert.match(text(r), /Stored memory/);
    r = await call(c, "recall", { query: "HTTP transport", mode: "text" });
    assert.match(text(r), /HTTP transport works/);
    await c.close();
  } finally {
    child.kill("SIGTERM");
  }
});
