// What engram-mcp offers beyond the first tools, with the official SDK client over stdio
// and over Streamable HTTP (each test runs on both, a tenant of its own): resources
// (memories, sessions, notes, transcripts; templates; not found), prompts with arguments,
// memory_list, memory_get and session_append, recall by meaning with a plain reading of
// each similarity and min_similarity, handoff and memory_context as text for models,
// unknown arguments refused by name, and several clients at once.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import { fails, httpClient, httpServer, newTenant, ok, rpcError, stdioClient, text } from "./lib.mjs";

let web; // one engram-mcp --http for the HTTP variants

before(async () => {
  web = await httpServer({ ENGRAM_AGENT_ID: "7" });
});
after(async () => {
  await web.stop();
});

const TRANSPORTS = {
  stdio: (key) => stdioClient({ ENGRAM_API_KEY: key, ENGRAM_AGENT_ID: "7" }),
  http: (key) => httpClient(web.url, key),
};

/** Defines the test once per transport, each with a fresh tenant and client. */
function both(name, fn) {
  for (const [kind, open] of Object.entries(TRANSPORTS)) {
    test(`${kind}: ${name}`, async () => {
      const c = await open(await newTenant(`mcp-feat-${kind}`));
      try {
        await fn(c, kind);
      } finally {
        await c.close();
      }
    });
  }
}

const ISO = /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ/;
const EPOCH_MS = /\b1\d{12}\b/;
const idOf = (t) => Number(/Stored memory (\d+)/.exec(t)[1]);

