// The Engram client for Node: MessagePack-RPC on one TCP (or TLS) connection carrying any
// number of requests in flight (answers matched by msgid, in any order), reconnect with
// backoff and re-authentication, retries that never apply a write twice, typed errors; or,
// for an http(s):// URL, the fetch transport of ./http.ts behind the same methods. Reads
// ENGRAM_URL, ENGRAM_API_KEY(_FILE) and ENGRAM_TLS_* for what the options leave open.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import * as net from "node:net";
import * as tls from "node:tls";

import { Decoder, Encoder } from "@msgpack/msgpack";

import { ApiRoot, type Caller } from "./api.js";
import {
  ClientClosedError,
  ClientError,
  ConnectionLostError,
  EngramError,
  errorFromWire,
  TimeoutError,
  TLSError,
} from "./errors.js";
import { HttpCore } from "./http.js";
import type { CallOptions, Id, RetryPolicy } from "./types.js";
import {
  backoff,
  DEFAULT_RETRY,
  envVar,
  lostMessage,
  normalize,
  parseEngramUrl,
  prepareParams,
  processEnv,
  retryDelay,
  sleep,
  withTimeout,
} from "./wire.js";

/** How a client reaches and talks to engramd. */
export interface ClientOptions {
  /**
   * Where engramd is: `engram://host:port` (MessagePack-RPC over TCP; `tcp://` too),
   * `engrams://host:port` (over TLS 1.3; `tls://` too), or `http(s)://host:port` (HTTP/JSON
   * through fetch). Instead of `host` and `port`; without either, `ENGRAM_URL`, else
   * 127.0.0.1:7420.
   */
  url?: string;
  /** Default "127.0.0.1". */
  host?: string;
  /** Default 7420. */
  port?: number;
  /** A tenant key (`egk_...`) or the admin key; sent with `auth` on every (re)connect.
   * Default: `ENGRAM_API_KEY`, else the first line of the file `ENGRAM_API_KEY_FILE`. */
  apiKey?: string;
  /** Each call's deadline in ms, retries and reconnects included (default 30000). */
  timeoutMs?: number;
  /**
   * One connection attempt's limit in ms (default 1000). A refused or reset attempt is
   * repeated at most `retry.maxRetries` times after the policy's backoff; one that timed
   * out is not, so an unreachable engramd rejects within about a second.
   */
  connectTimeoutMs?: number;
  /** When calls are repeated (see RetryPolicy). */
  retry?: Partial<RetryPolicy>;
  /** Reconnect after a lost connection (default true). */
  reconnect?: boolean;
  /**
   * Identifiers in results as `bigint` (exact to 64 bits) instead of `number`. Ids the
   * server makes fit a number; an agent id past 2^53 does not, and in number mode a result
   * carrying one rejects with a RangeError rather than a wrong id.
   */
  bigint?: boolean;
  /**
   * TLS 1.3 to an engramd serving it. `true` verifies the server's certificate against `ca`
   * (Node's bundled CAs without it) and checks that it names `host` (or `servername`).
   * An object of `node:tls` connection options is laid over those defaults (its
   * `rejectUnauthorized`, `checkServerIdentity`, `minVersion`, ... apply as given).
   * Implied by `ca`, `cert` or `key`. A certificate that does not verify, or a server
   * refusing ours, rejects with TLSError, which is never retried.
   */
  tls?: boolean | tls.ConnectionOptions;
  /** PEM CA certificate(s) to verify the server with, in place of Node's bundled CAs. */
  ca?: string | Buffer | Array<string | Buffer>;
  /** PEM client certificate chain to present (an admin needs one on a server with
   * `tls_admin_require_client_cert`). */
  cert?: string | Buffer | Array<string | Buffer>;
  /** PEM private key of `cert`. */
  key?: string | Buffer | Array<string | Buffer>;
  /** The name the server's certificate must carry, when not `host`. */
  servername?: string;
  /** For http(s) URLs: the fetch to use (default globalThis.fetch). */
  fetch?: typeof fetch;
  /** Where ENGRAM_* variables are read from (default process.env; `{}` reads none). */
  env?: Record<string, string | undefined>;
}

/** The first line of a key file; errors name the variable or option, never the key. */
function readKeyFile(path: string, what: string): string {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`${what}: cannot read ${path}: ${(e as Error).message}`);
  }
  const first = text.split(/\r?\n/, 1)[0]!.trim();
  if (!first) throw new Error(`${what}: ${path} holds no key on its first line`);
  return first;
}

function readPem(path: string, what: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`${what}: cannot read ${path}: ${(e as Error).message}`);
  }
}

