// The fetch transport: every method as `POST /v1/rpc/{method}` with a JSON body and the key
// as a bearer token (docs/protocol.md, "HTTP/JSON"). It uses fetch, AbortController,
// setTimeout and crypto.getRandomValues only, and imports no Node built-in (nor
// @msgpack/msgpack), so it runs in browsers, Deno, Bun, edge runtimes and Node 18+.
import { ApiRoot, type Caller } from "./api.js";
import {
  ClientClosedError,
  ConnectionLostError,
  EngramError,
  errorFromWire,
  PermissionDeniedError,
  TimeoutError,
} from "./errors.js";
import type { AuthResult, CallOptions, Id, RetryPolicy } from "./types.js";
import {
  DEFAULT_RETRY,
  envVar,
  fromJson,
  lostMessage,
  normalize,
  parseEngramUrl,
  prepareParams,
  processEnv,
  randomUuid,
  retryDelay,
  sleep,
  toJson,
} from "./wire.js";

/** How an HttpClient reaches engramd's HTTP port. */
export interface HttpClientOptions {
  /**
   * The HTTP port's URL: `http://127.0.0.1:7421`, `https://engram.example.com`, or a path
   * on the page's own origin (`/`, `/engram`) in a browser. Default: `ENGRAM_URL` where the
   * runtime has a process environment (it must then be an http(s) URL), else the page's
   * origin in a browser, else `http://127.0.0.1:7421`.
   */
  url?: string;
  /** A tenant key or the admin key, sent as a bearer token. Default: `ENGRAM_API_KEY`
   * where the runtime has a process environment. */
  apiKey?: string;
  /** Each call's deadline in ms, retries included (default 30000). */
  timeoutMs?: number;
  /** When calls are repeated (see RetryPolicy). */
  retry?: Partial<RetryPolicy>;
  /** Identifiers in results as `bigint` instead of `number` (see ClientOptions.bigint). */
  bigint?: boolean;
  /** The fetch to use (default globalThis.fetch): a proxy's, one with a custom agent, ... */
  fetch?: typeof fetch;
  /** Where ENGRAM_* variables are read from (default the process environment, if any;
   * `{}` reads none). */
  env?: Record<string, string | undefined>;
}

/** @internal What HttpCore needs; the Node Client fills it from its own options. */
export interface HttpCoreOptions {
  url: string;
  apiKey: string | undefined;
  timeoutMs?: number | undefined;
  retry?: Partial<RetryPolicy> | undefined;
  bigint?: boolean | undefined;
  fetch?: typeof fetch | undefined;
  newUuid?: () => string;
}

/** The error for a status whose body is not an Engram error (a proxy's page, say). */
const STATUS_CODES: Record<number, string> = {
  400: "invalid_argument", 401: "unauthenticated", 402: "cost_limit_exceeded", 403: "permission_denied",
  404: "not_found", 408: "unavailable", 409: "conflict", 411: "invalid_argument", 413: "invalid_argument",
  429: "rate_limited", 431: "invalid_argument", 500: "internal", 502: "unavailable", 503: "unavailable",
  504: "unavailable",
};

/** True when a fetch failure says that nothing was sent: the connection was refused. */
function refused(e: unknown): boolean {
  for (let x: unknown = e, depth = 0; x !== null && typeof x === "object" && depth < 4; depth++) {
    const code = (x as { code?: unknown }).code;
    if (code === "ECONNREFUSED" || code === "ConnectionRefused") return true;
    const inner = (x as { errors?: unknown[] }).errors; // happy eyeballs: one per address
    if (Array.isArray(inner) && inner.length > 0 && inner.every((i) => refused(i))) return true;
    x = (x as { cause?: unknown }).cause;
  }
  return false;
}

function why(e: unknown): string {
  const parts: string[] = [];
  for (let x: unknown = e, depth = 0; x !== null && x !== undefined && depth < 4; depth++) {
    const m = x instanceof Error ? x.message : String(x);
    if (m && !parts.includes(m)) parts.push(m);
    x = x instanceof Error ? (x as { cause?: unknown }).cause : undefined;
  }
  return parts.join(": ");
}

/** The HTTP/JSON request path shared by HttpClient and the Node Client's http(s) URLs. */
export class HttpCore implements Caller {
  private readonly base: string;
  private apiKey: string | undefined;
  private readonly timeoutMs: number;
  private readonly retry: RetryPolicy;
  private readonly fetchFn: typeof fetch;
  private readonly newUuid: () => string;
  readonly bigint: boolean;
  private closed = false;
  private readonly inFlight = new Set<AbortController>();

