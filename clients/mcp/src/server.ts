// The Engram MCP server: configuration from the environment, the tool handlers wrapped so
// that every failure becomes an MCP tool error (isError) with the server's message.
import { readFileSync } from "node:fs";

import { Client, EngramError, type Id } from "@engram/client";
// The low-level Server lets each tool declare a hand-written JSON Schema; the high-level
// McpServer would need zod schemas for the same thing.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

import { ArgumentError, TOOLS, type ToolContext } from "./tools.js";

export { TOOLS } from "./tools.js";
export type { Tool, ToolContext } from "./tools.js";

export const VERSION = "0.1.0";

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
  host: string;
  port: number;
  /** undefined: plain TCP (meant for loopback). */
  tls: EngramTlsConfig | undefined;
  apiKey: string | undefined;
  agentId: Id | undefined;
  sessionId: Id | undefined;
  model: string;
  timeoutMs: number;
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

/**
 * ENGRAM_HOST (127.0.0.1), ENGRAM_PORT (7420), ENGRAM_API_KEY or ENGRAM_API_KEY_FILE,
 * ENGRAM_AGENT_ID (the default agent id), ENGRAM_SESSION_ID (a session to continue),
 * ENGRAM_MODEL (recorded on new sessions, default "mcp"), ENGRAM_TIMEOUT_MS (15000), and
 * TLS: ENGRAM_TLS, ENGRAM_TLS_CA, ENGRAM_TLS_CERT, ENGRAM_TLS_KEY, ENGRAM_TLS_SERVERNAME.
 */
export function configFromEnv(env: NodeJS.ProcessEnv = process.env): EngramMcpConfig {
  let apiKey = env.ENGRAM_API_KEY || undefined;
  if (!apiKey && env.ENGRAM_API_KEY_FILE) {
    apiKey = readFileSync(env.ENGRAM_API_KEY_FILE, "utf8").trim();
  }
  const port = Number(env.ENGRAM_PORT ?? 7420);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error("ENGRAM_PORT must be a port number");
  const timeoutMs = Number(env.ENGRAM_TIMEOUT_MS ?? 15000);
  if (!(timeoutMs > 0)) throw new Error("ENGRAM_TIMEOUT_MS must be a positive number");
  return {
    host: env.ENGRAM_HOST || "127.0.0.1",
    port,
    tls: tlsFromEnv(env),
    apiKey,
    agentId: parseId("ENGRAM_AGENT_ID", env.ENGRAM_AGENT_ID),
    sessionId: parseId("ENGRAM_SESSION_ID", env.ENGRAM_SESSION_ID),
    model: env.ENGRAM_MODEL || "mcp",
    timeoutMs,
  };
}

/** The shared state of one MCP server process: the Engram connection and the session. */
export function createContext(cfg: EngramMcpConfig): ToolContext {
  return {
    client: new Client({
      host: cfg.host,
      port: cfg.port,
      apiKey: cfg.apiKey,
      timeoutMs: cfg.timeoutMs,
      ...(cfg.tls ? { tls: true, ...cfg.tls } : {}),
    }),
    agentId: cfg.agentId,
    model: cfg.model,
    sessionId: cfg.sessionId,
  };
}

function describe(e: unknown): string {
  if (e instanceof EngramError) return `Engram error ${e.code}: ${e.serverMessage}`;
  if (e instanceof ArgumentError) return `Invalid arguments: ${e.message}`;
  if (e instanceof Error) return `Engram unreachable or failed: ${e.message}`;
  return `Unexpected failure: ${String(e)}`;
}

/** An MCP Server with the Engram tools, acting through ctx. Connect it to a transport. */
export function createEngramMcpServer(ctx: ToolContext): Server {
  const server = new Server(
    { name: "engram", title: "Engram memory", version: VERSION },
    {
      capabilities: { tools: {} },
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
    try {
      const text = await tool.run((req.params.arguments ?? {}) as Record<string, unknown>, ctx);
      return { content: [{ type: "text" as const, text }] };
    } catch (e) {
      return { content: [{ type: "text" as const, text: describe(e) }], isError: true };
    }
  });
  return server;
}
