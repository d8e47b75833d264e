// The package as integrators load it: require() and import, the types of both under a
// strict compiler, and a browser entry whose module graph holds no Node built-in.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import * as esm from "@engram/client";
import { PORT, newTenant } from "./helpers.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const PKG = resolve(HERE, "..");
const TSC = resolve(PKG, "..", "node_modules", ".bin", "tsc");

test("require() loads the CommonJS build, which talks to engramd", async () => {
  const key = await newTenant({ dim: 0 });
  const script = `
    const { Client, HttpClient, InvalidArgumentError, EngramError } = require("@engram/client");
    const http = require("@engram/client/http");
    if (typeof HttpClient !== "function" || http.Client !== http.HttpClient) throw new Error("exports");
    const c = new Client({ port: ${PORT}, apiKey: process.env.K });
    c.memory.search({ query: "x", top_k: 0 }).then(
      () => { throw new Error("no error"); },
      (e) => {
        process.stdout.write(JSON.stringify({ cls: e instanceof InvalidArgumentError && e instanceof EngramError, field: e.field,
          main: require.resolve("@engram/client") }));
        c.close();
      });`;
  const out = JSON.parse(execFileSync(process.execPath, ["-e", script], {
    cwd: PKG, env: { ...process.env, K: key }, encoding: "utf8", timeout: 30_000,
  }));
  assert.deepEqual({ cls: out.cls, field: out.field }, { cls: true, field: "top_k" });
  assert.match(out.main, /dist[/\\]cjs[/\\]index\.js$/);
  // and import gives the ESM build
  const require = createRequire(import.meta.url);
  assert.match(require.resolve("@engram/client"), /cjs/);
  assert.equal(typeof esm.Client, "function");
  assert.equal(typeof esm.HttpClient, "function");
});

test("types: CommonJS and ESM consumers under strict, ids as number, bigint when asked", () => {
  const dir = mkdtempSync(join(PKG, "test", ".types-"));
  try {
    const body = `
const c = new Client({ port: 7420 });
const b = new Client({ bigint: true });
const h = new HttpClient({ url: "http://127.0.0.1:7421" });
export async function f(): Promise<void> {
  const n: number = (await c.memory.store({ content: "x", type: "fact", importance: 0.5 })).id;
  const big: bigint = (await b.memory.store({ content: "x", type: "fact", importance: 0.5 })).id;
  const hits: number[] = (await h.memory.search({ query: "x" })).results.map((m) => m.id);
  // @ts-expect-error: ids are numbers unless asked for bigint
  const wrong: bigint = (await c.memory.get({ ids: [n, big] })).memories[0]!.id;
  void hits; void wrong;
  try { await c.ping(); } catch (e) { if (e instanceof InvalidArgumentError) { const f: string | undefined = e.field; void f; } }
}`;
    writeFileSync(join(dir, "cjs.cts"), `import { Client, HttpClient, InvalidArgumentError } from "@engram/client";\n${body}`);
    writeFileSync(join(dir, "esm.mts"), `import { Client, HttpClient, InvalidArgumentError } from "@engram/client";\n${body}`);
    // the fetch entry needs no Node types: DOM's fetch is enough
    const web = body.replace('{ port: 7420 }', '{ url: "/engram" }').replace("{ bigint: true }", '{ url: "https://e.example", bigint: true }');
    writeFileSync(join(dir, "web.mts"), `import { Client, HttpClient, InvalidArgumentError } from "@engram/client/http";\n${web}`);
    const common = { strict: true, noEmit: true, module: "NodeNext", moduleResolution: "NodeNext", target: "ES2022", skipLibCheck: false };
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({ compilerOptions: { ...common, lib: ["ES2022"], types: ["node"] }, files: ["cjs.cts", "esm.mts"] }));
    writeFileSync(join(dir, "tsconfig.web.json"), JSON.stringify({ compilerOptions: { ...common, lib: ["ES2022", "DOM"], types: [] }, files: ["web.mts"] }));
    for (const cfg of ["tsconfig.json", "tsconfig.web.json"]) {
      try {
        execFileSync(TSC, ["-p", join(dir, cfg)], { cwd: dir, encoding: "utf8", timeout: 120_000 });
      } catch (e) {
        assert.fail(`${cfg}: ${e.stdout}${e.stderr}`);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Every module the ESM file at `file` imports, transitively: {file: [specifiers]}. */
function graph(file, seen = new Map()) {
  if (seen.has(file)) return seen;
  const text = readFileSync(file, "utf8");
  const specs = [...text.matchAll(/(?:^|\n)\s*(?:import|export)\s[^;]*?from\s*"([^"]+)"|(?:^|\n)\s*import\s*"([^"]+)"|import\(\s*"([^"]+)"\s*\)/g)]
    .map((m) => m[1] ?? m[2] ?? m[3]);
  seen.set(file, specs);
  for (const s of specs) if (s.startsWith(".")) graph(resolve(dirname(file), s), seen);
  return seen;
}

test("the browser entry and its imports use no Node built-in and no bare specifier", () => {
  const pkg = JSON.parse(readFileSync(join(PKG, "package.json"), "utf8"));
  const web = pkg.exports["."].browser.default;
  for (const cond of ["browser", "workerd", "edge-light"]) assert.equal(pkg.exports["."][cond].default, web);
  assert.equal(pkg.exports["./http"].import.default, web);
  const g = graph(join(PKG, web));
  assert.ok(g.size >= 4, [...g.keys()].join());
  for (const [file, specs] of g) {
    for (const s of specs) assert.ok(s.startsWith("./"), `${file} imports ${s}`);
    const text = readFileSync(file, "utf8");
    assert.doesNotMatch(text, /\brequire\(|process\.binding|node:/, file);
  }
  // while the Node entry does use them (the check above would see it)
  const node = graph(join(PKG, pkg.exports["."].import.default));
  assert.ok([...node.values()].flat().includes("node:net"));
});
