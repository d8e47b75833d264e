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
