// What an integrator meets first over MessagePack-RPC: the parameter a validation error is
// about, a refused or unanswered connection rejecting within about a second, and the
// environment every Engram tool reads (ENGRAM_URL, ENGRAM_API_KEY, ENGRAM_API_KEY_FILE).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import {
  Client, ConnectionLostError, HttpClient, InvalidArgumentError, UnauthenticatedError, errorFromWire,
} from "@engram/client";
import { HOST, PORT, blackhole, closedPort, httpUrl, newTenant, tlsServer, vec } from "./helpers.mjs";

const PKG = resolve(dirname(fileURLToPath(import.meta.url)), "..");

test("InvalidArgumentError names the parameter", async () => {
  const c = new Client({ host: HOST, port: PORT, apiKey: await newTenant() });
  try {
    const field = async (p) => {
      try {
        await p;
      } catch (e) {
        assert.ok(e instanceof InvalidArgumentError, String(e));
        return e.field;
      }
      assert.fail("no error");
    };
    assert.equal(await field(c.memory.search({ query: "x", top_k: 0 })), "top_k");
    assert.equal(await field(c.call("memory.search", { query: "x", colour: "red" })), "colour");
    assert.equal(await field(c.call("memory.store", { content: "x", type: "fact" })), "importance");
    assert.equal(await field(c.memory.storeBatch({ memories: [
      { content: "ok", type: "fact", importance: 0.5, embedding: vec(0) },
      { content: "bad", type: "fact", importance: 7, embedding: vec(1) }] })), "memories[1].importance");
    assert.equal(await field(c.memory.store({ content: "x", type: "fact", importance: 0.5, metadata: { colour: 1 } })),
      "metadata.colour");
  } finally {
    c.close();
  }
  // the server's own field, when it sends one, wins over the message
  assert.equal(errorFromWire({ code: "invalid_argument", message: "parameter 'a' is bad", field: "b" }).field, "b");
  assert.equal(errorFromWire({ code: "invalid_argument", message: "no name" }).field, undefined);
  // a server that sends no field: the name its message quotes
  for (const [message, field] of [
    ["parameter 'top_k' must be between 1 and 1000", "top_k"],
    ["unknown parameter 'colour'", "colour"],
    ["missing required parameter 'content'", "content"],
    ["memories[3]: parameter 'importance' must be between 0 and 1", "memories[3].importance"],
    ["unknown field 'metadata.colour' (metadata holds tokens, ...)", "metadata.colour"],
    ["'memories[2]' must be a map", "memories[2]"],
    ["parameters 'type' and 'memory_type' name the same parameter and differ", "type"],
  ]) {
    const e = errorFromWire({ code: "invalid_argument", message });
    assert.ok(e instanceof InvalidArgumentError);
    assert.deepEqual(e.data, {});
    assert.equal(e.field, field, message);
  }
});

test("a refused connection rejects within a second (0.1: about 19 s)", async () => {
  const port = await closedPort();
  const t = Date.now();
  await assert.rejects(new Client({ host: "127.0.0.1", port, apiKey: "egk_x" }).memory.stats(),
    (e) => e instanceof ConnectionLostError && /cannot connect .*ECONNREFUSED/.test(e.message));
  const took = (Date.now() - t) / 1000;
  console.log(`TCP client, refused port: rejected after ${took.toFixed(2)} s`);
  assert.ok(took < 3, `took ${took} s`);
});

test("an unanswered connect gives up after connectTimeoutMs (1 s)", async () => {
  const hole = await blackhole();
  try {
    const t = Date.now();
    await assert.rejects(new Client({ host: "127.0.0.1", port: hole.port, timeoutMs: 30_000 }).ping(),
      (e) => e instanceof ConnectionLostError && /no answer within 1 s/.test(e.message));
    const took = (Date.now() - t) / 1000;
    console.log(`TCP client, unanswered connect: rejected after ${took.toFixed(2)} s`);
    assert.ok(took < 3, `took ${took} s`);
  } finally {
    hole.close();
  }
});

/** Runs `code` (an ES module) in a child Node with exactly `env` (plus PATH). */
function runWithEnv(code, env) {
  const file = join(PKG, "test", `.env-${process.pid}-${Date.now()}.mjs`);
  writeFileSync(file, code);
  try {
    return execFileSync(process.execPath, [file], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env }, encoding: "utf8", timeout: 30_000,
    }).trim();
  } finally {
    rmSync(file, { force: true });
  }
}

const USAGE = `
import { Client } from "@engram/client";
const c = new Client();
try { console.log(String(c), (await c.tenant.usage()).tier); } catch (e) { console.log(String(c), e.name); } finally { c.close(); }
`;

