// TLS: engram-mcp reaches the engramd serving TLS 1.3 (a throwaway PKI made by
// clients/run-tests with the openssl command line) as configured by ENGRAM_TLS_CA,
// ENGRAM_TLS_CERT, ENGRAM_TLS_KEY and ENGRAM_TLS_SERVERNAME: tools work over TLS, another
// CA or another name is refused (a tool error naming it; the server keeps running), the
// admin key gets in only with the operators' client certificate, and bad settings stop the
// server at start with a message.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { Client as Engram } from "@engram/client";

import { configFromEnv } from "../dist/server.js";

const MAIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "main.js");
const PORT = process.env.ENGRAM_TEST_PORT;
const KEY_FILE = process.env.ENGRAM_TEST_ADMIN_KEY_FILE;
const TLS_PORT = process.env.ENGRAM_TEST_TLS_PORT;
const PKI = process.env.ENGRAM_TEST_TLS_DIR;
if (!PORT || !KEY_FILE || !TLS_PORT || !PKI) {
  throw new Error("ENGRAM_TEST_PORT, ENGRAM_TEST_ADMIN_KEY_FILE, ENGRAM_TEST_TLS_PORT and ENGRAM_TEST_TLS_DIR must name running engramds: run clients/run-tests");
}
const pki = (name) => join(PKI, name);

let tmp;
let tenantKey;

before(async () => {
  const admin = new Engram({ host: "127.0.0.1", port: Number(PORT), apiKey: readFileSync(KEY_FILE, "utf8").trim() });
  tenantKey = (await admin.admin.tenant.create({ name: "mcp-tls-" + randomBytes(6).toString("hex"), tier: "premium" })).api_key;
  admin.close();
  tmp = mkdtempSync(join(tmpdir(), "engram-mcp-tls-"));
});
after(() => rmSync(tmp, { recursive: true, force: true }));

function tlsEnv(extra) {
  return { PATH: process.env.PATH ?? "/usr/bin:/bin", ENGRAM_HOST: "127.0.0.1", ENGRAM_PORT: TLS_PORT, ...extra };
}

async function stdioClient(env) {
  const transport = new StdioClientTransport({ command: process.execPath, args: [MAIN], env: tlsEnv(env), stderr: "pipe" });
  const client = new McpClient({ name: "engram-mcp-tls-test", version: "0.0.0" });
  await client.connect(transport);
  return client;
}

const text = (r) => r.content.map((c) => c.text).join("\n");
const call = (client, name, args) => client.callTool({ name, arguments: args });

test("tools work over TLS with ENGRAM_TLS_CA", async () => {
  const c = await stdioClient({ ENGRAM_API_KEY: tenantKey, ENGRAM_TLS_CA: pki("ca.pem") });
  try {
    let r = await call(c, "remember", { content: "Remembered over TLS", type: "fact", importance: 0.6 });
    assert.equal(r.isError, undefined, text(r));
    assert.match(text(r), /Stored memory \d+/);
    r = await call(c, "recall", { query: "Remembered over TLS", mode: "text" });
    assert.match(text(r), /Remembered over TLS/);
  } finally {
    await c.close();
  }
  // the same memory through the plain port: one database
  const plain = new Engram({ host: "127.0.0.1", port: Number(PORT), apiKey: tenantKey });
  assert.equal((await plain.memory.stats()).total, 1);
  plain.close();
  // the certificate's DNS name, and a client certificate (a tenant key does not need one,
  // and may present one); its key in the same file as the certificate
  const both = join(tmp, "client-and-key.pem");
  writeFileSync(both, readFileSync(pki("client.pem"), "utf8") + readFileSync(pki("client.key"), "utf8"), { mode: 0o600 });
  const named = await stdioClient({ ENGRAM_API_KEY: tenantKey, ENGRAM_TLS_CA: pki("ca.pem"),
    ENGRAM_TLS_SERVERNAME: "localhost", ENGRAM_TLS_CERT: both });
  try {
    const r = await call(named, "recall", { query: "Remembered over TLS", mode: "text" });
    assert.match(text(r), /Remembered over TLS/);
  } finally {
    await named.close();
  }
});

