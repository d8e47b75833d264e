// The README's MCP host configuration works as written, with the test's paths: the
// repository for /path/to/engram, the test server's port in ENGRAM_URL and a key file of its own.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { Client as Engram } from "@engram/client";

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(HERE, "..", "..", "..");

test("the host configuration snippet starts a working server", async () => {
  const readme = readFileSync(join(HERE, "..", "README.md"), "utf8");
  const cfg = JSON.parse(/```json\n([\s\S]*?)```/.exec(readme)[1]).mcpServers.engram;
  assert.equal(cfg.command, "node");
  const admin = new Engram({ port: Number(process.env.ENGRAM_TEST_PORT),
    apiKey: readFileSync(process.env.ENGRAM_TEST_ADMIN_KEY_FILE, "utf8").trim() });
  const { api_key } = await admin.admin.tenant.create({ name: "mcp-readme-" + randomBytes(6).toString("hex"), tier: "premium" });
  admin.close();
  const tmp = mkdtempSync(join(tmpdir(), "engram-mcp-readme-"));
  writeFileSync(join(tmp, "demo.key"), api_key + "\n", { mode: 0o600 });
  const env = Object.fromEntries(Object.entries(cfg.env).map(([k, v]) => [k, v.replace("/path/to/engram", REPO)]));
  assert.equal(env.ENGRAM_URL, "engram://127.0.0.1:7420");
  env.ENGRAM_URL = `engram://127.0.0.1:${process.env.ENGRAM_TEST_PORT}`;
  env.ENGRAM_API_KEY_FILE = join(tmp, "demo.key");
  const transport = new StdioClientTransport({
    command: process.execPath, // "node", as the snippet says, without relying on PATH
    args: cfg.args.map((a) => a.replace("/path/to/engram", REPO)),
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env },
    stderr: "pipe",
  });
  const c = new McpClient({ name: "readme-test", version: "0.0.0" });
  try {
    await c.connect(transport);
    assert.ok((await c.listTools()).tools.some((t) => t.name === "remember"));
    const r = await c.callTool({ name: "remember", arguments: { content: "configured from the README" } });
    assert.match(r.content[0].text, /Stored memory \d+/);
  } finally {
    await c.close();
    rmSync(tmp, { recursive: true, force: true });
  }
});