  constructor(o: HttpCoreOptions) {
    this.base = o.url.replace(/\/+$/, "");
    this.apiKey = o.apiKey;
    this.timeoutMs = o.timeoutMs ?? 30_000;
    this.retry = { ...DEFAULT_RETRY, ...o.retry };
    this.bigint = o.bigint ?? false;
    const f = o.fetch ?? (globalThis as { fetch?: typeof fetch }).fetch;
    if (typeof f !== "function") throw new TypeError("this runtime has no fetch: pass one as the fetch option");
    this.fetchFn = o.fetch ?? f.bind(globalThis);
    this.newUuid = o.newUuid ?? randomUuid;
  }

  describe(): string {
    return this.base;
  }

  /** Checks the key with one request (`tenant.usage`, or for the admin key an admin method). */
  async connect(): Promise<unknown> {
    return this.apiKey === undefined ? this.call("ping", {}) : this.auth(this.apiKey, undefined, false);
  }

  close(): void {
    this.closed = true;
    for (const c of this.inFlight) c.abort();
    this.inFlight.clear();
  }

  async call(method: string, params: Record<string, unknown>, options?: CallOptions): Promise<unknown> {
    if (method === "auth") {
      const key = params.api_key;
      if (typeof key !== "string") throw errorFromWire({ code: "unauthenticated", message: "invalid API key" }, "auth");
      return this.auth(key, options, true);
    }
    return this.request(method, prepareParams(method, params, "ts-", this.newUuid), options, this.apiKey);
  }

  /**
   * `auth` is not served over HTTP (each request carries its key): this checks the key the
   * way the answer says who it is, with `tenant.usage` (`{tenant_id, tier}`), or for the
   * admin key with `admin.tenant.list` (`{admin: true}`). On success later calls use the
   * key; on failure none, as after a failed `auth` on a connection.
   */
  private async auth(key: string, options: CallOptions | undefined, keep: boolean): Promise<AuthResult<Id>> {
    try {
      let out: AuthResult<Id>;
      try {
        const u = (await this.request("tenant.usage", {}, options, key)) as { tenant_id: Id; tier: AuthResult["tier"] };
        out = { tenant_id: u.tenant_id, tier: u.tier };
      } catch (e) {
        if (!(e instanceof PermissionDeniedError)) throw e;
        await this.request("admin.tenant.list", { limit: 1 }, options, key);
        out = { admin: true };
      }
      if (keep) this.apiKey = key;
      return out;
    } catch (e) {
      if (keep && e instanceof EngramError) this.apiKey = undefined;
      throw e;
    }
  }

  private async request(method: string, params: Record<string, unknown>, options: CallOptions | undefined,
    key: string | undefined): Promise<unknown> {
    const retry = options?.retry ? { ...this.retry, ...options.retry } : this.retry;
    const deadline = Date.now() + (options?.timeoutMs ?? this.timeoutMs);
    const url = `${this.base}/v1/rpc/${method}`;
    const headers: Record<string, string> = { "Content-Type": "application/json", Accept: "application/json" };
    if (key !== undefined) headers.Authorization = `Bearer ${key}`;
    const body = toJson(params);
    for (let attempt = 1; ; attempt++) {
      if (this.closed) throw new ClientClosedError("client is closed");
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new TimeoutError(`${method}: no answer in time`);
      let sent = true;
      let err: unknown;
      const ctrl = new AbortController();
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        ctrl.abort();
      }, remaining);
      this.inFlight.add(ctrl);
      try {
        let res: Response;
        let text: string;
        try {
          res = await this.fetchFn(url, { method: "POST", headers, body, signal: ctrl.signal });
          text = await res.text();
        } catch (e) {
          if (timedOut) throw new TimeoutError(`${method}: no answer in time`);
          if (this.closed) throw new ClientClosedError("client is closed");
          sent = !refused(e);
          throw new ConnectionLostError(`cannot reach ${this.base}: ${why(e)}`);
        }
        if (res.ok) return normalize(fromJson(text), this.bigint, method);
        throw this.httpError(res, text, method);
      } catch (e) {
        if (!(e instanceof EngramError || e instanceof ConnectionLostError)) throw e;
        err = e;
      } finally {
        clearTimeout(timer);
        this.inFlight.delete(ctrl);
      }
      const delay = retryDelay(retry, method, err, attempt, sent);
      if (delay === null || Date.now() + delay >= deadline) {
        if (err instanceof ConnectionLostError) throw lostMessage(err, method, sent);
        throw err;
      }
      await sleep(delay);
    }
  }

  /** The error class of the JSON body's `error.code`; `Retry-After` fills `retry_after_ms`
   * when the body has none; a body that is not an Engram error maps by status. */
  private httpError(res: Response, text: string, method: string): EngramError {
    let map: Record<string, unknown> | undefined;
    try {
      const body = fromJson(text) as { error?: unknown } | null;
      if (body !== null && typeof body === "object" && body.error !== null && typeof body.error === "object") {
        map = normalize(body.error, this.bigint, method) as Record<string, unknown>;
      }
    } catch {
      // not JSON: a proxy's page
    }
    if (map === undefined || typeof map.code !== "string") {
      const code = STATUS_CODES[res.status] ?? (res.status >= 500 ? "unavailable" : "internal");
      map = { code, message: `HTTP ${res.status}${res.statusText ? " " + res.statusText : ""}` };
    }
    const after = res.headers.get("Retry-After");
    if (map.retry_after_ms === undefined && after !== null && /^\d+$/.test(after.trim())) {
      map.retry_after_ms = Number(after.trim()) * 1000;
    }
    return errorFromWire(map, method);
  }
}

