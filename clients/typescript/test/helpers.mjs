// Test helpers: the live engramd that clients/run-tests started (and the one serving TLS
// beside it), tenants made through the admin API, and a TCP proxy that can cut connections
// or drop answers.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as net from "node:net";
import { randomBytes } from "node:crypto";
import { spawn } from "node:child_process";

import { Client } from "@engram/client";

const port = process.env.ENGRAM_TEST_PORT;
const keyFile = process.env.ENGRAM_TEST_ADMIN_KEY_FILE;
if (!port || !keyFile) {
  throw new Error("ENGRAM_TEST_PORT and ENGRAM_TEST_ADMIN_KEY_FILE must name a running engramd: run clients/run-tests");
}
export const HOST = process.env.ENGRAM_TEST_HOST ?? "127.0.0.1";
export const PORT = Number(port);
export const adminKey = readFileSync(keyFile, "utf8").trim();

/** The HTTP/JSON port of the same engramd (ENGRAM_TEST_HTTP_PORT). */
export function httpUrl() {
  const p = process.env.ENGRAM_TEST_HTTP_PORT;
  if (!p) throw new Error("ENGRAM_TEST_HTTP_PORT must name the engramd's HTTP port: run clients/run-tests");
  return `http://${HOST}:${p}`;
}

/** A loopback port nothing listens on. */
export async function closedPort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  return port;
}

const BLACKHOLE = `
import socket, sys, time
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(0)
fill = []
for _ in range(4):
    s = socket.socket(); s.setblocking(False)
    try: s.connect(ls.getsockname())
    except BlockingIOError: pass
    fill.append(s)
time.sleep(0.1)
print(ls.getsockname()[1], flush=True)
sys.stdin.read()
`;

/**
 * A loopback port whose listener never accepts and whose queue is full, so that a connect
 * gets no answer at all (Node accepts whatever it listens for, so a Python child holds it).
 * close() releases it.
 */
export async function blackhole() {
  const py = process.env.ENGRAM_PYTHON ?? "/usr/bin/python3";
  const child = spawn(py, ["-c", BLACKHOLE], { stdio: ["pipe", "pipe", "inherit"] });
  const port = await new Promise((resolve, reject) => {
    child.once("error", reject);
    child.stdout.once("data", (d) => resolve(Number(String(d).trim())));
  });
  return { port, close: () => child.kill() };
}

/**
 * The engramd serving TLS 1.3 on the same database: its port, the admin key and the PKI's
 * PEM contents (the CA of its certificate, an unrelated CA, the operators' client
 * certificate it requires for the admin key, a client certificate of the unrelated CA).
 */
export function tlsServer() {
  const tlsPort = process.env.ENGRAM_TEST_TLS_PORT;
  const dir = process.env.ENGRAM_TEST_TLS_DIR;
  if (!tlsPort || !dir) {
    throw new Error("ENGRAM_TEST_TLS_PORT and ENGRAM_TEST_TLS_DIR must name a running engramd serving TLS: run clients/run-tests");
  }
  const pem = (name) => readFileSync(join(dir, name), "utf8");
  return {
    host: "127.0.0.1", port: Number(tlsPort), adminKey, dir,
    ca: pem("ca.pem"), otherCa: pem("other_ca.pem"),
    clientCert: pem("client.pem"), clientKey: pem("client.key"),
    rogueCert: pem("rogue_client.pem"), rogueKey: pem("rogue_client.key"),
  };
}

export function adminClient() {
  return new Client({ host: HOST, port: PORT, apiKey: adminKey });
}

/** Creates a tenant; returns its API key (never printed). */
export async function newTenant({ tier = "premium", dim = 8 } = {}) {
  const a = adminClient();
  try {
    const r = await a.admin.tenant.create({
      name: "ts-" + randomBytes(6).toString("hex"),
      tier,
      embedding: dim ? { provider: "builtin", dim } : undefined,
    });
    return r.api_key;
  } finally {
    a.close();
  }
}

export function vec(i, dim = 8) {
  const v = new Float32Array(dim).fill(0.25);
  v[0] = i + 1;
  return v;
}

/** A loopback TCP proxy in front of engramd (the plain one unless told another port). */
export class Proxy {
  constructor(targetPort = PORT) {
    this.pairs = new Set();
    this.dropNextReply = false;
    this.blackhole = false;
    this.refuse = 0;
    this.accepted = 0;
    this.server = net.createServer((c) => {
      this.accepted++;
      if (this.refuse > 0) {
        this.refuse--;
        c.destroy();
        return;
      }
      const s = net.connect({ host: HOST, port: targetPort });
      const pair = { c, s };
      this.pairs.add(pair);
      const close = () => {
        c.destroy();
        s.destroy();
        this.pairs.delete(pair);
      };
      c.on("data", (d) => s.write(d));
      s.on("data", (d) => {
        if (this.dropNextReply) {
          this.dropNextReply = false;
          close();
          return;
        }
        if (!this.blackhole) c.write(d);
      });
      for (const x of [c, s]) {
        x.on("error", close);
        x.on("close", close);
      }
    });
  }
  async listen() {
    await new Promise((r) => this.server.listen(0, "127.0.0.1", r));
    this.port = this.server.address().port;
    return this;
  }
  cut() {
    for (const { c, s } of this.pairs) {
      c.destroy();
      s.destroy();
    }
    this.pairs.clear();
  }
  async close() {
    this.cut();
    await new Promise((r) => this.server.close(r));
  }
}
