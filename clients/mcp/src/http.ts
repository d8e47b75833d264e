// engram-mcp over Streamable HTTP: one MCP session (transport, MCP Server, Engram client and
// current Engram session) per client, authenticated with the client's own Engram tenant key,
// bound to that key, refused for Origins off the allow-list, ended by DELETE, an idle
// timeout or shutdown, and capped in number.
import { createHash, randomUUID, timingSafeEqual } from "node:crypto";
import * as http from "node:http";

import { Client, EngramError } from "@engram/client";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";

import { createContext, createEngramMcpServer, describeEngramd, engramClient, type EngramMcpConfig } from "./server.js";
import type { ToolContext } from "./tools.js";

/** How the HTTP server runs; see parseHttpArgs in main.ts for the flags and variables. */
export interface HttpOptions {
  host: string;
  /** 0: any free port (the log line says which). */
  port: number;
  /** Origins allowed besides http://localhost, http://127.0.0.1 and http://[::1] (any port), normalized. */
  allowedOrigins: string[];
  /** Live MCP sessions at most; an initialize beyond it is answered 503. */
  maxSessions: number;
  /** A session with no request open for this long is closed. */
  idleTimeoutMs: number;
  /** Requests without an Authorization header act with cfg.apiKey (single-user local setups). */
  envKey: boolean;
}

/** A running HTTP server: its URL, and close(), which ends every session. */
export interface HttpServer {
  url: string;
  close(): Promise<void>;
}

/** The largest request body read here (the initialize request); the SDK's own limit. */
const MAX_BODY = 4 * 1024 * 1024;
const REALM = 'realm="engram-mcp"';

/**
 * `scheme://host[:port]` in the form browsers send (lower case, no default port), or
 * undefined for anything else (a path, a list, "null", "*").
 */
export function normalizeOrigin(s: string): string | undefined {
  if (!/^https?:\/\/[^/?#@\s,]+$/i.test(s)) return undefined;
  try {
    return new URL(s).origin;
  } catch {
    return undefined;
  }
}

/** True for names and addresses that only this machine can reach. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  return h === "localhost" || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h);
}

function originAllowed(origin: string, extra: readonly string[]): boolean {
  const o = normalizeOrigin(origin);
  if (o === undefined) return false;
  const u = new URL(o);
  if (u.protocol === "http:" && (u.hostname === "localhost" || u.hostname === "127.0.0.1" || u.hostname === "[::1]")) {
    return true;
  }
  return extra.includes(o);
}

const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest();

/** One MCP session: what it acts with and whom it belongs to. */
interface Session {
  id: string | undefined;
  transport: StreamableHTTPServerTransport;
  server: Server;
  ctx: ToolContext;
  /** SHA-256 of the key that created the session; requests must present the same key. */
  keyHash: Buffer;
  tenant: string;
  /** HTTP requests of this session still open (an SSE stream counts while it lasts). */
  open: number;
  lastActive: number;
  closed: boolean;
  closeReason: string;
}

function jsonRpcError(res: http.ServerResponse, status: number, code: number, message: string,
  headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(status, { "Content-Type": "application/json", ...headers });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code, message }, id: null }));
}

/** `Authorization: Bearer <token>`: the token, "missing", or "malformed". */
function bearer(req: http.IncomingMessage): string | "missing" | "malformed" {
  const h = req.headers.authorization;
  if (h === undefined) return "missing";
  const m = /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i.exec(h);
  return m ? m[1]! : "malformed";
}

