// engramd unreachable: tool calls (and resource reads) fail as MCP errors within about two
// seconds, not at ENGRAM_TIMEOUT_MS (15 s by default, left as it is here), and work again by
// themselves once engramd answers, without restarting engram-mcp. engramd is reached
// through a relay that can freeze (a hung engramd, a network dropping packets: connections
// open, nothing answered) or refuse, over stdio and over --http.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";

import { httpClient, httpServer, newTenant, ok, relay, stdioClient, text, timed } from "./lib.mjs";

const FAST_MS = 2500; // "about 1-2 s", with room for a loaded test machine

/** Polls a tool call until it succeeds (engramd is back): resolves to the time it took. */
async function recovers(c, within = 15_000) {
  const t = Date.now();
  for (;;) {
    const r = await c.callTool({ name: "recall", arguments: { query: "anything", mode: "text" } });
    if (!r.isError) return Date.now() - t;
    assert.ok(Date.now() - t < within, `not back after ${within} ms: ${text(r)}`);
    await sleep(200);
  }
}

async function fastFailure(c, name, args) {
  const r = await timed(c.callTool({ name, arguments: args }));
  assert.equal(r.error, undefined, String(r.error));
  assert.equal(r.value.isError, true, `${name} succeeded: ${text(r.value)}`);
  assert.ok(r.took < FAST_MS, `${name} failed after ${r.took} ms`);
  assert.match(text(r.value), /Engram is unreachable \(engramd \S+: .*\)\. Reconnecting in the background/);
  return { took: r.took, text: text(r.value) };
}

test("stdio: engramd stops answering mid-session, then refuses, then comes back", async () => {
  const key = await newTenant("mcp-outage");
  const r = await relay();
  const c = await stdioClient({ ENGRAM_URL: `engram://127.0.0.1:${r.port}`, ENGRAM_API_KEY: key });
  try {
    await ok(c, "remember", { content: "stored before the outage" });

    await r.setMode("freeze");
    let f = await fastFailure(c, "recall", { query: "outage" });
    assert.match(f.text, /no answer within 2 s/);
    assert.doesNotMatch(f.text, /may or may not/); // a read
    f = await fastFailure(c, "remember", { content: "during the outage" });
    assert.ok(f.took < FAST_MS);
    const rr = await timed(c.readResource({ uri: "engram://memory/1" }));
    assert.ok(rr.error && rr.took < FAST_MS, `resources/read: ${rr.took} ms, ${rr.error}`);
    assert.match(String(rr.error.message), /Engram is unreachable/);
    await fastFailure(c, "recall", { query: "outage" }); // still frozen: still fast

    await r.setMode("refuse");
    await fastFailure(c, "memory_list", {});

    await r.setMode("pass");
    const back = await recovers(c);
    console.log(`engram-mcp (stdio): tool calls failed within ${FAST_MS} ms while engramd was away; working again ${back} ms after it came back`);
    assert.match(await ok(c, "recall", { query: "stored before the outage", mode: "text" }), /stored before the outage/);
    assert.match(c.log(), /unreachable \(no answer within 2 s\); reconnecting in the background/);
    assert.match(c.log(), /reachable again after \d+ s/);
  } finally {
    await c.close();
    r.close();
  }
});

test("stdio: an engramd that accepts but never answers fails the first call fast", async () => {
  const key = await newTenant("mcp-outage-first");
  const r = await relay();
  await r.setMode("freeze");
  const c = await stdioClient({ ENGRAM_URL: `engram://127.0.0.1:${r.port}`, ENGRAM_API_KEY: key });
  try {
    await fastFailure(c, "recall", { query: "anything" });
    await fastFailure(c, "scratchpad_read", {});
    await r.setMode("pass");
    await recovers(c);
    assert.match(await ok(c, "scratchpad_read", {}), /Scratchpad of session \d+, version 0/);
  } finally {
    await c.close();
    r.close();
  }
});

test("http: a session's engramd stops answering, then comes back; the session carries on", async () => {
  const key = await newTenant("mcp-outage-http");
  const r = await relay();
  const web = await httpServer({ ENGRAM_URL: `engram://127.0.0.1:${r.port}` });
  const c = await httpClient(web.url, key);
  try {
    const sid = /session (\d+)/.exec(await ok(c, "scratchpad_update", { content: "kept across the outage" }))[1];
    await r.setMode("freeze");
    await fastFailure(c, "scratchpad_read", {});
    await fastFailure(c, "recall", { query: "x" });
    await r.setMode("pass");
    await recovers(c);
    // the same MCP session and Engram session, authenticated again with the client's key
    assert.match(await ok(c, "scratchpad_read", {}), new RegExp(`session ${sid}, version 1:\\nkept across the outage`));
    assert.match(web.stderr(), /unreachable .*reconnecting in the background/);
    assert.ok(!web.stderr().includes(key), "the key reached the log");
  } finally {
    await c.close();
    await web.stop();
    r.close();
  }
});

test("stdio over engramd's HTTP port (ENGRAM_URL http://): a frozen engramd fails calls fast", async () => {
  const key = await newTenant("mcp-outage-fetch");
  const r = await relay(Number(process.env.ENGRAM_TEST_HTTP_PORT));
  const c = await stdioClient({ ENGRAM_URL: `http://127.0.0.1:${r.port}`, ENGRAM_API_KEY: key });
  try {
    await ok(c, "remember", { content: "over fetch" });
    await r.setMode("freeze");
    const f = await fastFailure(c, "recall", { query: "over fetch" });
    assert.match(f.text, /engramd http:\/\/127\.0\.0\.1:\d+/);
    await r.setMode("pass");
    await recovers(c);
  } finally {
    await c.close();
    r.close();
  }
});
