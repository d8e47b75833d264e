// Helpers of the MCP tests (not a test file): tenants on the test engramd, engram-mcp over
// stdio and over --http with SDK clients, and a TCP relay in front of engramd that can
// freeze (accept and answer nothing, like a hung or partitioned engramd) or refuse.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";
import * as net from "node:net";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Client as Engram } from "@engram/client";

export const MAIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "main.js");
export const PORT = process.env.ENGRAM_TEST_PORT;
const ADMIN_KEY_FILE = process.env.ENGRAM_TEST_ADMIN_KEY_FILE;
if (!PORT || !ADMIN_KEY_FILE || !process.env.ENGRAM_TEST_HTTP_PORT) throw new Error("ENGRAM_TEST_PORT, ENGRAM_TEST_HTTP_PORT and ENGRAM_TEST_ADMIN_KEY_FILE must name a running engramd: run clients/run-tests");
export const HOST = process.env.ENGRAM_TEST_HOST ?? "127.0.0.1";

/** A new premium tenant's key. */
export async function newTenant(prefix) {
  const admin = new Engram({ host: HOST, port: Number(PORT), apiKey: readFileSync(ADMIN_KEY_FILE, "utf8").trim() });
  try {
    return (await admin.admin.tenant.create({ name: `${prefix}-` + randomBytes(6).toString("hex"), tier: "premium" })).api_key;
  } finally {
    admin.close();
  }
}

const baseEnv = (env) => ({ PATH: process.env.PATH ?? "/usr/bin:/bin", ENGRAM_HOST: HOST, ENGRAM_PORT: PORT, ...env });

/** An SDK client of engram-mcp over stdio, run with env (over the test engramd's address). */
export async function stdioClient(env) {
  const transport = new StdioClientTransport({ command: process.execPath, args: [MAIN], env: baseEnv(env), stderr: "pipe" });
  let log = "";
  transport.stderr?.on("data", (d) => (log += d));
  const client = new McpClient({ name: "engram-mcp-test", version: "0.0.0" });
  await client.connect(transport);
  client.log = () => log;
  return client;
}

/** engram-mcp --http 0 run with env: resolves to {url, stderr(), stop()}. */
export async function httpServer(env = {}, args = []) {
  const child = spawn(process.execPath, [MAIN, "--http", "0", ...args], { env: baseEnv(env), stdio: ["ignore", "ignore", "pipe"] });
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
  return {
    url,
    stderr: () => buf,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}

/** An SDK client of an engram-mcp --http at url, sending key. */
export async function httpClient(url, key) {
  const client = new McpClient({ name: "engram-mcp-test", version: "0.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url),
    { requestInit: { headers: { Authorization: `Bearer ${key}` } } }));
  return client;
}

export const text = (r) => r.content.map((c) => c.text).join("\n");

/** callTool that must succeed; returns its text. */
export async function ok(c, name, args = {}) {
  const r = await c.callTool({ name, arguments: args });
  assert.equal(r.isError, undefined, `${name}: ${text(r)}`);
  return text(r);
}

/** callTool that must fail as a tool error; returns its text. */
export async function fails(c, name, args = {}) {
  const r = await c.callTool({ name, arguments: args });
  assert.equal(r.isError, true, `${name} should have failed: ${text(r)}`);
  return text(r);
}

/** The JSON-RPC error a request ends with (code and message), or fails the test. */
export async function rpcError(p) {
  try {
    await p;
  } catch (e) {
    return { code: e.code, message: String(e.message), data: e.data };
  }
  assert.fail("the request succeeded");
}

/**
 * A TCP relay on 127.0.0.1 to engramd. mode "pass" relays; "freeze" keeps every connection
 * (and accepts new ones) but moves no byte either way, as a hung engramd or a network
 * dropping packets; "refuse" closes the listener (new connections are refused) and drops
 * the open ones. setMode("pass") after "freeze" releases what was held.
 */
export async function relay(targetPort = Number(PORT)) {
  const conns = new Set();
  let mode = "pass";
  let server;
  const listen = (port) => new Promise((resolve) => {
    server = net.createServer((down) => {
      const up = net.connect(targetPort, HOST);
      const c = { down, up, held: [] };
      conns.add(c);
      const pipe = (from, to, dir) => from.on("data", (d) => {
        if (mode === "freeze") c.held.push([dir, d]);
        else to.write(d);
      });
      pipe(down, up, "up");
      pipe(up, down, "down");
      const end = () => {
        conns.delete(c);
        down.destroy();
        up.destroy();
      };
      down.on("close", end).on("error", end);
      up.on("close", end).on("error", end);
    });
    server.listen(port, "127.0.0.1", () => resolve(server.address().port));
  });
  const port = await listen(0);
  return {
    port,
    async setMode(m) {
      if (m === "refuse" && mode !== "refuse") {
        const closed = new Promise((r) => server.close(() => r()));
        for (const c of conns) {
          c.down.destroy();
          c.up.destroy();
        }
        await closed;
      } else if (mode === "refuse" && m !== "refuse") {
        await listen(port);
      }
      if (m === "pass") {
        for (const c of conns) {
          for (const [dir, d] of c.held) (dir === "up" ? c.up : c.down).write(d);
          c.held = [];
        }
      }
      mode = m;
    },
    close() {
      for (const c of conns) {
        c.down.destroy();
        c.up.destroy();
      }
      server.close();
    },
  };
}

/** Awaits p: {value, took} or {error, took}, took in ms from the call. */
export async function timed(p) {
  const t = Date.now();
  try {
    const value = await p;
    return { value, took: Date.now() - t };
  } catch (e) {
    return { error: e, took: Date.now() - t };
  }
}
