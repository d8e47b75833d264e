// The Engram MCP server: configuration from the environment, the tool handlers wrapped so
// that every failure becomes an MCP tool error (isError) with the server's message, the
// resources (resources.ts) and the prompts (prompts.ts).
import { readFileSync } from "node:fs";

import { Client, EngramError, parseEngramUrl, type Id } from "@engram/client";
// The low-level Server lets each tool declare a hand-written JSON Schema; the high-level
// McpServer would need zod schemas for the same thing.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import {
  CallToolRequestSchema, GetPromptRequestSchema, ListPromptsRequestSchema, ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema, ListToolsRequestSchema, ReadResourceRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

import { EngramLink, UnreachableError } from "./link.js";
import { getPrompt, PROMPTS } from "./prompts.js";
import { parseLevels, type MatchLevels } from "./render.js";
import { listResources, readResource, RESOURCE_TEMPLATES } from "./resources.js";
import { ArgumentError, checkArguments, toolContext, TOOLS, type ToolContext } from "./tools.js";

export { TOOLS } from "./tools.js";
export { PROMPTS } from "./prompts.js";
export { RESOURCE_TEMPLATES } from "./resources.js";
export type { Tool, ToolContext } from "./tools.js";

export const VERSION = "0.2.0";

/** TLS to engramd: PEM contents, read from the files the ENGRAM_TLS_* variables name. */
export interface EngramTlsConfig {
  /** CA certificate(s) the server's certificate must chain to (Node's bundled CAs without). */
  ca?: string;
  /** Client certificate to present (an admin needs one on a server that requires it). */
  cert?: string;
  /** Its private key. */
  key?: string;
  /** The name the server's certificate must carry, when not `host`. */
  servername?: string;
}

/** Settings, normally read from the environment by configFromEnv. */
export interface EngramMcpConfig {
  /** engramd's HTTP/JSON URL when ENGRAM_URL is http(s)://: then host, port and tls are unused. */
  httpUrl?: string | undefined;
  host: string;
  port: number;
  /** undefined: plain TCP (meant for loopback). */
  tls: EngramTlsConfig | undefined;
  apiKey: string | undefined;
  agentId: Id | undefined;
  sessionId: Id | undefined;
  model: string;
  timeoutMs: number;
  /** Where recall's similarities read strong, good and weak (ENGRAM_MCP_MATCH_LEVELS). */
  levels: MatchLevels;
}

function parseId(name: string, v: string | undefined): Id | undefined {
  if (v === undefined || v === "") return undefined;
  if (!/^\d+$/.test(v)) throw new Error(`${name} must be an unsigned integer`);
  const b = BigInt(v);
  return b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b;
}

function readPem(name: string, path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`${name}: cannot read ${path}: ${(e as Error).message}`);
  }
}

/**
 * TLS as the engram CLI takes it: ENGRAM_TLS (any value but 0 turns it on), ENGRAM_TLS_CA,
 * ENGRAM_TLS_CERT and ENGRAM_TLS_KEY (PEM files; any of them turns it on; the key defaults
 * to the certificate's file), plus ENGRAM_TLS_SERVERNAME. Throws for an unreadable file.
 */
function tlsFromEnv(env: NodeJS.ProcessEnv): EngramTlsConfig | undefined {
  const caFile = env.ENGRAM_TLS_CA || undefined;
  const certFile = env.ENGRAM_TLS_CERT || undefined;
  const keyFile = env.ENGRAM_TLS_KEY || undefined;
  const servername = env.ENGRAM_TLS_SERVERNAME || undefined;
  const on = (env.ENGRAM_TLS !== undefined && env.ENGRAM_TLS !== "" && env.ENGRAM_TLS !== "0") ||
    caFile !== undefined || certFile !== undefined || keyFile !== undefined;
  if (!on) {
    if (servername) throw new Error("ENGRAM_TLS_SERVERNAME needs ENGRAM_TLS=1 or ENGRAM_TLS_CA");
    return undefined;
  }
  if (keyFile && !certFile) throw new Error("ENGRAM_TLS_KEY needs ENGRAM_TLS_CERT");
  const tls: EngramTlsConfig = {};
  if (caFile) tls.ca = readPem("ENGRAM_TLS_CA", caFile);
  if (certFile) {
    tls.cert = readPem("ENGRAM_TLS_CERT", certFile);
    tls.key = keyFile ? readPem("ENGRAM_TLS_KEY", keyFile) : tls.cert; // one file may hold both
  }
  if (servername) tls.servername = servername;
  return tls;
}

