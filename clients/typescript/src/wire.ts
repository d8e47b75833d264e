// What both transports share and no runtime lacks: retry policy, embeddings, identifiers,
// JSON with 64-bit integers, base64, Engram URLs and the environment. Nothing here imports
// a Node built-in, so the fetch transport (and the browser entry) can use all of it.
import { METHODS } from "./api.js";
import { ConnectionLostError, RateLimitedError, UnavailableError } from "./errors.js";
import type { RetryPolicy } from "./types.js";

export const DEFAULT_RETRY: RetryPolicy = {
  maxRetries: 4,
  honorRateLimits: true,
  maxRateLimitWaitMs: 10_000,
  backoffBaseMs: 50,
  backoffMaxMs: 2_000,
};

const WRITE_METHODS = new Set(
  Object.entries(METHODS).filter(([, m]) => m.flags.includes("write")).map(([n]) => n),
);
export const IDEMPOTENT_METHODS = new Set(
  [...WRITE_METHODS].filter((n) => METHODS[n]!.params.includes("idempotency_key")),
);

/** True when sending `method` twice cannot apply it twice. */
export function safeToRepeat(method: string): boolean {
  return !WRITE_METHODS.has(method) || IDEMPOTENT_METHODS.has(method);
}

/** The delay before reconnect or retry number `attempt` (1-based), in ms, jittered. */
export function backoff(p: RetryPolicy, attempt: number): number {
  const d = Math.min(p.backoffMaxMs, p.backoffBaseMs * 2 ** Math.max(0, attempt - 1));
  return d / 2 + (Math.random() * d) / 2;
}

/** Ms to wait before repeating a call that failed with `err` on try `attempt`, or null. */
export function retryDelay(p: RetryPolicy, method: string, err: unknown, attempt: number, sent: boolean): number | null {
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

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Settles as p does, or rejects with `timeout()` after ms. */
export function withTimeout<T>(p: Promise<T>, ms: number, timeout: () => Error): Promise<T> {
  if (ms <= 0) return Promise.reject(timeout());
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(timeout()), ms);
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

/** The final message of a lost connection: says when a write may have been applied. */
export function lostMessage(err: ConnectionLostError, method: string, sent: boolean): ConnectionLostError {
  const maybe = sent && !safeToRepeat(method);
  return new ConnectionLostError(
    `${err.message} during ${method}` + (maybe ? "; the write may or may not have been applied" : ""),
    maybe,
  );
}

// ---- idempotency keys -----------------------------------------------------------------------

/** A random UUID (v4) from the platform's CSPRNG; crypto.randomUUID needs a secure
 * context in browsers, getRandomValues does not. */
export function randomUuid(): string {
  const c = (globalThis as { crypto?: { getRandomValues?<T extends Uint8Array>(a: T): T } }).crypto;
  if (c === undefined || typeof c.getRandomValues !== "function") {
    throw new Error("no crypto.getRandomValues in this runtime: pass idempotency_key yourself");
  }
  const b = c.getRandomValues(new Uint8Array(16));
  b[6] = (b[6]! & 0x0f) | 0x40;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const h = Array.from(b, (x: number) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

// ---- embeddings ------------------------------------------------------------------------------

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

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

/** Little-endian float32 bytes as a Float32Array (a copy). */
export function decodeEmbedding(b: Uint8Array): Float32Array {
  const out = new Float32Array(b.byteLength >>> 2);
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  for (let i = 0; i < out.length; i++) out[i] = dv.getFloat32(i * 4, true);
  return out;
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !ArrayBuffer.isView(v) && !Array.isArray(v);
}

/** Drops absent parameters, converts embeddings to bytes, adds idempotency keys (`prefix`
 * and a UUID). */
export function prepareParams(
  method: string,
  params: Record<string, unknown>,
  prefix: string,
  newUuid: () => string = randomUuid,
): Record<string, unknown> {
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
    out.idempotency_key = prefix + newUuid();
  }
  return out;
}

// ---- identifiers -----------------------------------------------------------------------------

/** Result fields holding one identifier besides `id` and `*_id`. */
const ID_FIELDS = new Set(["superseded_by", "merged_into", "superseded", "supersedes", "resumed_from"]);
/** Result fields holding a list of identifiers besides `ids` and `*_ids`. */
const ID_LIST_FIELDS = new Set([
  "deleted", "archived", "restored", "unknown", "missing", "notes_added", "notes_removed", "children_missing",
]);
/** Maps of the caller's own values, left as they came (a user's `attrs.user_id` is theirs). */
const OPAQUE_FIELDS = new Set(["metadata", "config", "config_override", "data", "attrs", "simulation"]);

const isIdField = (k: string) => k === "id" || k.endsWith("_id") || ID_FIELDS.has(k);
const isIdListField = (k: string) => k === "ids" || k.endsWith("_ids") || ID_LIST_FIELDS.has(k);

function asId(v: unknown, bigint: boolean, where: string): unknown {
  if (bigint) {
    return typeof v === "number" && Number.isInteger(v) ? BigInt(v) : v;
  }
  if (typeof v === "bigint") {
    if (v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER)) return Number(v);
    throw new RangeError(
      `${where} ${v} is past Number.MAX_SAFE_INTEGER: construct the client with { bigint: true } for exact 64-bit ids`,
    );
  }
  return v;
}

function smallBigint(v: unknown): unknown {
  return typeof v === "bigint" && v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER)
    ? Number(v)
    : v;
}

