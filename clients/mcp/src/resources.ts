// MCP resources: memories and sessions as things a host can list, show and attach, read as
// plain text. URIs:
//   engram://memory/{id}                a memory in full
//   engram://session/{id}               a session: state, counters, scratchpad
//   engram://session/{id}/notes         its live notes
//   engram://session/{id}/transcript    the last TRANSCRIPT_TAIL entries of its transcript
// resources/list pages through the sessions (newest first; the agent's own when
// ENGRAM_AGENT_ID is set), then the memories (newest first, as the agent may see them);
// resources/templates/list gives the four templates. A resource the tenant does not have is
// MCP's "resource not found" (-32002); a URI of another form is invalid params (-32602).
import { EngramError, NotFoundError } from "@engram/client";
import { ErrorCode, type Resource, type ResourceTemplate } from "@modelcontextprotocol/sdk/types.js";

import { ProtocolError, UnreachableError } from "./link.js";
import { iso, memoryText, notesText, sessionText, transcriptText } from "./render.js";
import type { ToolContext } from "./tools.js";

/** MCP's error code for a resource that does not exist. */
export const RESOURCE_NOT_FOUND = -32002;
/** Resources per resources/list page. */
export const PAGE_SIZE = 50;
export const TRANSCRIPT_TAIL = 100;

const TEXT = "text/plain";

export const RESOURCE_TEMPLATES: ResourceTemplate[] = [
  {
    uriTemplate: "engram://memory/{id}",
    name: "memory",
    title: "Memory",
    description: "A long-term memory in full: content, type, importance, tags, scope and history.",
    mimeType: TEXT,
  },
  {
    uriTemplate: "engram://session/{id}",
    name: "session",
    title: "Session",
    description: "A session's state, counters and costs, and its scratchpad.",
    mimeType: TEXT,
  },
  {
    uriTemplate: "engram://session/{id}/notes",
    name: "session-notes",
    title: "Session notes",
    description: "A session's live notes: decisions, discoveries, blockers, context, handoff.",
    mimeType: TEXT,
  },
  {
    uriTemplate: "engram://session/{id}/transcript",
    name: "session-transcript",
    title: "Session transcript",
    description: `The last ${TRANSCRIPT_TAIL} entries of a session's transcript, as a model is given it (events included).`,
    mimeType: TEXT,
  },
];

type Rec = Record<string, unknown>;

/** A resources/list cursor: which list and Engram's cursor in it. */
interface Cursor {
  k: "s" | "m";
  c?: string | number;
}

function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify(c), "utf8").toString("base64url");
}

function decodeCursor(s: string): Cursor {
  try {
    const c = JSON.parse(Buffer.from(s, "base64url").toString("utf8")) as Cursor;
    if ((c.k === "s" || c.k === "m") && (c.c === undefined || typeof c.c === "string" || typeof c.c === "number")) return c;
  } catch {
    // below
  }
  throw new ProtocolError(ErrorCode.InvalidParams, "invalid cursor");
}

const oneLine = (t: string, max: number) => {
  const x = t.replace(/\s+/g, " ").trim();
  return x.length > max ? x.slice(0, max - 1) + "…" : x;
};

function memoryResource(m: Rec): Resource {
  return {
    uri: `engram://memory/${String(m.id)}`,
    name: `memory-${String(m.id)}`,
    title: `${String(m.type)} ${String(m.id)}: ${oneLine(String(m.content ?? ""), 60)}`,
    description: `A ${String(m.type)} memory of importance ${Number(m.importance).toFixed(2)}, ` +
      `created ${iso(m.created_at)}${m.archived_at ? " (archived)" : ""}.`,
    mimeType: TEXT,
    annotations: { lastModified: new Date(Number(m.updated_at)).toISOString(), priority: Number(m.importance) },
  };
}

function sessionResource(x: Rec): Resource {
  return {
    uri: `engram://session/${String(x.session_id)}`,
    name: `session-${String(x.session_id)}`,
    title: `Session ${String(x.session_id)} (${String(x.state)}, agent ${String(x.agent_id)})`,
    description: `Session of agent ${String(x.agent_id)} (${String(x.state)}, model ${String(x.model)}, ` +
      `${String(x.entry_count)} transcript entries, created ${iso(x.created_at)}); its notes and transcript are ` +
      `engram://session/${String(x.session_id)}/notes and /transcript.`,
    mimeType: TEXT,
    annotations: { lastModified: new Date(Number(x.updated_at)).toISOString() },
  };
}

