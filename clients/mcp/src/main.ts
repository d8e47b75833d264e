#!/usr/bin/env node
// engram-mcp: the Engram MCP server. Speaks MCP over stdio (the default), or over
// Streamable HTTP with --http PORT (stateless, bound to 127.0.0.1 unless --host says
// otherwise). Configuration: see configFromEnv in server.ts. Logs go to stderr only.
import * as http from "node:http";

import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";

import { configFromEnv, createContext, createEngramMcpServer, VERSION } from "./server.js";

const log = (msg: string) => process.stderr.write(`engram-mcp: ${msg}\n`);

function usage(): never {
  process.stderr.write(
    "usage: engram-mcp [--http PORT [--host HOST]]\n" +
      "env: ENGRAM_HOST ENGRAM_PORT ENGRAM_API_KEY|ENGRAM_API_KEY_FILE ENGRAM_AGENT_ID\n" +
      "     ENGRAM_SESSION_ID ENGRAM_MODEL ENGRAM_TIMEOUT_MS\n" +
      "     ENGRAM_TLS ENGRAM_TLS_CA ENGRAM_TLS_CERT ENGRAM_TLS_KEY ENGRAM_TLS_SERVERNAME\n",
  );
  process.exit(2);
}

async function main(argv: string[]): Promise<void> {
  let httpPort: number | undefined;
  let httpHost = "127.0.0.1";
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--http") httpPort = Number(argv[++i]);
    else if (a === "--host") httpHost = argv[++i] ?? usage();
    else if (a === "--version") {
      process.stdout.write(VERSION + "\n");
      return;
    } else usage();
  }
  if (httpPort !== undefined && !(Number.isInteger(httpPort) && httpPort >= 0 && httpPort < 65536)) usage();

  const cfg = configFromEnv();
  if (!cfg.apiKey) log("warning: no ENGRAM_API_KEY or ENGRAM_API_KEY_FILE; tenant tools will fail");
  const ctx = createContext(cfg);
  const shutdown = () => {
    ctx.client.close();
    process.exit(0);
  };
  process.on("SIGINT", shutdown);
  process.on("SIGTERM", shutdown);
  // A bug must not take the server down with it: report it and carry on.
  process.on("unhandledRejection", (e) => log(`unhandled rejection: ${String(e)}`));

  if (httpPort === undefined) {
    const server = createEngramMcpServer(ctx);
    const transport = new StdioServerTransport();
    transport.onclose = shutdown;
    process.stdin.on("end", shutdown);
    await server.connect(transport);
    log(`ready on stdio (engramd ${cfg.host}:${cfg.port}${cfg.tls ? " over TLS" : ""})`);
    return;
  }

  const web = http.createServer(async (req, res) => {
    if (!req.url || !req.url.startsWith("/mcp")) {
      res.writeHead(404).end();
      return;
    }
    // Stateless: a server and transport per request, sharing the Engram connection.
    const server = createEngramMcpServer(ctx);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on("close", () => {
      void transport.close();
      void server.close();
    });
    try {
      await server.connect(transport);
      await transport.handleRequest(req, res);
    } catch (e) {
      log(`http request failed: ${String(e)}`);
      if (!res.headersSent) res.writeHead(500).end();
    }
  });
  await new Promise<void>((resolve) => web.listen(httpPort, httpHost, resolve));
  const addr = web.address();
  const port = typeof addr === "object" && addr ? addr.port : httpPort;
  log(`listening on http://${httpHost}:${port}/mcp (engramd ${cfg.host}:${cfg.port}${cfg.tls ? " over TLS" : ""})`);
}

main(process.argv.slice(2)).catch((e) => {
  log(String(e instanceof Error ? e.message : e));
  process.exit(1);
});