/** What the options say after the environment filled the gaps. */
interface Resolved {
  http?: string;
  host: string;
  port: number;
  apiKey: string | undefined;
  tls: tls.ConnectionOptions | undefined;
}

/**
 * The client's settings: explicit options win; `ENGRAM_URL` gives the address when neither
 * `url` nor `host`/`port` is given (with the `ENGRAM_TLS*` variables, when no TLS option is
 * given); `ENGRAM_API_KEY`, else `ENGRAM_API_KEY_FILE`, the key when `apiKey` is not given.
 * Throws TypeError for contradictory options or a bad URL, Error for an unreadable file.
 */
function resolve(o: ClientOptions): Resolved {
  const env = o.env ?? processEnv();
  if (o.url !== undefined && (o.host !== undefined || o.port !== undefined)) {
    throw new TypeError("give url or host/port, not both");
  }
  let url = o.url;
  const fromEnv = url === undefined && o.host === undefined && o.port === undefined && envVar(env, "ENGRAM_URL") !== undefined;
  if (fromEnv) url = envVar(env, "ENGRAM_URL");
  let apiKey = o.apiKey;
  if (apiKey === undefined) {
    apiKey = envVar(env, "ENGRAM_API_KEY")?.trim();
    const file = envVar(env, "ENGRAM_API_KEY_FILE");
    if (apiKey === undefined && file !== undefined) apiKey = readKeyFile(file, "ENGRAM_API_KEY_FILE");
  }
  const t: ClientOptions = { tls: o.tls, ca: o.ca, cert: o.cert, key: o.key, servername: o.servername };
  const tlsGiven = o.tls !== undefined || o.ca !== undefined || o.cert !== undefined || o.key !== undefined;
  if (fromEnv && !tlsGiven) {
    const ca = envVar(env, "ENGRAM_TLS_CA");
    const cert = envVar(env, "ENGRAM_TLS_CERT");
    const key = envVar(env, "ENGRAM_TLS_KEY");
    if (ca !== undefined) t.ca = readPem(ca, "ENGRAM_TLS_CA");
    if (cert !== undefined) t.cert = readPem(cert, "ENGRAM_TLS_CERT");
    if (key !== undefined) t.key = readPem(key, "ENGRAM_TLS_KEY");
    t.servername ??= envVar(env, "ENGRAM_TLS_SERVERNAME");
    const flag = envVar(env, "ENGRAM_TLS");
    if (flag !== undefined && flag !== "0") t.tls = true;
  }
  if (url !== undefined) {
    const ep = parseEngramUrl(url, fromEnv ? "ENGRAM_URL" : "url");
    if (ep.transport === "http") {
      if (t.tls !== undefined || t.ca !== undefined || t.cert !== undefined || t.key !== undefined) {
        throw new TypeError(
          `${fromEnv ? "ENGRAM_URL" : "url"}: TLS options do not apply to http(s) URLs: fetch trusts the runtime's CAs ` +
            "(Node: add yours with NODE_EXTRA_CA_CERTS, or pass a fetch with its own dispatcher)",
        );
      }
      return { http: ep.url, host: "", port: 0, apiKey, tls: undefined };
    }
    if (ep.tls) {
      if (t.tls === false) throw new TypeError("an engrams:// or tls:// URL needs TLS, but tls: false was given");
      t.tls ??= true;
    }
    return { host: ep.host, port: ep.port, apiKey, tls: tlsOptions(t) };
  }
  return { host: o.host ?? "127.0.0.1", port: o.port ?? 7420, apiKey, tls: tlsOptions(t) };
}

/** The node:tls options for a client's settings, or undefined for plain TCP. */
function tlsOptions(o: ClientOptions): tls.ConnectionOptions | undefined {
  const files = o.ca !== undefined || o.cert !== undefined || o.key !== undefined;
  if (o.tls === false) {
    if (files) throw new TypeError("ca, cert or key given with tls: false");
    return undefined;
  }
  if (o.tls === undefined && !files) return undefined;
  if (o.tls !== undefined && o.tls !== true && (o.tls === null || typeof o.tls !== "object")) {
    throw new TypeError("tls must be a boolean or node:tls ConnectionOptions");
  }
  const out: tls.ConnectionOptions = {
    minVersion: "TLSv1.3",
    rejectUnauthorized: true,
    ...(typeof o.tls === "object" ? o.tls : {}),
  };
  if (o.ca !== undefined) out.ca = o.ca;
  if (o.cert !== undefined) out.cert = o.cert;
  if (o.key !== undefined) out.key = o.key;
  if (o.servername !== undefined) out.servername = o.servername;
  if (out.key !== undefined && out.cert === undefined) throw new TypeError("key needs cert");
  return out;
}