test("new Client() reads ENGRAM_URL, ENGRAM_API_KEY and ENGRAM_API_KEY_FILE", async () => {
  const key = await newTenant({ tier: "standard", dim: 0 });
  const dir = mkdtempSync(join(tmpdir(), "engram-env-"));
  try {
    const kf = join(dir, "tenant.key");
    writeFileSync(kf, key + "\n", { mode: 0o600 });
    const url = `engram://${HOST}:${PORT}`;
    assert.equal(runWithEnv(USAGE, { ENGRAM_URL: url, ENGRAM_API_KEY_FILE: kf }), `Client(${HOST}:${PORT}) standard`);
    assert.equal(runWithEnv(USAGE, { ENGRAM_URL: url, ENGRAM_API_KEY: key }), `Client(${HOST}:${PORT}) standard`);
    // ENGRAM_API_KEY wins over the file
    assert.match(runWithEnv(USAGE, { ENGRAM_URL: url, ENGRAM_API_KEY: "egk_nope", ENGRAM_API_KEY_FILE: kf }),
      /UnauthenticatedError$/);
    // an http:// URL picks the fetch transport
    assert.equal(runWithEnv(USAGE, { ENGRAM_URL: httpUrl(), ENGRAM_API_KEY_FILE: kf }), `Client(${httpUrl()}) standard`);
    // and HttpClient reads the same variables
    const http = `import { HttpClient } from "@engram/client/http";
      console.log((await new HttpClient().tenant.usage()).tier);`;
    assert.equal(runWithEnv(http, { ENGRAM_URL: httpUrl(), ENGRAM_API_KEY: key }), "standard");
    // the key never reaches the output
    assert.doesNotMatch(runWithEnv(USAGE, { ENGRAM_URL: url, ENGRAM_API_KEY: key }), /egk_/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  // explicit options win; env: {} reads nothing
  const c = new Client({ host: HOST, port: PORT, env: { ENGRAM_URL: "engram://127.0.0.1:1", ENGRAM_API_KEY: key } });
  assert.equal((await c.tenant.usage()).tier, "standard");
  c.close();
  const anonymous = new Client({ host: HOST, port: PORT, env: {} });
  await assert.rejects(anonymous.tenant.usage(), UnauthenticatedError);
  anonymous.close();
});

test("engrams:// URLs and the ENGRAM_TLS_* variables", async () => {
  const t = tlsServer();
  const admin = new Client({ host: t.host, port: t.port, apiKey: t.adminKey, ca: t.ca, cert: t.clientCert, key: t.clientKey });
  const { api_key: key } = await admin.admin.tenant.create({ name: `ts-env-${process.pid}-${Date.now()}`, tier: "standard" });
  admin.close();
  const ca = join(t.dir, "ca.pem");
  assert.equal(runWithEnv(USAGE, { ENGRAM_URL: `engrams://127.0.0.1:${t.port}`, ENGRAM_API_KEY: key, ENGRAM_TLS_CA: ca }),
    `Client(127.0.0.1:${t.port}, tls) standard`);
  // engram:// with a CA file is TLS too, as for the CLI
  assert.equal(runWithEnv(USAGE, { ENGRAM_URL: `engram://127.0.0.1:${t.port}`, ENGRAM_API_KEY: key, ENGRAM_TLS_CA: ca }),
    `Client(127.0.0.1:${t.port}, tls) standard`);
});

test("bad URLs are refused, naming where they came from and never echoing credentials", () => {
  assert.throws(() => new Client({ url: "engram://user:hunter2@127.0.0.1:7420" }),
    (e) => e instanceof TypeError && !/hunter2/.test(e.message) && /credentials/.test(e.message));
  assert.throws(() => new Client({ env: { ENGRAM_URL: "ftp://x" } }), /ENGRAM_URL: unknown scheme 'ftp'/);
  assert.throws(() => new Client({ url: "engram://h:1", host: "h" }), /not both/);
  assert.throws(() => new Client({ url: "http://127.0.0.1:7421", ca: "pem" }), /TLS options do not apply/);
  assert.throws(() => new HttpClient({ url: "engram://127.0.0.1:7420" }), /needs an http\(s\):\/\/ URL/);
  assert.throws(() => new Client({ env: { ENGRAM_URL: "engram://127.0.0.1:7420", ENGRAM_API_KEY_FILE: "/nonexistent/key" } }),
    /ENGRAM_API_KEY_FILE: cannot read \/nonexistent\/key/);
});