/**
 * A decoded result made ready for the caller, in place: identifiers become `number` (a
 * RangeError for one past 2^53, which a number cannot hold exactly) or, with `bigint`,
 * always `bigint`; other integers are numbers where exact (bigint past 2^53);
 * `embedding` fields (bytes, or base64 from JSON) become Float32Array.
 */
export function normalize(v: unknown, bigint: boolean, method: string, key = "", opaque = false): unknown {
  if (typeof v === "bigint" || typeof v === "number") {
    if (!opaque && key !== "" && isIdField(key)) return asId(v, bigint, `${method}: ${key}`);
    return smallBigint(v);
  }
  if (key === "embedding" && !opaque) {
    if (v instanceof Uint8Array) return decodeEmbedding(v);
    if (typeof v === "string") return decodeEmbedding(base64Decode(v));
    if (Array.isArray(v)) return Float32Array.from(v as number[]);
  }
  if (Array.isArray(v)) {
    const ids = !opaque && isIdListField(key);
    for (let i = 0; i < v.length; i++) {
      v[i] = ids && (typeof v[i] === "number" || typeof v[i] === "bigint")
        ? asId(v[i], bigint, `${method}: ${key}[${i}]`)
        : normalize(v[i], bigint, method, "", opaque);
    }
    return v;
  }
  if (v !== null && typeof v === "object" && !ArrayBuffer.isView(v)) {
    const o = v as Record<string, unknown>;
    for (const k of Object.keys(o)) o[k] = normalize(o[k], bigint, method, k, opaque || OPAQUE_FIELDS.has(k));
  }
  return v;
}

// ---- base64 and JSON -------------------------------------------------------------------------

const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64_INDEX = new Int16Array(128).fill(-1);
for (let i = 0; i < B64.length; i++) B64_INDEX[B64.charCodeAt(i)] = i;

/** RFC 4648 base64, padded. */
export function base64Encode(b: Uint8Array): string {
  let out = "";
  let i = 0;
  for (; i + 2 < b.length; i += 3) {
    const n = (b[i]! << 16) | (b[i + 1]! << 8) | b[i + 2]!;
    out += B64[n >> 18]! + B64[(n >> 12) & 63]! + B64[(n >> 6) & 63]! + B64[n & 63]!;
  }
  if (i < b.length) {
    const n = (b[i]! << 16) | ((b[i + 1] ?? 0) << 8);
    out += B64[n >> 18]! + B64[(n >> 12) & 63]! + (i + 1 < b.length ? B64[(n >> 6) & 63]! : "=") + "=";
  }
  return out;
}

/** Decodes RFC 4648 base64 (padding optional). Throws TypeError on other characters. */
export function base64Decode(s: string): Uint8Array {
  const clean = s.replace(/=+$/, "");
  const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let acc = 0;
  let bits = 0;
  let j = 0;
  for (let i = 0; i < clean.length; i++) {
    const c = clean.charCodeAt(i);
    const d = c < 128 ? B64_INDEX[c]! : -1;
    if (d < 0) throw new TypeError("not base64");
    acc = (acc << 6) | d;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[j++] = (acc >> bits) & 0xff;
    }
  }
  return out.subarray(0, j);
}

const NONCE = randomHex();
function randomHex(): string {
  return Math.random().toString(16).slice(2) + Date.now().toString(16);
}

/** JSON text of a request body: bigints as exact integers, Uint8Arrays (embeddings) as base64. */
export function toJson(v: unknown): string {
  let big = false;
  const text = JSON.stringify(v, (_k, x: unknown) => {
    if (typeof x === "bigint") {
      big = true;
      return `${NONCE}:${x.toString()}`;
    }
    if (x instanceof Uint8Array) return base64Encode(x);
    return x;
  });
  return big ? text.replace(new RegExp(`"${NONCE}:(-?\\d+)"`, "g"), "$1") : text;
}