/**
 * True for a TLS failure another attempt would meet again: a certificate or name that does
 * not verify, an alert from the server (it refused our certificate), a protocol mismatch.
 * A reset or EOF in the middle of a handshake is not: the server may be restarting.
 */
function isTlsRefusal(e: unknown, s?: tls.TLSSocket): boolean {
  if (s?.authorizationError) return true;
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^ERR_(SSL|TLS|OSSL)_/.test(code);
}

function tlsError(e: unknown, host: string, port: number, s?: tls.TLSSocket): TLSError {
  const msg = e instanceof Error ? e.message : String(e);
  if (s?.authorizationError || (e as { code?: unknown } | null)?.code === "ERR_TLS_CERT_ALTNAME_INVALID") {
    return new TLSError(`TLS with ${host}:${port}: the server's certificate did not verify: ${msg}`);
  }
  const code = String((e as { code?: unknown } | null)?.code ?? "");
  if (/ALERT/.test(code)) {
    // e.g. ERR_SSL_TLSV1_ALERT_UNKNOWN_CA: the server refused our certificate
    const hint = /_CA|CERTIFICATE/.test(code) ? ": it did not accept the client certificate" : "";
    return new TLSError(`TLS with ${host}:${port} failed: the server ended the handshake with ${code.replace(/^ERR_SSL_/, "")}${hint}`);
  }
  return new TLSError(`TLS with ${host}:${port} failed: ${msg}`);
}

const MAX_MSGID = 0xffffffff;

// ---- one connection ------------------------------------------------------------------------

interface Pending {
  method: string;
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
}

class NotSentError extends ConnectionLostError {}
class ConnectFailedError extends ConnectionLostError {}
class ConnectTimeoutError extends Error {}

class Conn {
  readonly pending = new Map<number, Pending>();
  dead = false;
  /** Why the connection died. */
  private error: ClientError | undefined;
  /** An answer came: TLS errors from now on are a lost connection, not a refusal. */
  private answered = false;
  private readonly encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true });

  constructor(
    readonly socket: net.Socket,
    private readonly core: Core,
  ) {
    void this.readLoop();
  }

  /** Writes a request; the promise settles with its answer. Throws NotSentError, or the
   * TLSError the connection died of (a refusal read before this request was written). */
  send(method: string, params: Record<string, unknown>): { msgid: number; done: Promise<unknown> } {
    if (this.dead || this.socket.destroyed) {
      if (this.error instanceof TLSError) throw new TLSError(this.error.message);
      throw new NotSentError("connection closed");
    }
    const msgid = this.core.takeId(this.pending);
    const bytes = this.encoder.encode([0, msgid, method, Object.keys(params).length ? [params] : []]);
    const done = new Promise<unknown>((resolve, reject) => {
      this.pending.set(msgid, { method, resolve, reject });
    });
    done.catch(() => {}); // a caller that gave up (timeout) must not leave it unhandled
    this.socket.write(bytes);
    return { msgid, done };
  }

  private async readLoop(): Promise<void> {
    const bigint = this.core.bigint;
    try {
      for await (const msg of new Decoder({ useBigInt64: true }).decodeStream(this.socket)) {
        if (!Array.isArray(msg) || msg.length !== 4 || msg[0] !== 1) continue;
        this.answered = true;
        const msgid = Number(msg[1]);
        const p = this.pending.get(msgid);
        if (!p) continue;
        this.pending.delete(msgid);
        try {
          if (msg[2] === null || msg[2] === undefined) p.resolve(normalize(msg[3], bigint, p.method));
          else p.reject(errorFromWire(normalize(msg[2], bigint, p.method), p.method));
        } catch (e) {
          p.reject(e); // an id a number cannot hold (RangeError)
        }
      }
      this.fail(new ConnectionLostError("connection closed by the server"));
    } catch (e) {
      if (!this.answered && this.socket instanceof tls.TLSSocket && isTlsRefusal(e)) {
        // TLS 1.3: the server checks our certificate after our side of the handshake is
        // done, so its refusal arrives as an alert on the first read.
        this.fail(tlsError(e, this.core.host, this.core.port));
      } else {
        this.fail(new ConnectionLostError(e instanceof Error ? e.message : String(e)));
      }
    }
  }

  fail(err: ClientError): void {
    if (this.dead) return;
    this.dead = true;
    this.error = err;
    this.core.dropped(this);
    this.socket.destroy();
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) p.reject(err);
  }
}

