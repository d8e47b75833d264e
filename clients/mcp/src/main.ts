#!/usr/bin/env node
// engram-mcp: the Engram MCP server. Speaks MCP over stdio (the default), acting with
// ENGRAM_API_KEY, or over Streamable HTTP with --http PORT (127.0.0.1 unless --host says
// otherwise), where every client sends its own Engram tenant key and gets its own MCP session
// (see http.ts). Configuration: configFromEnv in server.ts and parseArgs here. Logs go to
// stderr only, and never carry a key.
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

import { isLoopbackHost, normalizeOrigin, startHttpServer, type HttpOptions } from "./http.js";
import { configFromEnv, createContext, createEngramMcpServer, describeEngramd, VERSION } from "./server.js";

const log = (msg: string) => process.stderr.write(`engram-mcp: ${msg}\n`);

const USAGE =
  "usage: engram-mcp [--http PORT [--host HOST] [--allow-origin ORIGIN]... [--max-sessions N]\n" +
  "                  [--idle-timeout SECONDS] [--http-env-key]]\n" +
  "env: ENGRAM_URL ENGRAM_API_KEY|ENGRAM_API_KEY_FILE ENGRAM_AGENT_ID\n" +
  "     ENGRAM_SESSION_ID ENGRAM_MODEL ENGRAM_TIMEOUT_MS ENGRAM_MCP_MATCH_LEVELS\n" +
  "     ENGRAM_TLS ENGRAM_TLS_CA ENGRAM_TLS_CERT ENGRAM_TLS_KEY ENGRAM_TLS_SERVERNAME\n" +
  "     ENGRAM_MCP_ALLOWED_ORIGINS ENGRAM_MCP_MAX_SESSIONS ENGRAM_MCP_IDLE_TIMEOUT_S (with --http)\n" +
  "     ENGRAM_HOST ENGRAM_PORT (before ENGRAM_URL; used when it is unset)\n";

function usage(why?: string): never {
  if (why) log(why);
  process.stderr.write(USAGE);
  process.exit(2);
}

/** The command line (and the ENGRAM_MCP_* variables): undefined for stdio, else the HTTP options. */
function parseArgs(argv: string[], env: NodeJS.ProcessEnv): HttpOptions | undefined {
  let port: number | undefined;
  let host = "127.0.0.1";
  const origins = (env.ENGRAM_MCP_ALLOWED_ORIGINS ?? "").split(",").map((s) => s.trim()).filter((s) => s !== "");
  let maxSessions = env.ENGRAM_MCP_MAX_SESSIONS || "100";
  let idle = env.ENGRAM_MCP_IDLE_TIMEOUT_S || "1800";
  let envKey = false;
  let httpOnly: string | undefined; // the first HTTP-only flag seen, for the error without --http
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const value = () => argv[++i] ?? usage(`${a} needs a value`);
    if (a === "--http") port = Number(value());
    else if (a === "--version") {
      process.stdout.write(VERSION + "\n");
      process.exit(0);
    } else {
      httpOnly ??= a;
      if (a === "--host") host = value();
      else if (a === "--allow-origin") origins.push(value());
      else if (a === "--max-sessions") maxSessions = value();
      else if (a === "--idle-timeout") idle = value();
      else if (a === "--http-env-key") envKey = true;
      else usage(`unknown argument ${a}`);
    }
  }
  if (port === undefined) {
    if (httpOnly !== undefined) usage(`${httpOnly} needs --http`);
    return undefined;
  }
  if (!(Number.isInteger(port) && port >= 0 && port < 65536)) usage("--http needs a port number");
  const allowedOrigins = origins.map((o) => normalizeOrigin(o) ?? usage(`not an origin (scheme://host[:port]): ${o}`));
  const n = Number(maxSessions);
  if (!(Number.isInteger(n) && n >= 1)) usage("--max-sessions (ENGRAM_MCP_MAX_SESSIONS) must be a positive integer");
  const s = Number(idle);
  if (!(s > 0 && s <= 7 * 86400)) usage("--idle-timeout (ENGRAM_MCP_IDLE_TIMEOUT_S) must be a number of seconds, at most a week");
  return { host, port, allowedOrigins, maxSessions: n, idleTimeoutMs: s * 1000, envKey };
}

async function main(argv: string[]): Promise<void> {
  const httpOpts = parseArgs(argv, process.env);
  const cfg = configFromEnv();
  // A bug must not take the server down with it: report it and carry on.
  process.on("unhandledRejection", (e) => log(`unhandled rejection: ${String(e)}`));
  const engramd = describeEngramd(cfg);

  if (httpOpts === undefined) {
    if (!cfg.apiKey) log("warning: no ENGRAM_API_KEY or ENGRAM_API_KEY_FILE; tenant tools will fail");
    const ctx = createContext(cfg, cfg.apiKey, log);
    const shutdown = () => {
      ctx.link.close();
      process.exit(0);
    };
    process.on("SIGINT", shutdown);
    process.on("SIGTERM", shutdown);
    const server = createEngramMcpServer(ctx);
    const transport = new StdioServerTransport();
    transport.onclose = shutdown;
    process.stdin.on("end", shutdown);
    await server.connect(transport);
    log(`ready on stdio (${engramd})`);
    return;
  }

  if (httpOpts.envKey) {
    if (!cfg.apiKey) throw new Error("--http-env-key needs ENGRAM_API_KEY or ENGRAM_API_KEY_FILE");
    if (!isLoopbackHost(httpOpts.host)) {
      throw new Error(`--http-env-key is for a single user on this machine: it refuses a non-loopback --host (${httpOpts.host})`);
    }
    log("--http-env-key: requests without an Authorization header act with ENGRAM_API_KEY");
  } else if (cfg.apiKey) {
    log("ENGRAM_API_KEY is not used over HTTP: each client sends its own key (--http-env-key to use it)");
  }
  if (cfg.sessionId !== undefined) log("ENGRAM_SESSION_ID is ignored over HTTP: each MCP session starts its own Engram session");
  if (!isLoopbackHost(httpOpts.host)) {
    log(`warning: listening on ${httpOpts.host}, not loopback: anyone who reaches the port may try keys, ` +
      "and keys cross the network in clear text unless a TLS proxy sits in front");
  }
  const web = await startHttpServer(cfg, httpOpts, log);
  const shutdown = () => {
    void web.close().finally(() => process.exit(0));
  };
  process.on("SIGINT", shutdown);
  process.on("SIGTERM", shutdown);
  log(`listening on ${web.url} (${engramd}; at most ${httpOpts.maxSessions} sessions, ` +
    `idle timeout ${httpOpts.idleTimeoutMs / 1000} s)`);
}

main(process.argv.slice(2)).catch((e) => {
  log(String(e instanceof Error ? e.message : e));
  process.exit(1);
});