/**
 * JSON.parse, except that integers past 2^53 come back as exact bigints (JSON.parse would
 * round them). Integers that fit stay numbers.
 */
export function fromJson(text: string): unknown {
  if (!/\d{16}/.test(text)) return JSON.parse(text);
  // Quote every long integer literal outside strings with a marker, then revive it.
  let out = "";
  let last = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92) i++; // backslash: skip the escaped character
      else if (c === 34) inString = false;
      continue;
    }
    if (c === 34) {
      inString = true;
      continue;
    }
    if ((c >= 48 && c <= 57) || c === 45) {
      // a whole number token: digits, sign, and . e E for the ones that are not integers
      let j = i + 1;
      let integer = true;
      for (; j < text.length; j++) {
        const d = text.charCodeAt(j);
        if (d === 46 || d === 101 || d === 69 || d === 43 || d === 45) integer = false;
        else if (d < 48 || d > 57) break;
      }
      if (integer && j - i - (c === 45 ? 1 : 0) >= 16) {
        out += text.slice(last, i) + `"${NONCE}:${text.slice(i, j)}"`;
        last = j;
      }
      i = j - 1;
    }
  }
  out += text.slice(last);
  const prefix = NONCE + ":";
  return JSON.parse(out, (_k, x: unknown) => {
    if (typeof x === "string" && x.startsWith(prefix)) {
      const n = BigInt(x.slice(prefix.length));
      return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n;
    }
    return x;
  });
}

// ---- Engram URLs and the environment ------------------------------------------------------------

/** A parsed Engram URL. */
export type Endpoint =
  | { transport: "rpc"; host: string; port: number; tls: boolean }
  | { transport: "http"; url: string };

const RPC_SCHEMES: Record<string, boolean> = { "engram:": false, "tcp:": false, "engrams:": true, "tls:": true };

/**
 * Parses an Engram URL: `engram://host:port` or `tcp://host:port` (MessagePack-RPC, port
 * 7420 by default), `engrams://` or `tls://` (the same over TLS 1.3), `http(s)://host:port`
 * (HTTP/JSON; a path is kept as a prefix, for engramd behind a proxy). `host:port` alone
 * is `engram://host:port`. Relative http URLs resolve against `base` (a page's location).
 * Throws TypeError naming `what`; the message never repeats the URL (it could hold a
 * secret).
 */
export function parseEngramUrl(text: string, what = "url", base?: string): Endpoint {
  let s = text.trim();
  const relative = s.startsWith("/");
  if (!relative && !/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(s)) s = "engram://" + s;
  let u: URL;
  try {
    u = relative ? new URL(s, base) : new URL(s);
  } catch {
    throw new TypeError(`${what}: not a valid URL${relative && !base ? " (a relative URL needs a page to resolve against)" : ""}`);
  }
  if (u.username || u.password) {
    throw new TypeError(`${what}: a URL may not carry credentials; give the key with apiKey or ENGRAM_API_KEY(_FILE)`);
  }
  if (u.search || u.hash) throw new TypeError(`${what}: an Engram URL has no query or fragment`);
  if (u.protocol === "http:" || u.protocol === "https:") {
    return { transport: "http", url: u.origin + u.pathname.replace(/\/+$/, "") };
  }
  const tls = RPC_SCHEMES[u.protocol];
  if (tls === undefined) {
    throw new TypeError(`${what}: unknown scheme '${u.protocol.replace(/:$/, "")}'; use engram://, engrams://, tcp://, tls://, http:// or https://`);
  }
  if (u.pathname !== "" && u.pathname !== "/") throw new TypeError(`${what}: an engram:// URL has no path`);
  if (!u.hostname) throw new TypeError(`${what}: no host`);
  const host = u.hostname.replace(/^\[(.*)\]$/, "$1");
  return { transport: "rpc", host, port: u.port ? Number(u.port) : 7420, tls };
}

/** The process environment where the runtime has one (Node, Bun, Deno's Node layer), else {}. */
export function processEnv(): Record<string, string | undefined> {
  try {
    const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
    return p?.env ?? {};
  } catch {
    return {}; // Deno without --allow-env throws on access
  }
}

/** A variable, or undefined when unset or empty. */
export function envVar(env: Record<string, string | undefined>, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v === "" ? undefined : v;
}