/** resources/list: one page of sessions, then of memories. */
export async function listResources(ctx: ToolContext, cursor: string | undefined): Promise<{ resources: Resource[]; nextCursor?: string }> {
  const at: Cursor = cursor === undefined ? { k: "s" } : decodeCursor(cursor);
  return guard(ctx, undefined, async () => {
    if (at.k === "s") {
      const r = await ctx.client.session.list({
        limit: PAGE_SIZE, ...(ctx.agentId !== undefined ? { agent_id: ctx.agentId } : {}),
        ...(typeof at.c === "number" ? { cursor: at.c } : {}),
      });
      const resources = r.sessions.map((x) => sessionResource(x as unknown as Rec));
      const next = r.next_cursor;
      return { resources, nextCursor: encodeCursor(next != null ? { k: "s", c: Number(next) } : { k: "m" }) };
    }
    const r = await ctx.client.memory.list({
      limit: PAGE_SIZE, agent_id: ctx.agentId, ...(typeof at.c === "string" ? { cursor: at.c } : {}),
    });
    const resources = (r.memories as unknown as (Rec | null)[]).filter((m): m is Rec => m !== null).map(memoryResource);
    const next = r.next_cursor;
    return next ? { resources, nextCursor: encodeCursor({ k: "m", c: String(next) }) } : { resources };
  });
}

const URI = /^engram:\/\/(memory|session)\/(\d{1,20})(\/(notes|transcript))?$/;

/** resources/read of one of the templates' URIs. */
export async function readResource(ctx: ToolContext, uri: string): Promise<{ contents: { uri: string; mimeType: string; text: string }[] }> {
  const m = URI.exec(uri);
  if (!m || (m[1] === "memory" && m[3] !== undefined)) {
    throw new ProtocolError(ErrorCode.InvalidParams, `unknown resource URI '${uri}': expected engram://memory/{id}, ` +
      "engram://session/{id}, engram://session/{id}/notes or engram://session/{id}/transcript");
  }
  const big = BigInt(m[2]!);
  const id = big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
  const text = await guard(ctx, uri, async () => {
    if (m[1] === "memory") {
      const r = await ctx.client.memory.get({ ids: [id as number] });
      const mem = (r.memories as unknown as (Rec | null)[])[0];
      if (!mem) throw new ProtocolError(RESOURCE_NOT_FOUND, "Resource not found", { uri });
      return memoryText(mem);
    }
    const sid = id as number;
    if (m[4] === "notes") return notesText(sid, (await ctx.client.session.notes({ session_id: sid })).notes as unknown as Rec[]);
    if (m[4] === "transcript") {
      return transcriptText(await ctx.client.session.messages({ session_id: sid, tail: TRANSCRIPT_TAIL, include_events: true,
        limit: TRANSCRIPT_TAIL }) as unknown as Rec);
    }
    const [g, pad] = await Promise.all([ctx.client.session.get({ session_id: sid }),
      ctx.client.session.scratchpad.get({ session_id: sid })]);
    return sessionText(g as unknown as Rec, pad as unknown as Rec);
  });
  return { contents: [{ uri, mimeType: TEXT, text }] };
}

/** Runs fn through the link; maps Engram's not_found to MCP's resource not found (for a
 * read), an unreachable engramd and other Engram errors to an internal error with the
 * message. */
async function guard<T>(ctx: ToolContext, uri: string | undefined, fn: () => Promise<T>): Promise<T> {
  try {
    return await ctx.link.run(fn);
  } catch (e) {
    if (e instanceof ProtocolError) throw e;
    if (e instanceof NotFoundError && uri !== undefined) throw new ProtocolError(RESOURCE_NOT_FOUND, "Resource not found", { uri });
    if (e instanceof EngramError) throw new ProtocolError(ErrorCode.InternalError, `Engram error ${e.code}: ${e.serverMessage}`);
    if (e instanceof UnreachableError) throw new ProtocolError(ErrorCode.InternalError, e.message);
    throw new ProtocolError(ErrorCode.InternalError, `Engram failed: ${e instanceof Error ? e.message : String(e)}`);
  }
}