// ---- the request path -----------------------------------------------------------------------

/** What Client calls: the TCP transport here, or HttpCore (./http.ts). */
export interface Transport extends Caller {
  connect(): Promise<unknown>;
  close(): void;
  describe(): string;
}

class Core implements Transport {
  conn: Conn | undefined;
  private connecting: Promise<Conn> | undefined;
  private nextId = 1 + Math.floor(Math.random() * (1 << 20));
  closed = false;
  apiKey: string | undefined;
  readonly host: string;
  readonly port: number;
  readonly timeoutMs: number;
  readonly connectTimeoutMs: number;
  readonly retry: RetryPolicy;
  readonly reconnect: boolean;
  readonly bigint: boolean;
  readonly tls: tls.ConnectionOptions | undefined;

  constructor(o: ClientOptions, r: Resolved) {
    this.tls = r.tls;
    this.host = r.host;
    this.port = r.port;
    this.apiKey = r.apiKey;
    this.timeoutMs = o.timeoutMs ?? 30_000;
    this.connectTimeoutMs = o.connectTimeoutMs ?? 1_000;
    this.retry = { ...DEFAULT_RETRY, ...o.retry };
    this.reconnect = o.reconnect ?? true;
    this.bigint = o.bigint ?? false;
  }

  describe(): string {
    return `${this.host}:${this.port}${this.tls ? ", tls" : ""}`;
  }

  takeId(inUse: Map<number, Pending>): number {
    for (;;) {
      const id = this.nextId;
      this.nextId = id >= MAX_MSGID ? 1 : id + 1;
      if (!inUse.has(id)) return id;
    }
  }

  dropped(c: Conn): void {
    if (this.conn === c) this.conn = undefined;
  }

  connect(): Promise<Conn> {
    return this.connection(Date.now() + this.timeoutMs, this.retry);
  }

