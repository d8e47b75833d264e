// Every method returns a typed result (an interface generated from the server's result
// schema, src/results.ts, or written by hand, src/types.ts), never Record<string, unknown>:
// under a strict compiler, a field no result has is refused for each method's result.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { METHOD_PATHS } from "@engram/client";

const HERE = dirname(fileURLToPath(import.meta.url));
const PKG = resolve(HERE, "..");
const TSC = resolve(PKG, "..", "node_modules", ".bin", "tsc");

test("no method of the generated API returns an untyped record", () => {
  const api = readFileSync(join(PKG, "src", "api.ts"), "utf8");
  const returns = [...api.matchAll(/\): Promise<(.+)> \{$/gm)].map((m) => m[1]);
  assert.ok(returns.length >= 50, `${returns.length} methods found`);
  assert.deepEqual(returns.filter((r) => r === "unknown" || r.startsWith("Record<")), []);
});

test("each method's result refuses an unknown field under tsc --strict (both clients, both id types)", () => {
  const dir = mkdtempSync(join(PKG, "test", ".results-"));
  try {
    const lines = [
      'import { Client, HttpClient } from "@engram/client";',
      "type R<F> = F extends (...a: never[]) => Promise<infer T> ? T : never;",
      "declare const c: Client;",
      "declare const b: Client<bigint>;",
      "declare const h: HttpClient;",
      "export function use(): void {",
    ];
    const names = Object.keys(METHOD_PATHS).sort();
    for (const client of ["c", "b", "h"]) {
      for (const name of names) {
        const path = METHOD_PATHS[name].join(".");
        const tail = name === "methods" ? "[0]!.no_such_field" : ".no_such_field";
        // an unused @ts-expect-error is itself an error: a result typed as a record fails here
        lines.push(`  // @ts-expect-error: ${name} has no such field`);
        lines.push(`  void (null as unknown as R<typeof ${client}.${path}>)${tail};`);
      }
    }
    lines.push("}");
    writeFileSync(join(dir, "use.mts"), lines.join("\n") + "\n");
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({
      compilerOptions: {
        strict: true, noEmit: true, module: "NodeNext", moduleResolution: "NodeNext", target: "ES2022",
        noPropertyAccessFromIndexSignature: false, lib: ["ES2022"], types: ["node"],
      },
      files: ["use.mts"],
    }));
    try {
      execFileSync(TSC, ["-p", join(dir, "tsconfig.json")], { cwd: dir, encoding: "utf8", timeout: 120_000 });
    } catch (e) {
      assert.fail(`${e.stdout}${e.stderr}`);
    }
    assert.ok(names.length >= 50);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("parameters the server declares a set of strings for take only those words", () => {
  const api = readFileSync(join(PKG, "src", "api.ts"), "utf8");
  const methods = JSON.parse(readFileSync(join(PKG, "..", "methods.json"), "utf8"));
  const pascal = (name) => name.split(".").map((p) => p.split("_").map((w) => w[0].toUpperCase() + w.slice(1)).join("")).join("");
  let n = 0;
  for (const m of methods) {
    for (const p of m.params.filter((x) => x.enum)) {
      const block = new RegExp(`export interface ${pascal(m.name)}Params \\{\\n([^}]*)\\}`).exec(api);
      assert.ok(block, m.name);
      const line = block[1].split("\n").find((l) => l.startsWith(`  ${p.name}?:`) || l.startsWith(`  ${p.name}:`));
      const type = line.split(":").slice(1).join(":").trim().replace(/;$/, "");
      assert.ok(type !== "string" && type !== "string[]", `${m.name} ${p.name}: ${type}`);
      n++;
    }
  }
  assert.ok(n >= 30, `${n} enum parameters`);
});

test("tsc --strict refuses a word outside a parameter's set", () => {
  const dir = mkdtempSync(join(PKG, "test", ".enums-"));
  try {
    writeFileSync(join(dir, "use.mts"), [
      'import { Client } from "@engram/client";',
      "declare const c: Client;",
      "export async function use(): Promise<void> {",
      '  await c.memory.search({ query: "x", mode: "vector", scopes: ["agent"] });',
      "  // @ts-expect-error: not a mode",
      '  await c.memory.search({ query: "x", mode: "fuzzy" });',
      "  // @ts-expect-error: not a format",
      '  await c.memory.context({ query: "x", format: "html" });',
      "  // @ts-expect-error: not a status",
      '  await c.session.workItem.list({ session_id: 1, statuses: ["open", "lost"] });',
      '  await c.admin.tenant.update({ tenant_id: 1, index_engine: "default" });',
      "}",
    ].join("\n") + "\n");
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({
      compilerOptions: { strict: true, noEmit: true, module: "NodeNext", moduleResolution: "NodeNext", target: "ES2022", lib: ["ES2022"], types: ["node"] },
      files: ["use.mts"],
    }));
    try {
      execFileSync(TSC, ["-p", join(dir, "tsconfig.json")], { cwd: dir, encoding: "utf8", timeout: 120_000 });
    } catch (e) {
      assert.fail(`${e.stdout}${e.stderr}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