both("resources: templates, a paged list, and reads of memories, sessions, notes, transcripts", async (c) => {
  const { resourceTemplates } = await c.listResourceTemplates();
  assert.deepEqual(resourceTemplates.map((t) => t.uriTemplate), ["engram://memory/{id}", "engram://session/{id}",
    "engram://session/{id}/notes", "engram://session/{id}/transcript"]);
  const m1 = idOf(await ok(c, "remember", { content: "The user's name is Ana", importance: 0.8, tags: ["user"] }));
  const m2 = idOf(await ok(c, "remember", { content: "Never deploy on Fridays", type: "constraint", importance: 0.95 }));
  const sid = Number(/session (\d+)/.exec(await ok(c, "scratchpad_update", { content: "# Plan\n- [ ] migrate" }))[1]);
  await ok(c, "note_add", { category: "decision", key: "db", value: "PostgreSQL 15" });
  await ok(c, "session_append", { role: "user", content: "Plan the migration" });

  // the list: sessions first, then memories, page by page to the end
  const uris = [];
  let cursor;
  for (let page = 0; page < 10; page++) {
    const r = await c.listResources(cursor ? { cursor } : {});
    uris.push(...r.resources.map((x) => x.uri));
    for (const x of r.resources) {
      assert.equal(x.mimeType, "text/plain");
      assert.ok(x.name && x.title && x.description, JSON.stringify(x));
    }
    cursor = r.nextCursor;
    if (!cursor) break;
  }
  assert.equal(cursor, undefined, "the list never ended");
  assert.deepEqual(uris, [`engram://session/${sid}`, `engram://memory/${m2}`, `engram://memory/${m1}`]);

  let r = await c.readResource({ uri: `engram://memory/${m1}` });
  assert.equal(r.contents[0].uri, `engram://memory/${m1}`);
  assert.equal(r.contents[0].mimeType, "text/plain");
  const mem = r.contents[0].text;
  assert.match(mem, new RegExp(`^Memory ${m1}: fact, importance 0\\.80`));
  assert.match(mem, /Tags: user/);
  assert.match(mem, ISO);
  assert.doesNotMatch(mem, EPOCH_MS);
  assert.match(mem, /The user's name is Ana$/);

  r = await c.readResource({ uri: `engram://session/${sid}` });
  assert.match(r.contents[0].text, new RegExp(`^Session ${sid}: active, agent 7, model mcp`));
  assert.match(r.contents[0].text, /Scratchpad \(version 1\):\n# Plan\n- \[ \] migrate/);
  r = await c.readResource({ uri: `engram://session/${sid}/notes` });
  assert.match(r.contents[0].text, /\[decision\/session\] db: PostgreSQL 15/);
  r = await c.readResource({ uri: `engram://session/${sid}/transcript` });
  assert.match(r.contents[0].text, /Z \[user\] Plan the migration/);

  let e = await rpcError(c.readResource({ uri: "engram://memory/987654321" }));
  assert.equal(e.code, -32002);
  assert.match(e.message, /Resource not found/);
  assert.doesNotMatch(e.message, /MCP error -32002: MCP error/);
  assert.deepEqual(e.data, { uri: "engram://memory/987654321" });
  e = await rpcError(c.readResource({ uri: "engram://session/987654321/notes" }));
  assert.equal(e.code, -32002);
  e = await rpcError(c.readResource({ uri: "engram://memory/abc" }));
  assert.equal(e.code, -32602);
  assert.match(e.message, /unknown resource URI/);
  e = await rpcError(c.readResource({ uri: `engram://memory/${m1}/notes` }));
  assert.equal(e.code, -32602);
});

both("prompts: recall_before_answering, handoff and remember_what_matters, with their arguments", async (c) => {
  const { prompts } = await c.listPrompts();
  assert.deepEqual(prompts.map((p) => p.name), ["recall_before_answering", "handoff", "remember_what_matters"]);
  assert.deepEqual(prompts[0].arguments.filter((a) => a.required).map((a) => a.name), ["question"]);

  await ok(c, "remember", { content: "Ana's office is in Lisbon & she cycles to work", importance: 0.7 });
  let r = await c.getPrompt({ name: "recall_before_answering", arguments: { question: "Where is Ana's office?" } });
  assert.equal(r.messages.length, 1);
  assert.equal(r.messages[0].role, "user");
  let t = r.messages[0].content.text;
  assert.match(t, /Ana's office is in Lisbon & she cycles to work/);
  assert.match(t, /Question: Where is Ana's office\?$/);
  assert.doesNotMatch(t, /&apos;|&amp;/);

  await ok(c, "note_add", { category: "blocker", key: "ci", value: "CI is red" });
  await ok(c, "checkpoint", { label: "before the fix" });
  r = await c.getPrompt({ name: "handoff", arguments: {} });
  t = r.messages[0].content.text;
  assert.match(t, /^You are picking up a session\./);
  assert.match(t, /Handoff of session \d+ \(mode continue\)/);
  assert.match(t, /Open blockers:\n- ci: CI is red/);
  assert.match(t, /checkpoint \d+ "before the fix"/);
  assert.doesNotMatch(t, EPOCH_MS);
  r = await c.getPrompt({ name: "handoff", arguments: { mode: "review" } });
  assert.match(r.messages[0].content.text, /\(mode review\)[\s\S]*Review the work/);

  r = await c.getPrompt({ name: "remember_what_matters", arguments: { topic: "the deployment" } });
  assert.match(r.messages[0].content.text, /concerns the deployment[\s\S]*remember tool/);

  let e = await rpcError(c.getPrompt({ name: "recall_before_answering", arguments: {} }));
  assert.equal(e.code, -32602);
  assert.match(e.message, /needs the argument 'question'/);
  e = await rpcError(c.getPrompt({ name: "handoff", arguments: { mode: "sideways" } }));
  assert.equal(e.code, -32602);
  assert.match(e.message, /'mode' must be one of continue, takeover, review, recovery/);
  e = await rpcError(c.getPrompt({ name: "handoff", arguments: { limit: "3" } }));
  assert.equal(e.code, -32602);
  assert.match(e.message, /unknown argument 'limit' for prompt 'handoff': it takes mode, session_id/);
  e = await rpcError(c.getPrompt({ name: "handoff", arguments: { session_id: "987654321" } }));
  assert.match(e.message, /not_found/);
  e = await rpcError(c.getPrompt({ name: "no_such_prompt", arguments: {} }));
  assert.equal(e.code, -32602);
});

both("memory_list pages, memory_get reads in full, session_append writes the transcript", async (c) => {
  const ids = [];
  for (const [content, type] of [["first fact", "fact"], ["keep gas under 30 gwei", "constraint"], ["third fact", "fact"]]) {
    ids.push(idOf(await ok(c, "remember", { content, type })));
  }
  let t = await ok(c, "memory_list", { limit: 2 });
  let lines = t.split("\n");
  assert.equal(lines.length, 3, t);
  assert.match(lines[0], new RegExp(`^\\[id ${ids[2]}\\] \\(fact, importance 0\\.50, \\d{4}-\\d\\d-\\d\\d\\) third fact$`));
  assert.match(lines[1], new RegExp(`^\\[id ${ids[1]}\\] \\(constraint`));
  const cursor = /cursor "([^"]+)"/.exec(lines[2])[1];
  t = await ok(c, "memory_list", { limit: 2, cursor });
  assert.match(t, new RegExp(`^\\[id ${ids[0]}\\] \\(fact, importance 0\\.50, [-\\d]+\\) first fact$`));
  t = await ok(c, "memory_list", { types: ["constraint"] });
  assert.equal(t.split("\n").length, 1);
  assert.match(t, /keep gas under 30 gwei/);

  t = await ok(c, "memory_get", { ids: [ids[1], 987654321] });
  assert.match(t, new RegExp(`^Memory ${ids[1]}: constraint, importance 0\\.50, agent 7's\ncreated `));
  assert.match(t, /\n\nkeep gas under 30 gwei\n/);
  assert.match(t, /Not found: 987654321\.$/);
  assert.match(await fails(c, "memory_get", { ids: [] }), /non-empty array/);

  t = await ok(c, "session_append", { role: "user", content: "What is the gas limit?" });
  const m = /^Appended entry (\d+) to session (\d+) at position 1\.$/.exec(t);
  assert.ok(m, t);
  t = await ok(c, "session_append", { role: "assistant", content: "Under 30 gwei.", tokens: 5 });
  assert.match(t, new RegExp(`to session ${m[2]} at position 2\\.$`));
  assert.match(await fails(c, "session_append", { role: "narrator", content: "x" }), /'role' must be one of/);
  const r = await c.readResource({ uri: `engram://session/${m[2]}/transcript` });
  assert.match(r.contents[0].text, /\[user\] What is the gas limit\?\n.*\[assistant\] Under 30 gwei\./);
});

both("recall ranks by meaning, says how strong each match is, and takes min_similarity", async (c) => {
  const helix = idOf(await ok(c, "remember", { content: "The user's favourite editor is Helix", type: "preference" }));
  const tue = idOf(await ok(c, "remember", { content: "Deployments happen on Tuesdays" }));
  let t = await ok(c, "recall", { query: "the user's favourite editor" });
  const lines = t.split("\n");
  assert.match(lines[0], /^Best first\. Similarity is the cosine between query and memory: strong match from 0\.60/);
  assert.match(lines[1], new RegExp(`^\\[id ${helix}\\] \\(preference, importance 0\\.50, strong match: similarity 0\\.\\d\\d\\) The user's favourite editor is Helix$`));
  assert.match(lines[2], new RegExp(`^\\[id ${tue}\\] \\(fact, importance 0\\.50, little relation: similarity -?0\\.\\d\\d\\)`));
  assert.doesNotMatch(t, /score/); // no rank-fusion scores of about 0.03

  t = await ok(c, "recall", { query: "the user's favourite editor", min_similarity: 0.5 });
  assert.match(t, /1 below 0\.50 left out\./);
  assert.match(t, /Helix/);
  assert.doesNotMatch(t, /Tuesdays/);
  t = await ok(c, "recall", { query: "the user's favourite editor", min_similarity: 0.99 });
  assert.equal(t, "No memories with similarity 0.99 or more (2 weaker left out).");
  // the count is engramd's (below_min_similarity): of the top_k candidates it ranked in
  // vector mode, here 1 (filtering on the client, engram-mcp used to ask for 21 and say 2)
  t = await ok(c, "recall", { query: "the user's favourite editor", min_similarity: 0.99, top_k: 1 });
  assert.equal(t, "No memories with similarity 0.99 or more (1 weaker left out).");
  assert.match(await fails(c, "recall", { query: "x", min_similarity: 2 }), /min_similarity/);

  t = await ok(c, "recall", { query: "Tuesdays", mode: "text" });
  assert.match(t, new RegExp(`\\[id ${tue}\\] \\(fact, importance 0\\.50, [a-z ]+: similarity -?\\d\\.\\d\\d, text rank 0\\.\\d{3}\\)`));
  t = await ok(c, "recall", { query: "favourite editor", mode: "hybrid" });
  assert.match(t, /Helix/);
});

both("handoff is short text with ISO times; format json keeps the package", async (c) => {
  await ok(c, "scratchpad_update", { content: "# Plan\n- [x] schema\n- [ ] data" });
  await ok(c, "note_add", { category: "decision", key: "db", value: "PostgreSQL 15", scope: "carry_forward" });
  await ok(c, "note_add", { category: "blocker", key: "ci", value: "CI is red" });
  await ok(c, "session_append", { role: "user", content: "Plan the migration" });
  await ok(c, "checkpoint", { label: "before data" });
  const t = await ok(c, "handoff", {});
  assert.throws(() => JSON.parse(t));
  assert.match(t, /^Handoff of session \d+ \(mode continue\): active, agent 7, model mcp, as of \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\.\n/);
  assert.match(t, /\nMetrics: 1 transcript entry, 0 rounds, 2 notes, 1 checkpoint/);
  assert.match(t, /\n\nCarry forward:\n- \[decision\/carry_forward\] db: PostgreSQL 15\n/);
  assert.match(t, /\n\nOpen blockers:\n- ci: CI is red\n/);
  assert.match(t, /\n\nScratchpad \(version 1\):\n# Plan\n- \[x\] schema\n- \[ \] data\n/);
  assert.match(t, /\n\nRecent events, oldest first:\n- \d{4}-\S+Z checkpoint \d+ "before data"$/);
  assert.equal((t.match(/PostgreSQL 15/g) ?? []).length, 1, "a note shown twice");
  assert.doesNotMatch(t, EPOCH_MS);
  assert.ok(t.split("\n").length <= 20, t);
  const rec = await ok(c, "handoff", { mode: "recovery" });
  assert.match(rec, /\n\nLatest checkpoint:\n- \d+ "before data" at position 2, \S+Z, expires \S+Z\n/);
  assert.match(rec, /\n\nAudit log, last \d+ of \d+:\n- \S+Z create session/);
  const j = JSON.parse(await ok(c, "handoff", { format: "json" }));
  assert.equal(j.mode, "continue");
  assert.equal(typeof j.generated_at, "number");
  assert.deepEqual(j.blockers.map((n) => n.key), ["ci"]);
});

both("memory_context reads without XML entity noise, and stored markup stays inert", async (c) => {
  await ok(c, "remember", { content: "Ana's \"north star\" metric: uptime & <b>latency</b>", importance: 0.9 });
  const t = await ok(c, "memory_context", { query: "Ana's north star metric" });
  assert.match(t, /^<agent_memory>\n/);
  assert.match(t, /Ana's "north star" metric: uptime & &lt;b&gt;latency&lt;\/b&gt;/);
  assert.doesNotMatch(t, /&apos;|&quot;|&amp;/);
  // min_similarity goes to engramd's memory.context: nothing unrelated fills the budget
  assert.match(await ok(c, "memory_context", { query: "Ana's north star metric", min_similarity: 0.1 }), /north star/);
  assert.equal(await ok(c, "memory_context", { query: "Ana's north star metric", min_similarity: 0.99 }),
    "No memories with similarity 0.99 or more.");
  assert.match(await fails(c, "memory_context", { query: "x", min_similarity: 2 }), /min_similarity/);
});

both("unknown arguments are refused, naming them and what the tool takes", async (c) => {
  let t = await fails(c, "recall", { query: "anything", limit: 3 });
  assert.equal(t, "Invalid arguments: unknown argument 'limit': recall takes query, top_k, min_similarity, types, tags, mode");
  const { tools } = await c.listTools();
  for (const tool of tools) {
    assert.equal(tool.inputSchema.additionalProperties, false, tool.name);
    t = await fails(c, tool.name, { bogus_arg: 1, other: "x" });
    assert.match(t, /unknown arguments 'bogus_arg', 'other'/, tool.name);
  }
  // nothing was done by the refused calls
  assert.equal(await ok(c, "memory_list", {}), "No memories stored.");
});

test("several clients at once, over stdio and HTTP, each with its own tenant", async () => {
  const kinds = ["stdio", "http", "stdio", "http"];
  const clients = await Promise.all(kinds.map(async (k, i) => TRANSPORTS[k](await newTenant(`mcp-many-${i}`))));
  try {
    await Promise.all(clients.map(async (c, i) => {
      const id = idOf(await ok(c, "remember", { content: `client ${i} likes colour ${["red", "green", "blue", "teal"][i]}` }));
      await ok(c, "note_add", { category: "decision", key: "who", value: `client ${i}` });
      const r = await c.readResource({ uri: `engram://memory/${id}` });
      assert.match(r.contents[0].text, new RegExp(`client ${i} likes`));
      const list = await ok(c, "memory_list", {});
      assert.equal(list.split("\n").length, 1, list);
      const p = await c.getPrompt({ name: "recall_before_answering", arguments: { question: "which colour?" } });
      const t = p.messages[0].content.text;
      assert.match(t, new RegExp(`client ${i} likes`));
      for (let j = 0; j < 4; j++) if (j !== i) assert.doesNotMatch(t, new RegExp(`client ${j} likes`));
      const h = await c.getPrompt({ name: "handoff", arguments: {} });
      assert.match(h.messages[0].content.text, new RegExp(`who: client ${i}`));
    }));
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
});