/** The request body as JSON: the value, or an HTTP status (400 bad JSON, 413 too large). */
function readJson(req: http.IncomingMessage): Promise<{ body: unknown } | { status: 400 | 413 }> {
  return new Promise((resolve, reject) => {
    if (Number(req.headers["content-length"]) > MAX_BODY) {
      resolve({ status: 413 });
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    req.on("data", (c: Buffer) => {
      if (done) return;
      size += c.length;
      if (size > MAX_BODY) {
        done = true;
        resolve({ status: 413 });
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => {
      if (done) return;
      done = true;
      try {
        resolve({ body: JSON.parse(Buffer.concat(chunks).toString("utf8")) });
      } catch {
        resolve({ status: 400 });
      }
    });
    req.on("error", (e) => {
      if (!done) reject(e);
      done = true;
    });
  });
}

const isInitialize = (body: unknown) =>
  Array.isArray(body) ? body.some((m) => isInitializeRequest(m)) : isInitializeRequest(body);

/**
 * Starts the Streamable HTTP server at http://host:port/mcp. cfg gives the engramd to reach
 * and the defaults of every session (agent id, model, timeout, TLS); cfg.apiKey is used only
 * with opts.envKey and cfg.sessionId never (each MCP session starts its own Engram session).
 * Resolves once listening; rejects if the port cannot be bound. log takes one line and never
 * receives a key.
 */
export async function startHttpServer(cfg: EngramMcpConfig, opts: HttpOptions, log: (msg: string) => void): Promise<HttpServer> {
  const sessions = new Map<string, Session>();
  let pending = 0; // initializations authenticating against engramd, counted against the cap

  const short = (id: string | undefined) => (id ? id.slice(0, 8) : "-");

  function drop(s: Session, reason: string): void {
    if (s.closed) return;
    s.closed = true;
    if (s.id !== undefined) sessions.delete(s.id);
    s.ctx.link.close();
    void s.server.close().catch(() => {});
    if (s.id !== undefined) log(`session ${short(s.id)} closed (${s.closeReason || reason}); ${sessions.size} live`);
  }

  function track(s: Session, res: http.ServerResponse): void {
    s.open++;
    s.lastActive = Date.now();
    res.on("close", () => {
      s.open--;
      s.lastActive = Date.now();
    });
  }

  // Idle sessions: none of their requests open (an SDK client keeps a GET stream open while
  // it is connected) and none for idleTimeoutMs.
  const sweeper = setInterval(() => {
    const now = Date.now();
    for (const s of sessions.values()) {
      if (s.open === 0 && now - s.lastActive >= opts.idleTimeoutMs) {
        s.closeReason = "idle";
        void s.transport.close(); // its onclose drops the session
      }
    }
  }, Math.max(100, Math.min(opts.idleTimeoutMs / 2, 30_000)));
  sweeper.unref();

  function corsPreflight(res: http.ServerResponse): void {
    res.writeHead(204, {
      "Access-Control-Allow-Methods": "GET, POST, DELETE",
      "Access-Control-Allow-Headers":
        "Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID",
      "Access-Control-Max-Age": "600",
    });
    res.end();
  }

  /** An initialize request without a session: authenticate the key, then open a session. */
  async function initialize(req: http.IncomingMessage, res: http.ServerResponse, key: string, body: unknown): Promise<void> {
    if (sessions.size + pending >= opts.maxSessions) {
      log(`initialize refused: ${opts.maxSessions} sessions live (--max-sessions)`);
      jsonRpcError(res, 503, -32000, "Too many MCP sessions on this server; try again later", { "Retry-After": "30" });
      return;
    }
    pending++;
    let client: Client | undefined;
    try {
      client = engramClient(cfg, undefined);
      let who;
      try {
        who = await client.auth({ api_key: key }); // the client re-authenticates with it after a reconnect
      } catch (e) {
        client.close();
        if (e instanceof EngramError && e.code === "unauthenticated") {
          jsonRpcError(res, 401, -32000, "Unauthorized: the Engram API key was refused",
            { "WWW-Authenticate": `Bearer ${REALM}, error="invalid_token"` });
        } else if (e instanceof EngramError && e.code === "rate_limited") {
          const ms = Number(e.data.retry_after_ms ?? 1000);
          jsonRpcError(res, 429, -32000, "Too many requests", { "Retry-After": String(Math.max(1, Math.ceil(ms / 1000))) });
        } else {
          log(`initialize: cannot authenticate against ${describeEngramd(cfg)}: ${e instanceof Error ? e.message : String(e)}`);
          jsonRpcError(res, 503, -32000, "Engram is unavailable; try again later", { "Retry-After": "5" });
        }
        return;
      }
      if (who.admin) {
        client.close();
        jsonRpcError(res, 403, -32000, "Forbidden: the admin key has no tenant data; use a tenant API key");
        return;
      }
      // the session's client, authenticated above; when engramd is lost, the link replaces it
      // with one that authenticates with the same key on every connect
      const ctx: ToolContext = createContext({ ...cfg, sessionId: undefined }, key,
        (msg) => log(`session ${short(s?.id)}: ${msg}`), client);
      let s!: Session; // the callbacks run once it is set
      const transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => {
          s.id = id;
          sessions.set(id, s);
          log(`session ${short(id)} opened for tenant ${s.tenant}; ${sessions.size} live`);
        },
        onsessionclosed: () => {
          s.closeReason = "deleted by the client";
        },
      });
      s = {
        id: undefined, transport, server: createEngramMcpServer(ctx), ctx,
        keyHash: sha256(key), tenant: String(who.tenant_id ?? "?"),
        open: 0, lastActive: Date.now(), closed: false, closeReason: "",
      };
      client = undefined; // the session owns it now
      transport.onclose = () => drop(s, "closed");
      try {
        await s.server.connect(transport);
        track(s, res);
        await transport.handleRequest(req, res, body);
      } finally {
        if (s.id === undefined) drop(s, "initialize failed"); // e.g. 406: no session was made
      }
    } finally {
      pending--;
      client?.close();
    }
  }

  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    // Origin first (DNS rebinding, cross-site pages): a browser's request from anywhere else
    // does nothing at all. Clients that are not browsers send no Origin.
    const origin = req.headers.origin;
    if (origin !== undefined) {
      if (!originAllowed(origin, opts.allowedOrigins)) {
        jsonRpcError(res, 403, -32000, "Forbidden: Origin not allowed");
        return;
      }
      res.setHeader("Access-Control-Allow-Origin", origin);
      res.setHeader("Access-Control-Expose-Headers", "Mcp-Session-Id, WWW-Authenticate");
      res.setHeader("Vary", "Origin");
    }
    const path = (req.url ?? "/").split("?")[0];
    if (path !== "/mcp") {
      res.writeHead(404).end();
      return;
    }
    if (req.method === "OPTIONS") {
      corsPreflight(res);
      return;
    }
    if (req.method !== "POST" && req.method !== "GET" && req.method !== "DELETE") {
      jsonRpcError(res, 405, -32000, "Method not allowed", { Allow: "GET, POST, DELETE" });
      return;
    }

    let key = bearer(req);
    if (key === "missing" && opts.envKey && cfg.apiKey) key = cfg.apiKey;
    if (key === "missing") {
      jsonRpcError(res, 401, -32000, "Unauthorized: send Authorization: Bearer <Engram tenant API key>",
        { "WWW-Authenticate": `Bearer ${REALM}` });
      return;
    }
    if (key === "malformed") {
      jsonRpcError(res, 401, -32000, "Unauthorized: malformed Authorization header",
        { "WWW-Authenticate": `Bearer ${REALM}, error="invalid_request"` });
      return;
    }

    const sid = req.headers["mcp-session-id"];
    if (sid !== undefined) {
      const s = typeof sid === "string" ? sessions.get(sid) : undefined;
      if (s === undefined) {
        jsonRpcError(res, 404, -32001, "Session not found");
        return;
      }
      if (!timingSafeEqual(sha256(key), s.keyHash)) {
        jsonRpcError(res, 403, -32000, "Forbidden: this session belongs to another API key");
        return;
      }
      track(s, res);
      await s.transport.handleRequest(req, res);
      return;
    }

    if (req.method !== "POST") {
      jsonRpcError(res, 400, -32000, "Bad Request: Mcp-Session-Id header is required");
      return;
    }
    const r = await readJson(req);
    if ("status" in r) {
      jsonRpcError(res, r.status, r.status === 413 ? -32000 : -32700,
        r.status === 413 ? `Payload Too Large: the body must not exceed ${MAX_BODY} bytes` : "Parse error: Invalid JSON");
      return;
    }
    if (!isInitialize(r.body)) {
      jsonRpcError(res, 400, -32000, "Bad Request: Mcp-Session-Id header is required");
      return;
    }
    await initialize(req, res, key, r.body);
  }

  const web = http.createServer((req, res) => {
    handle(req, res).catch((e) => {
      log(`http request failed: ${e instanceof Error ? e.message : String(e)}`);
      jsonRpcError(res, 500, -32603, "Internal error");
    });
  });
  await new Promise<void>((resolve, reject) => {
    web.once("error", reject);
    web.listen(opts.port, opts.host, () => {
      web.off("error", reject);
      resolve();
    });
  });
  const addr = web.address();
  const port = typeof addr === "object" && addr ? addr.port : opts.port;
  const hostInUrl = opts.host.includes(":") ? `[${opts.host}]` : opts.host;

  return {
    url: `http://${hostInUrl}:${port}/mcp`,
    async close() {
      clearInterval(sweeper);
      for (const s of [...sessions.values()]) {
        s.closeReason = "shutdown";
        await s.transport.close();
      }
      await new Promise<void>((resolve) => {
        web.close(() => resolve());
        web.closeAllConnections();
      });
    },
  };
}
