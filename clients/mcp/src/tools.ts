// The MCP tools: Engram's long-term memory (remember, recall, memory_context, memory_list,
// memory_get, forget, update_memory) and a session's working memory (scratchpad, notes,
// session_append, checkpoints, resume, handoff), each with a JSON Schema and a description
// written for a model. Results are short plain text (render.ts).
import type { Client, Id, MemoryType, NoteCategory, NoteScope } from "@engram/client";

import type { EngramLink } from "./link.js";
import {
  contextText, DEFAULT_LEVELS, handoffText, iso, memoryLine, memoryText, noteLine, relevance, type MatchLevels,
} from "./render.js";

/** What the tools share: the Engram client, the agent identity, the current session. */
export interface ToolContext {
  /** The client calls go through (the link's current one). */
  readonly client: Client;
  /** engramd behind a reachability check: every tool call runs through link.run. */
  link: EngramLink;
  /** The agent memories and sessions belong to (ENGRAM_AGENT_ID), if configured. */
  agentId: Id | undefined;
  /** The model name recorded on sessions this server creates. */
  model: string;
  /** The session the session tools act on when no session_id is given. */
  sessionId: Id | undefined;
  /** Where a similarity reads strong, good or weak (ENGRAM_MCP_MATCH_LEVELS). */
  levels: MatchLevels;
}

/** A ToolContext over link, its client always the link's current one. */
export function toolContext(link: EngramLink, o: { agentId: Id | undefined; model: string; sessionId: Id | undefined;
  levels?: MatchLevels }): ToolContext {
  const ctx = { link, agentId: o.agentId, model: o.model, sessionId: o.sessionId, levels: o.levels ?? DEFAULT_LEVELS };
  Object.defineProperty(ctx, "client", { get: () => link.client, enumerable: true });
  return ctx as ToolContext;
}

export interface Tool {
  name: string;
  title: string;
  description: string;
  inputSchema: { type: "object"; properties: Record<string, unknown>; required?: string[]; additionalProperties?: boolean };
  annotations?: { readOnlyHint?: boolean; destructiveHint?: boolean; idempotentHint?: boolean; openWorldHint?: boolean };
  run(args: Record<string, unknown>, ctx: ToolContext): Promise<string>;
}

/** A tool argument the model got wrong: reported as a tool error, with the reason. */
export class ArgumentError extends Error {}

/**
 * Refuses arguments the tool does not declare (its schema says additionalProperties: false;
 * the SDK does not check schemas on the server side), naming them and what the tool takes,
 * so that a model that guessed `limit` learns it is `top_k` instead of having it ignored.
 */
export function checkArguments(tool: Tool, args: Record<string, unknown>): void {
  const known = Object.keys(tool.inputSchema.properties);
  const unknown = Object.keys(args).filter((k) => !known.includes(k));
  if (unknown.length === 0) return;
  const names = unknown.map((k) => `'${k}'`).join(", ");
  throw new ArgumentError(`unknown argument${unknown.length > 1 ? "s" : ""} ${names}: ${tool.name} takes ` +
    (known.length ? known.join(", ") : "no arguments"));
}

const MEMORY_TYPES = ["fact", "preference", "episode", "strategy_outcome", "constraint"];
const NOTE_CATEGORIES = ["decision", "discovery", "blocker", "context", "handoff"];
const NOTE_SCOPES = ["current_task", "session", "carry_forward"];

// ---- argument helpers -----------------------------------------------------------------------

function str(a: Record<string, unknown>, k: string, required: true): string;
function str(a: Record<string, unknown>, k: string, required?: false): string | undefined;
function str(a: Record<string, unknown>, k: string, required = false): string | undefined {
  const v = a[k];
  if (v === undefined || v === null) {
    if (required) throw new ArgumentError(`missing required argument '${k}'`);
    return undefined;
  }
  if (typeof v !== "string") throw new ArgumentError(`argument '${k}' must be a string`);
  return v;
}