/** The first line of ENGRAM_API_KEY_FILE; errors name the variable, never the key. */
function readKeyFile(path: string): string {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`ENGRAM_API_KEY_FILE: cannot read ${path}: ${(e as Error).message}`);
  }
  const key = text.split(/\r?\n/, 1)[0]!.trim();
  if (!key) throw new Error(`ENGRAM_API_KEY_FILE: ${path} holds no key on its first line`);
  return key;
}

/**
 * The variables every Engram tool reads: ENGRAM_URL (`engram://host:port`,
 * `engrams://host:port` for TLS, or `http(s)://host:port` for the HTTP/JSON port; default
 * engram://127.0.0.1:7420), ENGRAM_API_KEY or ENGRAM_API_KEY_FILE, and TLS: ENGRAM_TLS,
 * ENGRAM_TLS_CA, ENGRAM_TLS_CERT, ENGRAM_TLS_KEY, ENGRAM_TLS_SERVERNAME. ENGRAM_HOST and
 * ENGRAM_PORT, this server's names before ENGRAM_URL, still work when ENGRAM_URL is unset.
 * This server's own: ENGRAM_AGENT_ID (the default agent id), ENGRAM_SESSION_ID (a session
 * to continue), ENGRAM_MODEL (recorded on new sessions, default "mcp"), ENGRAM_TIMEOUT_MS
 * (15000), ENGRAM_MCP_MATCH_LEVELS (recall's strong, good and weak similarities, default
 * 0.6,0.4,0.2). Throws, naming the variable, for a value that is wrong or a file that cannot
 * be read.
 */
export function configFromEnv(env: NodeJS.ProcessEnv = process.env): EngramMcpConfig {
  let apiKey = env.ENGRAM_API_KEY?.trim() || undefined;
  if (!apiKey && env.ENGRAM_API_KEY_FILE) apiKey = readKeyFile(env.ENGRAM_API_KEY_FILE);
  const timeoutMs = Number(env.ENGRAM_TIMEOUT_MS ?? 15000);
  if (!(timeoutMs > 0)) throw new Error("ENGRAM_TIMEOUT_MS must be a positive number");
  let tls = tlsFromEnv(env);
  let host = env.ENGRAM_HOST || "127.0.0.1";
  let port = Number(env.ENGRAM_PORT || 7420);
  let httpUrl: string | undefined;
  if (env.ENGRAM_URL) {
    let ep;
    try {
      ep = parseEngramUrl(env.ENGRAM_URL, "ENGRAM_URL");
    } catch (e) {
      throw new Error((e as Error).message);
    }
    if (ep.transport === "http") {
      if (tls !== undefined) {
        throw new Error("ENGRAM_URL: the ENGRAM_TLS* variables do not apply to http(s) URLs (Node's fetch trusts its " +
          "bundled CAs; add yours with NODE_EXTRA_CA_CERTS)");
      }
      httpUrl = ep.url;
    } else {
      host = ep.host;
      port = ep.port;
      if (ep.tls) tls ??= {};
    }
  } else if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new Error("ENGRAM_PORT must be a port number");
  }
  return {
    httpUrl,
    host,
    port,
    tls,
    apiKey,
    agentId: parseId("ENGRAM_AGENT_ID", env.ENGRAM_AGENT_ID),
    sessionId: parseId("ENGRAM_SESSION_ID", env.ENGRAM_SESSION_ID),
    model: env.ENGRAM_MODEL || "mcp",
    timeoutMs,
    levels: parseLevels(env.ENGRAM_MCP_MATCH_LEVELS),
  };
}