test("another CA or another host name is refused; the server keeps running", async () => {
  for (const [env, why] of [
    [{ ENGRAM_TLS_CA: pki("other_ca.pem") }, /certificate did not verify/],
    [{ ENGRAM_TLS: "1" }, /certificate did not verify/], // Node's bundled CAs
    [{ ENGRAM_TLS_CA: pki("ca.pem"), ENGRAM_TLS_SERVERNAME: "engram.invalid" }, /engram\.invalid/],
  ]) {
    const c = await stdioClient({ ENGRAM_API_KEY: tenantKey, ...env });
    try {
      const r = await call(c, "remember", { content: "never stored" });
      assert.equal(r.isError, true);
      assert.match(text(r), why);
      assert.ok((await c.listTools()).tools.length > 0);
    } finally {
      await c.close();
    }
  }
});

test("the admin key needs the operators' client certificate", async () => {
  // The MCP tools are tenant tools: as the admin, a tool is refused for what the key may
  // do (permission_denied) once authenticated, and for the key itself without the
  // certificate (unauthenticated).
  const withCert = await stdioClient({ ENGRAM_API_KEY_FILE: KEY_FILE, ENGRAM_TLS_CA: pki("ca.pem"),
    ENGRAM_TLS_CERT: pki("client.pem"), ENGRAM_TLS_KEY: pki("client.key") });
  try {
    const r = await call(withCert, "recall", { query: "x" });
    assert.equal(r.isError, true);
    assert.match(text(r), /Engram error permission_denied/);
  } finally {
    await withCert.close();
  }
  const noCert = await stdioClient({ ENGRAM_API_KEY_FILE: KEY_FILE, ENGRAM_TLS_CA: pki("ca.pem") });
  try {
    const r = await call(noCert, "recall", { query: "x" });
    assert.equal(r.isError, true);
    assert.match(text(r), /Engram error unauthenticated: .*client certificate/);
  } finally {
    await noCert.close();
  }
  const rogue = await stdioClient({ ENGRAM_API_KEY_FILE: KEY_FILE, ENGRAM_TLS_CA: pki("ca.pem"),
    ENGRAM_TLS_CERT: pki("rogue_client.pem"), ENGRAM_TLS_KEY: pki("rogue_client.key") });
  try {
    const r = await call(rogue, "recall", { query: "x" });
    assert.equal(r.isError, true);
    assert.match(text(r), /did not accept the client certificate/);
  } finally {
    await rogue.close();
  }
});

test("TLS settings are read and checked at start", () => {
  assert.equal(configFromEnv({}).tls, undefined);
  assert.equal(configFromEnv({ ENGRAM_TLS: "0" }).tls, undefined);
  assert.deepEqual(configFromEnv({ ENGRAM_TLS: "1" }).tls, {});
  const cfg = configFromEnv({ ENGRAM_TLS_CA: pki("ca.pem"), ENGRAM_TLS_CERT: pki("client.pem"), ENGRAM_TLS_KEY: pki("client.key") });
  assert.equal(cfg.tls.ca, readFileSync(pki("ca.pem"), "utf8"));
  assert.equal(cfg.tls.key, readFileSync(pki("client.key"), "utf8"));
  assert.throws(() => configFromEnv({ ENGRAM_TLS_KEY: pki("client.key") }), /ENGRAM_TLS_KEY needs ENGRAM_TLS_CERT/);
  assert.throws(() => configFromEnv({ ENGRAM_TLS_SERVERNAME: "localhost" }), /ENGRAM_TLS_SERVERNAME/);
  // an unreadable file stops the server at once, naming the variable
  const r = spawnSync(process.execPath, [MAIN], {
    env: tlsEnv({ ENGRAM_API_KEY: tenantKey, ENGRAM_TLS_CA: pki("missing.pem") }), input: "", encoding: "utf8", timeout: 60_000,
  });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /ENGRAM_TLS_CA: cannot read .*missing\.pem/);
});
