// The browser build in a real browser: headless Chromium (Debian's, driven by playwright-core)
// loads a page from a loopback test server, imports dist/esm/browser.js as native ES modules
// (a bare specifier or a node: import would fail to load), and stores and searches through
// the live engramd's HTTP port. engramd sends no CORS headers, so the test server also
// proxies /v1/ to it: the page calls its own origin, as it would behind a reverse proxy.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import * as http from "node:http";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

import { Client } from "@engram/client";
import { HOST, PORT, httpUrl, newTenant } from "./helpers.mjs";

const ESM = resolve(dirname(fileURLToPath(import.meta.url)), "..", "dist", "esm");
const CHROMIUM = process.env.ENGRAM_CHROMIUM ?? "/usr/bin/chromium";
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];

/** The page's server: /, /pkg/*.js from dist/esm, and /v1/ proxied to engramd. */
async function pageServer() {
  const upstream = new URL(httpUrl());
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const url = new URL(req.url, "http://page");
    if (req.method === "GET" && url.pathname === "/") {
      res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
      res.end("<!doctype html><meta charset=utf-8><title>engram in a browser</title><p>test page</p>");
    } else if (req.method === "GET" && /^\/pkg\/[a-z]+\.js$/.test(url.pathname)) {
      const file = join(ESM, url.pathname.slice("/pkg/".length));
      if (!existsSync(file)) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { "Content-Type": "text/javascript; charset=utf-8" });
      res.end(readFileSync(file));
    } else if (url.pathname.startsWith("/v1/")) {
      const headers = { ...req.headers, host: upstream.host };
      delete headers.origin; // what a same-origin reverse proxy forwards is the request
      const up = http.request({ host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      });
      up.on("error", () => res.writeHead(502).end());
      req.pipe(up);
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${server.address().port}`, seen, close: () => new Promise((r) => server.close(r)) };
}

test("headless Chromium: the browser build stores and searches through engramd's HTTP port", { timeout: 120_000 }, async () => {
  assert.ok(existsSync(CHROMIUM), `no Chromium at ${CHROMIUM} (Debian: apt-get install chromium; or set ENGRAM_CHROMIUM)`);
  const key = await newTenant();
  const site = await pageServer();
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS, timeout: 60_000 });
  try {
    const page = await browser.newPage();
    const problems = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()}`));
    await page.goto(site.url + "/");
    // the key goes to the page as an argument, never into its HTML or a URL
    const out = await page.evaluate(async (key) => {
      const m = await import("/pkg/browser.js");
      const c = new m.Client({ apiKey: key }); // the browser entry's Client is HttpClient; URL: this origin
      const v = [1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.5];
      const r = await c.memory.store({ content: "stored from a browser", type: "fact", importance: 0.6,
        embedding: new Float32Array(v) });
      const hits = (await c.memory.search({ embedding: v, top_k: 1 })).results;
      const listed = (await c.memory.list({ include_embedding: true })).memories[0];
      let err;
      try {
        await c.memory.search({ query: "x", top_k: 0 });
      } catch (e) {
        err = { invalid: e instanceof m.InvalidArgumentError, engram: e instanceof m.EngramError, field: e.field, code: e.code };
      }
      const big = new m.HttpClient({ apiKey: key, bigint: true });
      const agent = 2n ** 64n - 3n;
      const b = await big.memory.store({ content: "big agent", type: "fact", importance: 0.1, embedding: v, agent_id: agent });
      const bm = (await big.memory.get({ ids: [b.id] })).memories[0];
      return {
        id: r.id, idType: typeof r.id, sameClass: m.Client === m.HttpClient, hit: hits[0]?.id === r.id,
        hitContent: hits[0]?.content, embedding: listed.embedding instanceof Float32Array ? Array.from(listed.embedding) : null,
        err, bigExact: typeof b.id === "bigint" && bm.agent_id === agent, origin: location.origin,
        secure: isSecureContext,
      };
    }, key);
    assert.deepEqual(problems, []);
    assert.equal(out.idType, "number");
    assert.equal(out.sameClass, true);
    assert.equal(out.hit, true);
    assert.equal(out.hitContent, "stored from a browser");
    assert.deepEqual(out.embedding.map((x) => Math.round(x * 100) / 100), [1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.5]);
    assert.deepEqual(out.err, { invalid: true, engram: true, field: "top_k", code: "invalid_argument" });
    assert.equal(out.bigExact, true);
    assert.equal(out.origin, site.url);
    // what the browser asked for: the page, the modules of the browser build, the API
    for (const r of site.seen) {
      assert.match(r, /^(GET \/|GET \/pkg\/[a-z]+\.js|POST \/v1\/rpc\/[a-z_.]+|GET \/favicon\.ico)$/, r);
    }
    assert.ok(site.seen.includes("GET /pkg/http.js") && site.seen.includes("GET /pkg/wire.js"), site.seen.join());
    assert.ok(!site.seen.some((r) => /client\.js|index\.js/.test(r)), "the Node entry was loaded");
    // the memory is in engramd, as the Node client sees it over MessagePack-RPC
    const c = new Client({ host: HOST, port: PORT, apiKey: key });
    try {
      assert.equal((await c.memory.get({ ids: [out.id] })).memories[0].content, "stored from a browser");
    } finally {
      c.close();
    }
  } finally {
    await browser.close();
    await site.close();
  }
});