  connection(deadline: number, retry: RetryPolicy): Promise<Conn> {
    if (this.closed) return Promise.reject(new ClientClosedError("client is closed"));
    if (this.conn && !this.conn.dead) return Promise.resolve(this.conn);
    this.connecting ??= this.open(deadline, retry).finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  /** A connected socket (TLS: handshake done). Rejects with TLSError when retrying cannot
   * help, ConnectTimeoutError after timeoutMs. */
  private openSocket(timeoutMs: number): Promise<net.Socket> {
    return new Promise((resolve, reject) => {
      const secure = this.tls !== undefined;
      const s = secure
        ? tls.connect({ ...this.tls, host: this.host, port: this.port })
        : net.connect({ host: this.host, port: this.port });
      const timer = setTimeout(() => {
        s.destroy();
        reject(new ConnectTimeoutError(`no answer within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      s.once(secure ? "secureConnect" : "connect", () => {
        clearTimeout(timer);
        s.removeAllListeners("error");
        s.on("error", () => {}); // surfaced by the read loop
        s.setNoDelay(true);
        resolve(s);
      });
      s.once("error", (e) => {
        clearTimeout(timer);
        s.destroy();
        const t = s instanceof tls.TLSSocket ? s : undefined;
        reject(t && isTlsRefusal(e, t) ? tlsError(e, this.host, this.port, t) : e);
      });
    });
  }

  /**
   * Connects and authenticates. A refused, reset or closed attempt is repeated at most
   * `retry.maxRetries` times after the policy's backoff; one that got no answer within
   * connectTimeoutMs is not (it already waited). Rejects with ConnectFailedError.
   */
  private async open(deadline: number, retry: RetryPolicy): Promise<Conn> {
    const where = `${this.host}:${this.port}`;
    for (let attempt = 1; ; attempt++) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new TimeoutError(`could not connect to ${where} in time`);
      const again = this.reconnect && attempt <= retry.maxRetries;
      let socket: net.Socket;
      try {
        socket = await this.openSocket(Math.min(this.connectTimeoutMs, remaining));
      } catch (e) {
        if (e instanceof TLSError) throw e;
        if (this.closed) throw new ClientClosedError("client is closed");
        if (!again || e instanceof ConnectTimeoutError) {
          throw new ConnectFailedError(`cannot connect to ${where}: ${(e as Error).message}`);
        }
        await sleep(Math.min(backoff(retry, attempt), Math.max(0, remaining)));
        continue;
      }
      const conn = new Conn(socket, this);
      if (this.apiKey !== undefined) {
        try {
          const { done } = conn.send("auth", { api_key: this.apiKey });
          await withTimeout(done, deadline - Date.now(), () => new TimeoutError("auth: no answer in time"));
        } catch (e) {
          conn.fail(new ConnectionLostError("auth failed"));
          if (!(e instanceof ConnectionLostError)) throw e;
          if (!again) throw new ConnectFailedError(`cannot connect to ${where}: the connection was lost during auth`);
          await sleep(Math.min(backoff(retry, attempt), Math.max(0, deadline - Date.now())));
          continue;
        }
      }
      if (this.closed) {
        conn.fail(new ConnectionLostError("client closed"));
        throw new ClientClosedError("client is closed");
      }
      this.conn = conn;
      return conn;
    }
  }

  async call(method: string, params: Record<string, unknown>, options?: CallOptions): Promise<unknown> {
    const p = prepareParams(method, params, "ts-", randomUUID);
    const retry = options?.retry ? { ...this.retry, ...options.retry } : this.retry;
    const deadline = Date.now() + (options?.timeoutMs ?? this.timeoutMs);
    for (let attempt = 1; ; attempt++) {
      let sent = true;
      let err: unknown;
      try {
        const conn = await this.connection(deadline, retry);
        let msgid: number;
        let done: Promise<unknown>;
        try {
          ({ msgid, done } = conn.send(method, p));
        } catch (e) {
          sent = false;
          throw e;
        }
        try {
          const result = await withTimeout(done, deadline - Date.now(), () => new TimeoutError(`${method}: no answer in time`));
          if (method === "auth") this.apiKey = p.api_key as string;
          return result;
        } catch (e) {
          if (e instanceof TimeoutError) conn.pending.delete(msgid);
          throw e;
        }
      } catch (e) {
        if (e instanceof ConnectFailedError || !(e instanceof EngramError || e instanceof ConnectionLostError)) throw e;
        err = e;
      }
      if (method === "auth" && err instanceof EngramError) this.apiKey = undefined;
      let delay: number | null = null;
      if (this.reconnect || !(err instanceof ConnectionLostError)) {
        delay = retryDelay(retry, method, err, attempt, sent);
      }
      if (delay === null || Date.now() + delay >= deadline) {
        if (err instanceof ConnectionLostError) throw lostMessage(err, method, sent);
        throw err;
      }
      await sleep(delay);
    }
  }

  close(): void {
    this.closed = true;
    const c = this.conn;
    this.conn = undefined;
    c?.fail(new ConnectionLostError("client closed"));
  }
}

/**
 * An Engram client for Node. Every server method is a typed method returning a promise:
 * `client.memory.store({...})`, `client.session.checkpoint({...})`,
 * `client.admin.tenant.create({...})`. Concurrent calls share one connection (pipelined).
 * Connects on first use; after a lost connection the next call reconnects with backoff
 * and authenticates again. `memory.store` and `memory.store_batch` carry a generated
 * idempotency key, so a retry never stores twice. With an `http(s)://` URL the same
 * methods go through fetch (see HttpClient). Identifiers in results are numbers, or
 * bigints with `{ bigint: true }` (then the client is a `Client<bigint>`).
 */
class EngramClient<I extends Id = number> extends ApiRoot<I> {
  /** @internal */
  private readonly core: Transport;

  constructor(options: ClientOptions = {}) {
    const r = resolve(options);
    const core = r.http !== undefined
      ? new HttpCore({
        url: r.http, apiKey: r.apiKey, timeoutMs: options.timeoutMs, retry: options.retry,
        bigint: options.bigint, fetch: options.fetch, newUuid: randomUUID,
      })
      : new Core(options, r);
    super(core);
    this.core = core;
  }

  /** Connects (and authenticates) now instead of on the first call; over HTTP, checks the
   * key with one request. */
  async connect(): Promise<this> {
    await this.core.connect();
    return this;
  }

  /** Calls any method by name. */
  call(method: string, params: Record<string, unknown> = {}, options?: CallOptions): Promise<unknown> {
    return this.core.call(method, params, options);
  }

  /** Closes the connection; calls in flight fail with ConnectionLostError. */
  close(): void {
    this.core.close();
  }

  /** Never shows the key. */
  toString(): string {
    return `Client(${this.core.describe()})`;
  }
}

/** The constructor of Client: `new Client({ bigint: true })` is a `Client<bigint>`. */
export interface ClientConstructor {
  new (options: ClientOptions & { bigint: true }): Client<bigint>;
  new (options?: ClientOptions & { bigint?: false }): Client<number>;
  new (options?: ClientOptions): Client<Id>;
  readonly prototype: Client<Id>;
}

/** An Engram client for Node (see the constructor). */
export type Client<I extends Id = number> = EngramClient<I>;
export const Client = EngramClient as ClientConstructor;