/** The default URL of an HttpClient without one. */
function defaultUrl(env: Record<string, string | undefined>): { url: string; what: string } {
  const fromEnv = envVar(env, "ENGRAM_URL");
  if (fromEnv !== undefined) return { url: fromEnv, what: "ENGRAM_URL" };
  const loc = (globalThis as { location?: { origin?: string } }).location;
  if (loc?.origin && /^https?:/.test(loc.origin)) return { url: loc.origin, what: "the page's origin" };
  return { url: "http://127.0.0.1:7421", what: "url" };
}

/**
 * An Engram client over HTTP/JSON, with the methods of the Node Client:
 * `client.memory.store({...})`, ... Uses only fetch, so it runs wherever fetch does.
 * Requests go out in parallel (the runtime pools connections); each carries the key.
 * Timeouts, retries (rate limits after `Retry-After`; reads and the idempotent stores
 * after a lost connection or `unavailable`), idempotency keys and error classes are those
 * of the Node Client. Embeddings are sent as base64 of little-endian float32 and come
 * back as Float32Array. `new HttpClient({ bigint: true })` is an `HttpClient<bigint>`.
 */
class EngramHttpClient<I extends Id = number> extends ApiRoot<I> {
  /** @internal */
  private readonly core: HttpCore;

  constructor(options: HttpClientOptions = {}) {
    const env = options.env ?? processEnv();
    const given = options.url !== undefined ? { url: options.url, what: "url" } : defaultUrl(env);
    const loc = (globalThis as { location?: { href?: string } }).location;
    const ep = parseEngramUrl(given.url, given.what, loc?.href);
    if (ep.transport !== "http") {
      throw new TypeError(`${given.what}: HttpClient needs an http(s):// URL; engram:// is MessagePack-RPC, which the Node Client speaks`);
    }
    const core = new HttpCore({
      url: ep.url, apiKey: options.apiKey ?? envVar(env, "ENGRAM_API_KEY")?.trim(), timeoutMs: options.timeoutMs,
      retry: options.retry, bigint: options.bigint, fetch: options.fetch,
    });
    super(core);
    this.core = core;
  }

  /** Checks the key now (one request) instead of on the first call. */
  async connect(): Promise<this> {
    await this.core.connect();
    return this;
  }

  /** Calls any method by name. */
  call(method: string, params: Record<string, unknown> = {}, options?: CallOptions): Promise<unknown> {
    return this.core.call(method, params, options);
  }

  /** Aborts the calls in flight (they reject with ClientClosedError); later calls reject too. */
  close(): void {
    this.core.close();
  }

  /** Never shows the key. */
  toString(): string {
    return `HttpClient(${this.core.describe()})`;
  }
}

/** The constructor of HttpClient: `new HttpClient({ bigint: true })` is an `HttpClient<bigint>`. */
export interface HttpClientConstructor {
  new (options: HttpClientOptions & { bigint: true }): HttpClient<bigint>;
  new (options?: HttpClientOptions & { bigint?: false }): HttpClient<number>;
  new (options?: HttpClientOptions): HttpClient<Id>;
  readonly prototype: HttpClient<Id>;
}

/** An Engram client over HTTP/JSON (see the constructor). */
export type HttpClient<I extends Id = number> = EngramHttpClient<I>;
export const HttpClient = EngramHttpClient as HttpClientConstructor;
