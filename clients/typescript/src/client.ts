// The Engram client: one TCP (or TLS) connection carrying any number of requests in
// flight (answers matched by msgid, in any order), reconnect with backoff and
// re-authentication, retries that never apply a write twice, typed errors.
import { randomUUID } from "node:crypto";
import * as net from "node:net";
import { endianness } from "node:os";
import * as tls from "node:tls";

import { Decoder, Encoder } from "@msgpack/msgpack";

import { ApiRoot, type Caller, METHODS } from "./api.js";
import {
  ClientClosedError,
  ClientError,
  ConnectionLostError,
  EngramError,
  errorFromWire,
  RateLimitedError,
  TimeoutError,
  TLSError,
  UnavailableError,
} from "./errors.js";
import type { CallOptions, RetryPolicy } from "./types.js";

/** How a client reaches and talks to engramd. */
export interface ClientOptions {
  /** Default "127.0.0.1". */
  host?: string;
  /** Default 7420. */
  port?: number;
  /** A tenant key (`egk_...`) or the admin key; sent with `auth` on every (re)connect. */
  apiKey?: string;
  /** Each call's deadline in ms, retries and reconnects included (default 30000). */
  timeoutMs?: number;
  /** One connection attempt's limit in ms (default 5000). */
  connectTimeoutMs?: number;
  /** When calls are repeated (see RetryPolicy). */
  retry?: Partial<RetryPolicy>;
  /** Reconnect after a lost connection (default true). */
  reconnect?: boolean;
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

export const DEFAULT_RETRY: RetryPolicy = {
  maxRetries: 4,
  honorRateLimits: true,
  maxRateLimitWaitMs: 10_000,
  backoffBaseMs: 50,
  backoffMaxMs: 2_000,
};

const MAX_MSGID = 0xffffffff;
const LITTLE_ENDIAN = endianness() === "LE";

const WRITE_METHODS = new Set(
  Object.entries(METHODS).filter(([, m]) => m.flags.includes("write")).map(([n]) => n),
);
const IDEMPOTENT_METHODS = new Set(
  [...WRITE_METHODS].filter((n) => METHODS[n]!.params.includes("idempotency_key")),
);

/** True when sending `method` twice cannot apply it twice. */
export function safeToRepeat(method: string): boolean {
  return !WRITE_METHODS.has(method) || IDEMPOTENT_METHODS.has(method);
}

function backoff(p: RetryPolicy, attempt: number): number {
  const d = Math.min(p.backoffMaxMs, p.backoffBaseMs * 2 ** Math.max(0, attempt - 1));
  return d / 2 + (Math.random() * d) / 2;
}

/** Ms to wait before repeating a call that failed with `err` on try `attempt`, or null. */
function retryDelay(p: RetryPolicy, method: string, err: unknown, attempt: number, sent: boolean): number | null {
  if (attempt > p.maxRetries) return null;
  if (err instanceof RateLimitedError) {
    if (!p.honorRateLimits || err.retryAfterMs > p.maxRateLimitWaitMs) return null;
    return Math.max(err.retryAfterMs, 1);
  }
  if (err instanceof UnavailableError || err instanceof ConnectionLostError) {
    if (sent && !safeToRepeat(method)) return null;
    return backoff(p, attempt);
  }
  return null;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

// ---- embeddings --------------------------------------------------------------------------

/** A vector as bytes of little-endian float32; a Float32Array is viewed, not copied. */
export function embeddingBytes(v: unknown): Uint8Array {
  if (v instanceof Uint8Array) return v;
  if (v instanceof Float32Array && LITTLE_ENDIAN) {
    return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  }
  if (Array.isArray(v) || ArrayBuffer.isView(v)) {
    const f = Float32Array.from(v as ArrayLike<number>);
    const dv = new DataView(f.buffer);
    if (!LITTLE_ENDIAN) for (let i = 0; i < f.length; i++) dv.setFloat32(i * 4, f[i]!, true);
    return new Uint8Array(f.buffer);
  }
  throw new TypeError("an embedding must be a Float32Array, a number[] or a Uint8Array");
}

function decodeEmbedding(b: Uint8Array): Float32Array {
  const out = new Float32Array(b.byteLength >>> 2);
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  for (let i = 0; i < out.length; i++) out[i] = dv.getFloat32(i * 4, true);
  return out;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !ArrayBuffer.isView(v) && !Array.isArray(v);
}

/** Drops absent parameters, converts embeddings, adds idempotency keys. */
function prepareParams(method: string, params: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) out[k] = v;
  if (out.embedding !== undefined && !isPlainObject(out.embedding)) {
    out.embedding = embeddingBytes(out.embedding);
  }
  if (method === "memory.store_batch" && Array.isArray(out.memories)) {
    out.memories = out.memories.map((m: unknown) => {
      if (isPlainObject(m) && m.embedding != null && !isPlainObject(m.embedding)) {
        return { ...m, embedding: embeddingBytes(m.embedding) };
      }
      return m;
    });
  }
  if (IDEMPOTENT_METHODS.has(method) && out.idempotency_key === undefined) {
    out.idempotency_key = "ts-" + randomUUID();
  }
  return out;
}

/** bigint -> number where exact; `embedding` bins -> Float32Array. In place. */
function normalize(v: unknown, key?: string): unknown {
  if (typeof v === "bigint") {
    return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  }
  if (v instanceof Uint8Array) return key === "embedding" ? decodeEmbedding(v) : v;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) v[i] = normalize(v[i]);
    return v;
  }
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    for (const k of Object.keys(o)) o[k] = normalize(o[k], k);
  }
  return v;
}