/** Where cfg points, for logs (never with a key). */
export function describeEngramd(cfg: EngramMcpConfig): string {
  if (cfg.httpUrl !== undefined) return `engramd ${cfg.httpUrl}`;
  return `engramd ${cfg.host}:${cfg.port}${cfg.tls ? " over TLS" : ""}`;
}

/** A client for cfg's engramd acting with apiKey (none: it authenticates later). It reads
 * no environment of its own: cfg already did. */
export function engramClient(cfg: EngramMcpConfig, apiKey: string | undefined): Client {
  const common = { apiKey, timeoutMs: cfg.timeoutMs, env: {} };
  if (cfg.httpUrl !== undefined) return new Client({ ...common, url: cfg.httpUrl });
  return new Client({ ...common, host: cfg.host, port: cfg.port, ...(cfg.tls ? { tls: true, ...cfg.tls } : {}) });
}

/**
 * The state of one MCP session (over stdio: of the process): the Engram connection behind a
 * reachability check, the agent and the current session. The client acts with apiKey
 * (default cfg.apiKey); log takes one line and never a key.
 */
export function createContext(cfg: EngramMcpConfig, apiKey: string | undefined = cfg.apiKey,
  log: (msg: string) => void = () => {}, client?: Client): ToolContext {
  const link = new EngramLink(client ?? engramClient(cfg, apiKey), () => engramClient(cfg, apiKey), describeEngramd(cfg), log);
  return toolContext(link, { agentId: cfg.agentId, model: cfg.model, sessionId: cfg.sessionId, levels: cfg.levels });
}

function describe(e: unknown): string {
  if (e instanceof EngramError) return `Engram error ${e.code}: ${e.serverMessage}`;
  if (e instanceof ArgumentError) return `Invalid arguments: ${e.message}`;
  if (e instanceof UnreachableError) return e.message;
  if (e instanceof Error) return `Engram unreachable or failed: ${e.message}`;
  return `Unexpected failure: ${String(e)}`;
}

/** An MCP Server with the Engram tools, resources and prompts, acting through ctx. Connect
 * it to a transport. */
export function createEngramMcpServer(ctx: ToolContext): Server {
  const server = new Server(
    { name: "engram", title: "Engram memory", version: VERSION },
    {
      capabilities: { tools: {}, resources: {}, prompts: {} },
      instructions:
        "Engram is your long-term memory and your working memory for this session. Recall (or memory_context) " +
        "before answering questions that may depend on what you learned earlier; remember durable facts, " +
        "preferences and constraints as you learn them; keep a plan in the scratchpad and decisions in notes " +
        "during long tasks, and checkpoint before risky steps.",
    },
  );
  server.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: TOOLS.map((t) => ({
      name: t.name,
      title: t.title,
      description: t.description,
      inputSchema: t.inputSchema,
      annotations: t.annotations,
    })),
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req) => {
    const tool = TOOLS.find((t) => t.name === req.params.name);
    if (!tool) {
      return { content: [{ type: "text" as const, text: `Unknown tool '${req.params.name}'.` }], isError: true };
    }
    // Bad arguments are tool errors (isError), not JSON-RPC errors: the model reads them and
    // can correct the call (MCP 2025-11-25, SEP-1303).
    try {
      const args = (req.params.arguments ?? {}) as Record<string, unknown>;
      checkArguments(tool, args);
      const text = await ctx.link.run(() => tool.run(args, ctx), { write: tool.annotations?.readOnlyHint !== true });
      return { content: [{ type: "text" as const, text }] };
    } catch (e) {
      return { content: [{ type: "text" as const, text: describe(e) }], isError: true };
    }
  });
  server.setRequestHandler(ListResourcesRequestSchema, async (req) => listResources(ctx, req.params?.cursor));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({ resourceTemplates: RESOURCE_TEMPLATES }));
  server.setRequestHandler(ReadResourceRequestSchema, async (req) => readResource(ctx, req.params.uri));
  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));
  server.setRequestHandler(GetPromptRequestSchema, async (req) =>
    getPrompt(ctx, req.params.name, (req.params.arguments ?? {}) as Record<string, string>));
  return server;
}
