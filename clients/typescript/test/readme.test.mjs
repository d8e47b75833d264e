// The README's quick start works as written (pointed at the test server's port).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, rmSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { PORT, newTenant } from "./helpers.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));

test("quick start", async () => {
  const readme = readFileSync(join(HERE, "..", "README.md"), "utf8");
  let code = /```js\n([\s\S]*?)```/.exec(readme.split("## Quick start")[1])[1];
  assert.equal(code.trim().split("\n").length, 5);
  assert.equal(code.split("new Client({ apiKey").length, 2);
  code = code.replace("new Client({ apiKey", `new Client({ port: ${PORT}, apiKey`);
  // inside clients/ so that "@engram/client" resolves through the workspace's node_modules
  const file = join(HERE, `.quickstart-${process.pid}.mjs`);
  writeFileSync(file, code);
  try {
    const out = execFileSync(process.execPath, [file], {
      env: { ...process.env, ENGRAM_API_KEY: await newTenant({ dim: 0 }) }, encoding: "utf8", timeout: 60_000,
    });
    assert.match(out, /The user prefers metric units/);
  } finally {
    rmSync(file, { force: true });
  }
});