// ---- one connection ------------------------------------------------------------------------

interface Pending {
  method: string;
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
}

class NotSentError extends ConnectionLostError {}
class ConnectFailedError extends ConnectionLostError {}

class Conn {
  readonly pending = new Map<number, Pending>();
  dead = false;
  /** An answer came: TLS errors from now on are a lost connection, not a refusal. */
  private answered = false;
  private readonly encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true });

  constructor(
    readonly socket: net.Socket,
    private readonly core: Core,
  ) {
    void this.readLoop();
  }

  /** Writes a request; the promise settles with its answer. Throws NotSentError. */
  send(method: string, params: Record<string, unknown>): { msgid: number; done: Promise<unknown> } {
    if (this.dead || this.socket.destroyed) throw new NotSentError("connection closed");
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
    try {
      for await (const msg of new Decoder({ useBigInt64: true }).decodeStream(this.socket)) {
        if (!Array.isArray(msg) || msg.length !== 4 || msg[0] !== 1) continue;
        this.answered = true;
        const msgid = Number(msg[1]);
        const p = this.pending.get(msgid);
        if (!p) continue;
        this.pending.delete(msgid);
        if (msg[2] === null || msg[2] === undefined) p.resolve(normalize(msg[3]));
        else p.reject(errorFromWire(normalize(msg[2]), p.method));
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
    this.core.dropped(this);
    this.socket.destroy();
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) p.reject(err);
  }
}

// ---- the request path -----------------------------------------------------------------------

class Core implements Caller {
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
  readonly tls: tls.ConnectionOptions | undefined;

  constructor(o: ClientOptions) {
    this.tls = tlsOptions(o);
    this.host = o.host ?? "127.0.0.1";
    this.port = o.port ?? 7420;
    this.apiKey = o.apiKey;
    this.timeoutMs = o.timeoutMs ?? 30_000;
    this.connectTimeoutMs = o.connectTimeoutMs ?? 5_000;
    this.retry = { ...DEFAULT_RETRY, ...o.retry };
    this.reconnect = o.reconnect ?? true;
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

  connection(deadline: number, retry: RetryPolicy): Promise<Conn> {
    if (this.closed) return Promise.reject(new ClientClosedError("client is closed"));
    if (this.conn && !this.conn.dead) return Promise.resolve(this.conn);
    this.connecting ??= this.connect(deadline, retry).finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  /** A connected socket (TLS: handshake done). Rejects with TLSError when retrying cannot help. */
  private openSocket(timeoutMs: number): Promise<net.Socket> {
    return new Promise((resolve, reject) => {
      const secure = this.tls !== undefined;
      const s = secure
        ? tls.connect({ ...this.tls, host: this.host, port: this.port })
        : net.connect({ host: this.host, port: this.port });
      const timer = setTimeout(() => {
        s.destroy();
        reject(new Error("connect timed out"));
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

  private async connect(deadline: number, retry: RetryPolicy): Promise<Conn> {
    for (let attempt = 1; ; attempt++) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new TimeoutError(`could not connect to ${this.host}:${this.port} in time`);
      let socket: net.Socket;
      try {
        socket = await this.openSocket(Math.min(this.connectTimeoutMs, remaining));
      } catch (e) {
        if (e instanceof TLSError) throw e;
        if (this.closed) throw new ClientClosedError("client is closed");
        if (!this.reconnect || attempt > Math.max(retry.maxRetries, 1) * 4) {
          throw new ConnectFailedError(`cannot connect to ${this.host}:${this.port}: ${(e as Error).message}`);
        }
        await sleep(Math.min(backoff(retry, attempt), Math.max(0, remaining)));
        continue;
      }
      const conn = new Conn(socket, this);
      if (this.apiKey !== undefined) {
        try {
          const { done } = conn.send("auth", { api_key: this.apiKey });
          await withTimeout(done, deadline - Date.now(), "auth");
        } catch (e) {
          conn.fail(new ConnectionLostError("auth failed"));
          if (e instanceof ConnectionLostError) continue;
          throw e;
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
    const p = prepareParams(method, params);
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
          const result = await withTimeout(done, deadline - Date.now(), method);
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
        if (err instanceof ConnectionLostError) {
          const maybe = sent && !safeToRepeat(method);
          throw new ConnectionLostError(
            `${err.message} during ${method}` + (maybe ? "; the write may or may not have been applied" : ""),
            maybe,
          );
        }
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

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  if (ms <= 0) return Promise.reject(new TimeoutError(`${what}: no answer in time`));
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new TimeoutError(`${what}: no answer in time`)), ms);
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
}

/**
 * An Engram client. Every server method is a typed method returning a promise:
 * `client.memory.store({...})`, `client.session.checkpoint({...})`,
 * `client.admin.tenant.create({...})`. Concurrent calls share one connection (pipelined).
 * Connects on first use; after a lost connection the next call reconnects with backoff
 * and authenticates again. `memory.store` and `memory.store_batch` carry a generated
 * idempotency key, so a retry never stores twice.
 */
export class Client extends ApiRoot {
  /** @internal */
  private readonly core: Core;

  constructor(options: ClientOptions = {}) {
    const core = new Core(options);
    super(core);
    this.core = core;
  }

  /** Connects (and authenticates) now instead of on the first call. */
  async connect(): Promise<this> {
    await this.core.connection(Date.now() + this.core.timeoutMs, this.core.retry);
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
    return `Client(${this.core.host}:${this.core.port}${this.core.tls ? ", tls" : ""})`;
  }
}