function num(a: Record<string, unknown>, k: string, required = false): number | undefined {
  const v = a[k];
  if (v === undefined || v === null) {
    if (required) throw new ArgumentError(`missing required argument '${k}'`);
    return undefined;
  }
  if (typeof v !== "number" || !Number.isFinite(v)) throw new ArgumentError(`argument '${k}' must be a number`);
  return v;
}

function int(a: Record<string, unknown>, k: string, required = false): number | undefined {
  const v = num(a, k, required);
  if (v !== undefined && (!Number.isInteger(v) || v < 0)) {
    throw new ArgumentError(`argument '${k}' must be a non-negative integer`);
  }
  return v;
}

function strs(a: Record<string, unknown>, k: string): string[] | undefined {
  const v = a[k];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) {
    throw new ArgumentError(`argument '${k}' must be an array of strings`);
  }
  return v as string[];
}

function ints(a: Record<string, unknown>, k: string): number[] {
  const v = a[k];
  if (!Array.isArray(v) || v.length === 0 || !v.every((x) => Number.isInteger(x) && x >= 0)) {
    throw new ArgumentError(`argument '${k}' must be a non-empty array of memory ids`);
  }
  return v as number[];
}

function bool(a: Record<string, unknown>, k: string): boolean | undefined {
  const v = a[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw new ArgumentError(`argument '${k}' must be true or false`);
  return v;
}

function oneOf<T extends string>(a: Record<string, unknown>, k: string, allowed: readonly string[], dflt?: T): T | undefined {
  const v = str(a, k) ?? dflt;
  if (v !== undefined && !allowed.includes(v)) {
    throw new ArgumentError(`argument '${k}' must be one of ${allowed.join(", ")}`);
  }
  return v as T | undefined;
}

const json = (v: unknown) =>
  JSON.stringify(v, (_, x) => (typeof x === "bigint" ? x.toString() : x), 2);

function idList(a: Record<string, unknown>, k: string, max: number): number[] {
  const ids = ints(a, k);
  if (ids.length > max) throw new ArgumentError(`argument '${k}' holds at most ${max} ids`);
  return ids;
}

/** The session.create in flight for a context, so that concurrent first calls share it. */
const creating = new WeakMap<ToolContext, Promise<Id>>();

/** The session a session tool acts on: the argument, else the current one (created now). */
export async function session(a: Record<string, unknown>, ctx: ToolContext): Promise<Id> {
  const given = int(a, "session_id");
  if (given !== undefined) return given;
  if (ctx.sessionId !== undefined) return ctx.sessionId;
  let p = creating.get(ctx);
  if (p === undefined) {
    p = ctx.client.session
      .create({ agent_id: ctx.agentId ?? 0, config: { model: ctx.model } })
      .then((r) => {
        const id: Id = ctx.sessionId ?? r.session_id; // a resume meanwhile wins
        ctx.sessionId = id;
        return id;
      })
      .finally(() => creating.delete(ctx));
    creating.set(ctx, p);
  }
  return p;
}

const SESSION_ID = {
  type: "integer",
  minimum: 0,
  description:
    "The session to act on. Leave it out to use this conversation's current session (started on first use, or the one `resume` switched to).",
};

const TAGS = {
  type: "array",
  items: { type: "string", minLength: 1, maxLength: 128 },
  maxItems: 64,
  description: "Short keywords (entities, topics) that make the memory easy to filter on later.",
};

// ---- the tools ------------------------------------------------------------------------------

export const TOOLS: Tool[] = [
  {
    name: "remember",
    title: "Remember",
    description:
      "Store something worth knowing in a later conversation: a fact about the user or the world, a preference, " +
      "what happened (episode), how a strategy worked out, or a constraint that must always hold. Write one " +
      "self-contained statement per memory (\"The user's name is Ana and she works in Lisbon\"), not a transcript. " +
      "Returns the new memory's id.",
    inputSchema: {
      type: "object",
      properties: {
        content: { type: "string", minLength: 1, description: "The memory, as one self-contained statement." },
        type: { type: "string", enum: MEMORY_TYPES, default: "fact", description: "What kind of memory this is." },
        importance: {
          type: "number", minimum: 0, maximum: 1, default: 0.5,
          description: "How much this matters, 0 to 1: 0.9+ for constraints and core identity facts, 0.5 ordinary, 0.2 trivia.",
        },
        tags: TAGS,
        scope: {
          type: "string", enum: ["agent", "tenant"],
          description: "'agent' (default when an agent id is configured): only this agent recalls it; 'tenant': every agent of the account does.",
        },
        ttl_seconds: { type: "integer", minimum: 1, description: "Forget it automatically after this many seconds." },
        pinned: { type: "boolean", description: "Never prune this memory during consolidation." },
      },
      required: ["content"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    async run(a, ctx) {
      const scope = oneOf<"agent" | "tenant">(a, "scope", ["agent", "tenant"]);
      const tags = strs(a, "tags");
      const r = await ctx.client.memory.store({
        content: str(a, "content", true),
        type: oneOf<MemoryType>(a, "type", MEMORY_TYPES, "fact")!,
        importance: num(a, "importance") ?? 0.5,
        metadata: tags ? { tokens: tags } : undefined,
        agent_id: scope === "tenant" ? undefined : ctx.agentId,
        scope,
        ttl_seconds: int(a, "ttl_seconds"),
        pinned: bool(a, "pinned"),
      });
      return `Stored memory ${r.id}.`;
    },
  },
  {
    name: "recall",
    title: "Recall",
    description:
      "Search long-term memory for what is relevant to a question or task, before answering from assumptions. " +
      "Returns the best matches with their ids (for memory_get, update_memory or forget), types, importance, and " +
      "how closely each matches: its similarity to the query (cosine, up to 1) and a plain reading of it (strong, " +
      "good or weak match, little relation). Treat weak matches and below as probably unrelated.",
    inputSchema: {
      type: "object",
      properties: {
        query: { type: "string", minLength: 1, description: "What you want to know, in natural language." },
        top_k: { type: "integer", minimum: 1, maximum: 50, default: 5, description: "How many memories to return at most." },
        min_similarity: {
          type: "number", minimum: 0, maximum: 1,
          description: "Leave out memories whose similarity to the query is below this (e.g. 0.4 for good matches only).",
        },
        types: { type: "array", items: { type: "string", enum: MEMORY_TYPES }, description: "Only these kinds of memory." },
        tags: { type: "array", items: { type: "string" }, description: "Only memories sharing at least one of these tags." },
        mode: {
          type: "string", enum: ["vector", "hybrid", "text"], default: "vector",
          description: "'vector' (by meaning, the default), 'hybrid' (meaning and keywords, fused by rank) or 'text' " +
            "(keywords only: words, \"phrases\", OR, -word).",
        },
      },
      required: ["query"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: true, openWorldHint: false },
    async run(a, ctx) {
      const topK = int(a, "top_k") ?? 5;
      const minSim = num(a, "min_similarity");
      if (minSim !== undefined && (minSim < 0 || minSim > 1)) throw new ArgumentError("argument 'min_similarity' must be 0 to 1");
      const mode = oneOf<string>(a, "mode", ["vector", "hybrid", "text"], "vector")! as "vector" | "hybrid" | "text";
      // engramd applies min_similarity before it cuts the ranking to top_k (so a memory that
      // passes is not crowded out by ones that do not) and says how many of the candidates
      // it ranked fell below it (below_min_similarity, docs/protocol.md memory.search)
      const r = await ctx.client.memory.search({
        query: str(a, "query", true),
        top_k: topK,
        type_filter: strs(a, "types") as MemoryType[] | undefined,
        tokens: strs(a, "tags"),
        mode,
        min_similarity: minSim,
        agent_id: ctx.agentId,
      });
      const hits = r.results;
      const left = r.below_min_similarity ?? 0;
      if (hits.length === 0) {
        return left > 0
          ? `No memories with similarity ${minSim!.toFixed(2)} or more (${left} weaker left out).`
          : "No matching memories.";
      }
      const lv = ctx.levels;
      const lines = hits.map((h) => {
        const sim = h.similarity ?? undefined;
        const match = sim === undefined
          ? `keyword match, text rank ${Number(h.score).toFixed(3)}`
          : `${relevance(sim, lv)}: similarity ${sim.toFixed(2)}` +
            (mode === "text" ? `, text rank ${Number(h.score).toFixed(3)}` : "");
        return `[id ${h.id}] (${h.type}, importance ${Number(h.importance).toFixed(2)}, ${match}) ${h.content}`;
      });
      const head = `Best first. Similarity is the cosine between query and memory: strong match from ` +
        `${lv.strong.toFixed(2)}, good from ${lv.good.toFixed(2)}, weak from ${lv.weak.toFixed(2)}, below that little relation.` +
        (left > 0 ? ` ${left} below ${minSim!.toFixed(2)} left out.` : "");
      return [head, ...lines].join("\n");
    },
  },
  {
    name: "memory_context",
    title: "Memory context",
    description:
      "Get the memories relevant to the current task as one <agent_memory> block that fits a token budget, ready to " +
      "keep in mind for the rest of the conversation. Use at the start of a task; use recall for a specific question.",
    inputSchema: {
      type: "object",
      properties: {
        query: { type: "string", minLength: 1, description: "The task or topic at hand." },
        budget_tokens: { type: "integer", minimum: 1, maximum: 100000, default: 1500, description: "The most tokens the block may take." },
        min_similarity: {
          type: "number", minimum: 0, maximum: 1,
          description: "Leave out memories whose similarity to the query is below this, so the budget is not filled with unrelated ones (e.g. 0.4).",
        },
        types: { type: "array", items: { type: "string", enum: MEMORY_TYPES }, description: "Only these kinds of memory." },
        tags: { type: "array", items: { type: "string" }, description: "Only memories sharing at least one of these tags." },
      },
      required: ["query"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: true, openWorldHint: false },
    async run(a, ctx) {
      const minSim = num(a, "min_similarity");
      if (minSim !== undefined && (minSim < 0 || minSim > 1)) throw new ArgumentError("argument 'min_similarity' must be 0 to 1");
      const r = await ctx.client.memory.context({
        query: str(a, "query", true),
        budget_tokens: int(a, "budget_tokens") ?? 1500,
        type_filter: strs(a, "types") as MemoryType[] | undefined,
        tokens: strs(a, "tags"),
        mode: "hybrid",
        top_k: 50,
        min_similarity: minSim,
        agent_id: ctx.agentId,
      });
      if (minSim !== undefined && r.ids.length === 0) return `No memories with similarity ${minSim.toFixed(2)} or more.`;
      return contextText(r.text ?? "");
    },
  },
  {
    name: "memory_list",
    title: "List memories",
    description:
      "List stored memories, newest first (or by importance), one line each with its id: to review what is " +
      "remembered, find duplicates or stale entries, or page through a topic by tag or type. Use recall to search " +
      "by meaning, memory_get for full records.",
    inputSchema: {
      type: "object",
      properties: {
        types: { type: "array", items: { type: "string", enum: MEMORY_TYPES }, description: "Only these kinds of memory." },
        tags: { type: "array", items: { type: "string" }, description: "Only memories sharing at least one of these tags." },
        order_by: {
          type: "string", enum: ["created_at", "importance", "composite"], default: "created_at",
          description: "'created_at' (newest first), 'importance' (the author's, highest first) or 'composite' " +
            "(importance blended with recency and use).",
        },
        limit: { type: "integer", minimum: 1, maximum: 100, default: 20, description: "How many memories per page." },
        cursor: { type: "string", minLength: 1, description: "The cursor a previous page ended with, to read on." },
        include_archived: { type: "boolean", default: false, description: "Also archived memories." },
      },
      additionalProperties: false,
    },
    annotations: { readOnlyHint: true, openWorldHint: false },
    async run(a, ctx) {
      const r = await ctx.client.memory.list({
        type_filter: strs(a, "types") as MemoryType[] | undefined,
        tokens: strs(a, "tags"),
        order_by: oneOf(a, "order_by", ["created_at", "importance", "composite"], "created_at") as
          "created_at" | "importance" | "composite",
        limit: int(a, "limit") ?? 20,
        cursor: str(a, "cursor"),
        include_archived: bool(a, "include_archived"),
        agent_id: ctx.agentId,
      });
      const mems = (r.memories as unknown as (Record<string, unknown> | null)[]).filter((m) => m !== null);
      if (mems.length === 0) return a.cursor ? "No more memories." : "No memories stored.";
      const lines = mems.map((m) => memoryLine(m!));
      if (r.next_cursor) lines.push(`More: call memory_list again with cursor "${r.next_cursor}".`);
      return lines.join("\n");
    },
  },
  {
    name: "memory_get",
    title: "Get memories",
    description:
      "Read memories in full by id (ids come from recall, memory_list or remember): content, type, importance, " +
      "tags, scope, when it was created, changed and last read, and whether it is archived or was replaced.",
    inputSchema: {
      type: "object",
      properties: {
        ids: { type: "array", items: { type: "integer", minimum: 0 }, minItems: 1, maxItems: 100, description: "The memory ids." },
      },
      required: ["ids"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: true, openWorldHint: false },
    async run(a, ctx) {
      const ids = idList(a, "ids", 100);
      const r = await ctx.client.memory.get({ ids });
      const parts = (r.memories as unknown as (Record<string, unknown> | null)[])
        .filter((m) => m !== null).map((m) => memoryText(m!));
      const missing = (r.missing ?? []) as unknown[];
      if (missing.length) parts.push(`Not found: ${missing.join(", ")}.`);
      return parts.join("\n\n---\n\n");
    },
  },
  {
    name: "forget",
    title: "Forget",
    description:
      "Delete memories for good, by id (ids come from recall). Use when the user asks you to forget something or a " +
      "memory is wrong and cannot be corrected with update_memory.",
    inputSchema: {
      type: "object",
      properties: {
        ids: { type: "array", items: { type: "integer", minimum: 0 }, minItems: 1, maxItems: 1000, description: "The memory ids to delete." },
      },
      required: ["ids"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    async run(a, ctx) {
      const ids = ints(a, "ids");
      const deleted = (await ctx.client.memory.delete({ ids })).deleted ?? [];
      const gone = new Set(deleted.map(String));
      const missing = ids.filter((i) => !gone.has(String(i)));
      return `Deleted ${deleted.length} memor${deleted.length === 1 ? "y" : "ies"}` +
        (deleted.length ? ` (${deleted.join(", ")})` : "") +
        (missing.length ? `; not found: ${missing.join(", ")}` : "") + ".";
    },
  },
  {
    name: "update_memory",
    title: "Update memory",
    description:
      "Correct or refine a memory in place, by id (from recall): new content, importance, type, tags or pinning. " +
      "The previous version is kept in the memory's history. Prefer this over storing a contradicting memory.",
    inputSchema: {
      type: "object",
      properties: {
        id: { type: "integer", minimum: 0, description: "The memory to change." },
        content: { type: "string", minLength: 1, description: "The corrected statement." },
        importance: { type: "number", minimum: 0, maximum: 1 },
        type: { type: "string", enum: MEMORY_TYPES },
        tags: { ...TAGS, description: "Replaces the memory's tags." },
        pinned: { type: "boolean" },
      },
      required: ["id"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
    async run(a, ctx) {
      const tags = strs(a, "tags");
      const r = await ctx.client.memory.update({
        id: int(a, "id", true)!,
        content: str(a, "content"),
        importance: num(a, "importance"),
        type: oneOf<MemoryType>(a, "type", MEMORY_TYPES),
        metadata: tags ? { tokens: tags } : undefined,
        pinned: bool(a, "pinned"),
      });
      return `Updated memory ${r.id} (now version ${r.version}).`;
    },
  },
  {
    name: "scratchpad_read",
    title: "Read scratchpad",
    description:
      "Read the session's scratchpad: the working document (plan, progress, open questions) kept across turns and " +
      "restarts. Read it before continuing a long task.",
    inputSchema: { type: "object", properties: { session_id: SESSION_ID }, additionalProperties: false },
    annotations: { readOnlyHint: true, openWorldHint: false },
    async run(a, ctx) {
      const r = await ctx.client.session.scratchpad.get({ session_id: await session(a, ctx) });
      return `Scratchpad of session ${r.session_id}, version ${r.version}:\n${r.content || "(empty)"}`;
    },
  },
  {
    name: "scratchpad_update",
    title: "Update scratchpad",
    description:
      "Replace the session's scratchpad with a new version of the whole document (Markdown works well): the plan, " +
      "what is done, what is next. Pass expected_version (from scratchpad_read) to avoid overwriting a newer version.",
    inputSchema: {
      type: "object",
      properties: {
        content: { type: "string", maxLength: 262144, description: "The complete new scratchpad." },
        expected_version: { type: "integer", minimum: 0, description: "Apply only if the scratchpad is still at this version." },
        session_id: SESSION_ID,
      },
      required: ["content"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    async run(a, ctx) {
      const r = await ctx.client.session.scratchpad.update({
        session_id: await session(a, ctx),
        content: str(a, "content", true),
        expected_version: int(a, "expected_version"),
      });
      return `Scratchpad of session ${r.session_id} saved as version ${r.version}.`;
    },
  },
  {
    name: "note_add",
    title: "Add note",
    description:
      "Record a structured note in the session: a decision taken, a discovery, a blocker, useful context, or " +
      "something for whoever continues the work (handoff). A note with the same key replaces the earlier one. " +
      "Scope 'carry_forward' hands the note to the next session; 'current_task' clears it when the task completes.",
    inputSchema: {
      type: "object",
      properties: {
        category: { type: "string", enum: NOTE_CATEGORIES },
        key: { type: "string", minLength: 1, maxLength: 256, description: "A short stable name for what the note is about." },
        value: { type: "string", minLength: 1, maxLength: 16384, description: "The note itself." },
        scope: { type: "string", enum: NOTE_SCOPES, default: "session" },
        session_id: SESSION_ID,
      },
      required: ["category", "key", "value"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    async run(a, ctx) {
      const category = oneOf<NoteCategory>(a, "category", NOTE_CATEGORIES);
      if (!category) throw new ArgumentError("missing required argument 'category'");
      const r = await ctx.client.session.note.add({
        session_id: await session(a, ctx),
        category,
        key: str(a, "key", true),
        value: str(a, "value", true),
        scope: oneOf<NoteScope>(a, "scope", NOTE_SCOPES, "session")!,
      });
      return `Added note ${r.note_id}` + (r.superseded != null ? ` (replacing note ${r.superseded})` : "") + ".";
    },
  },
  {
    name: "notes",
    title: "List notes",
    description: "List the session's live notes (decisions, discoveries, blockers, context, handoff), oldest first.",
    inputSchema: {
      type: "object",
      properties: {
        categories: { type: "array", items: { type: "string", enum: NOTE_CATEGORIES }, description: "Only these categories." },
        scopes: { type: "array", items: { type: "string", enum: NOTE_SCOPES }, description: "Only these scopes." },
        session_id: SESSION_ID,
      },
      additionalProperties: false,
    },
    annotations: { readOnlyHint: true, openWorldHint: false },
    async run(a, ctx) {
      const r = await ctx.client.session.notes({
        session_id: await session(a, ctx),
        categories: strs(a, "categories") as NoteCategory[] | undefined,
        scopes: strs(a, "scopes") as NoteScope[] | undefined,
      });
      if (r.notes.length === 0) return "No notes.";
      return r.notes.map((n) => noteLine(n as unknown as Record<string, unknown>)).join("\n");
    },
  },
  {
    name: "session_append",
    title: "Append to transcript",
    description:
      "Append a message to the session's transcript, the record of the conversation that checkpoints, resume and " +
      "handoff carry: a user request, your answer, a tool's result or a system instruction worth keeping. Returns " +
      "the entry id and its position.",
    inputSchema: {
      type: "object",
      properties: {
        role: { type: "string", enum: ["user", "assistant", "tool", "system"], description: "Who said it." },
        content: { type: "string", maxLength: 65536, description: "The message." },
        tokens: { type: "integer", minimum: 0, description: "Its length in the model's tokens, if known." },
        session_id: SESSION_ID,
      },
      required: ["role", "content"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    async run(a, ctx) {
      const role = oneOf<"user" | "assistant" | "tool" | "system">(a, "role", ["user", "assistant", "tool", "system"]);
      if (!role) throw new ArgumentError("missing required argument 'role'");
      const sid = await session(a, ctx);
      const r = await ctx.client.session.append({
        session_id: sid, role, content: str(a, "content", true), tokens: int(a, "tokens"),
      });
      return `Appended entry ${r.entry_id} to session ${sid} at position ${r.seq}.`;
    },
  },
  {
    name: "checkpoint",
    title: "Checkpoint",
    description:
      "Save the session's full state (transcript position, scratchpad, notes, costs) under a label, to resume from " +
      "later: before a risky step, or at a milestone. Returns the checkpoint id.",
    inputSchema: {
      type: "object",
      properties: {
        label: { type: "string", minLength: 1, maxLength: 256, description: "What this point is, e.g. 'before migration'." },
        session_id: SESSION_ID,
      },
      required: ["label"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    async run(a, ctx) {
      const r = await ctx.client.session.checkpoint({ session_id: await session(a, ctx), label: str(a, "label", true) });
      return `Checkpoint ${r.checkpoint_id} saved for session ${r.session_id} (expires at ${iso(r.expires_at)}).`;
    },
  },
  {
    name: "resume",
    title: "Resume from checkpoint",
    description:
      "Start a new session from a checkpoint (after a failure, or to retry from a known good point) and make it the " +
      "current session. The checkpointed session is not changed. Returns the restored scratchpad and notes.",
    inputSchema: {
      type: "object",
      properties: {
        checkpoint_id: { type: "integer", minimum: 0, description: "The checkpoint to resume from (from checkpoint)." },
      },
      required: ["checkpoint_id"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    async run(a, ctx) {
      const r = await ctx.client.session.resume({ checkpoint_id: int(a, "checkpoint_id", true)! });
      ctx.sessionId = r.session_id;
      const pad = await ctx.client.session.scratchpad.get({ session_id: r.session_id });
      const notes = await ctx.client.session.notes({ session_id: r.session_id });
      return [
        `Resumed checkpoint ${r.checkpoint_id} as session ${r.session_id} (now current).`,
        `Scratchpad (version ${pad.version}):\n${pad.content || "(empty)"}`,
        `Notes:\n${notes.notes.map((n) => noteLine(n as unknown as Record<string, unknown>)).join("\n") || "(none)"}`,
      ].join("\n\n");
    },
  },
  {
    name: "handoff",
    title: "Handoff package",
    description:
      "Get what someone needs to pick the session up: summary, carry-forward notes, open blockers, decisions, " +
      "work items, scratchpad and recent events, as short text sections. Mode 'continue' (the same agent later), " +
      "'takeover' (another agent), 'review' (a human) or 'recovery' (after a crash: everything).",
    inputSchema: {
      type: "object",
      properties: {
        mode: { type: "string", enum: ["continue", "takeover", "review", "recovery"], default: "continue" },
        format: {
          type: "string", enum: ["text", "json"], default: "text",
          description: "'text' (short sections, ISO times) or 'json' (Engram's whole package, for programs).",
        },
        session_id: SESSION_ID,
      },
      additionalProperties: false,
    },
    annotations: { readOnlyHint: true, openWorldHint: false },
    async run(a, ctx) {
      const format = oneOf<string>(a, "format", ["text", "json"], "text");
      const r = await ctx.client.session.handoff({
        session_id: await session(a, ctx),
        mode: oneOf(a, "mode", ["continue", "takeover", "review", "recovery"], "continue")!,
      });
      return format === "json" ? json(r) : handoffText(r as unknown as Record<string, unknown>);
    },
  },
];
