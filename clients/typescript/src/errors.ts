// Errors: one class per server error code (docs/protocol.md, "Errors"), plus the
// client's own failures (a lost connection, a timeout, a closed client).

/** An error answered by the server. `code` is the stable error code. */
export class EngramError extends Error {
  readonly code: string;
  /** The error map's other fields (`limit`, `usage`, `retry_after_ms`, ...). */
  readonly data: Record<string, unknown>;
  /** The method that failed. */
  readonly method: string | undefined;
  /** The server's message, without the code. */
  readonly serverMessage: string;

  constructor(code: string, message: string, data: Record<string, unknown> = {}, method?: string) {
    super(`${code}: ${message}${method ? ` (${method})` : ""}`);
    this.name = new.target.name;
    this.code = code;
    this.data = data;
    this.method = method;
    this.serverMessage = message;
  }
}

function num(v: unknown): number | undefined {
  return typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : undefined;
}

/**
 * A parameter is missing, of the wrong type, out of range or unknown. `field` names it: the
 * server's `field` when it sends one, else the parameter its message quotes (`parameter
 * 'top_k' must be ...`, `unknown parameter 'x'`, `missing required parameter 'x'`; a path
 * such as `memories[3].importance` inside a batch), else undefined.
 */
export class InvalidArgumentError extends EngramError {
  get field(): string | undefined {
    const f = this.data.field;
    return typeof f === "string" && f !== "" ? f : fieldFromMessage(this.serverMessage);
  }
}

// A batch item's errors open with its path ("memories[3]: parameter 'importance' ...").
const PREFIX = /^([A-Za-z_]\w*(?:\[\d+\])?(?:\.\w+(?:\[\d+\])?)*): /;
// The first quoted name after "parameter", "parameters" or "field", or opening the message.
const QUOTED = /(?:\b(?:parameters?|field)\s+|^)'([^']+)'/;

/** The parameter an invalid_argument message names (`memories[3].importance` for a batch
 * item's), or undefined. */
export function fieldFromMessage(message: string): string | undefined {
  let prefix = "";
  const m = PREFIX.exec(message);
  if (m) {
    prefix = m[1]!;
    message = message.slice(m[0].length);
  }
  const q = QUOTED.exec(message);
  if (!q) return undefined;
  let name = q[1]!;
  if (prefix && name !== prefix && !name.startsWith(prefix + ".") && !name.startsWith(prefix + "[")) {
    name = `${prefix}.${name}`;
  }
  return name;
}
export class MalformedRequestError extends EngramError {}
export class UnknownMethodError extends EngramError {}
export class UnauthenticatedError extends EngramError {}
export class PermissionDeniedError extends EngramError {}
export class NotFoundError extends EngramError {}
export class AlreadyExistsError extends EngramError {}
export class ConflictError extends EngramError {}
/** A tier limit was reached. */
export class QuotaExceededError extends EngramError {
  get limit(): number | undefined { return num(this.data.limit); }
  get usage(): number | undefined { return num(this.data.usage); }
  get requested(): number | undefined { return num(this.data.requested); }
  get resetsAt(): number | undefined { return num(this.data.resets_at); }
}
/** Too many requests; the call had no effect. */
export class RateLimitedError extends EngramError {
  get retryAfterMs(): number { return num(this.data.retry_after_ms) ?? 0; }
}
/** A session's cost cap would be passed; nothing was stored. */
export class CostLimitExceededError extends EngramError {
  get limit(): number | undefined { return num(this.data.limit); }
  get usage(): number | undefined { return num(this.data.usage); }
  get cost(): number | undefined { return num(this.data.cost); }
}
export class UnavailableError extends EngramError {}
export class InternalError extends EngramError {}
/** The answer would pass the server's max_result_bytes (`limit`; `size` is the answer's): ask for less. */
export class ResultTooLargeError extends EngramError {
  get limit(): number | undefined { return num(this.data.limit); }
  get size(): number | undefined { return num(this.data.size); }
}

/** Error code -> class. */
export const ERROR_CLASSES: Readonly<Record<string, new (code: string, message: string, data?: Record<string, unknown>, method?: string) => EngramError>> = {
  invalid_argument: InvalidArgumentError,
  malformed_request: MalformedRequestError,
  unknown_method: UnknownMethodError,
  unauthenticated: UnauthenticatedError,
  permission_denied: PermissionDeniedError,
  not_found: NotFoundError,
  already_exists: AlreadyExistsError,
  conflict: ConflictError,
  quota_exceeded: QuotaExceededError,
  rate_limited: RateLimitedError,
  cost_limit_exceeded: CostLimitExceededError,
  unavailable: UnavailableError,
  internal: InternalError,
  result_too_large: ResultTooLargeError,
};

/** The error for a response's error field (a map `{code, message, ...}`). */
export function errorFromWire(err: unknown, method?: string): EngramError {
  if (err === null || typeof err !== "object") {
    return new InternalError("internal", String(err), {}, method);
  }
  const { code, message, ...data } = err as Record<string, unknown>;
  const c = typeof code === "string" ? code : "internal";
  const Cls = ERROR_CLASSES[c] ?? EngramError;
  return new Cls(c, typeof message === "string" ? message : "", data, method);
}

/** A failure on the client's side of the connection. */
export class ClientError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/**
 * The connection broke before the answer came. `maybeCommitted` is true when the request
 * had been sent and is a write that cannot be safely repeated: it may or may not have
 * taken effect.
 */
export class ConnectionLostError extends ClientError {
  readonly maybeCommitted: boolean;
  constructor(message: string, maybeCommitted = false) {
    super(message);
    this.maybeCommitted = maybeCommitted;
  }
}

/**
 * TLS with the server failed in a way another attempt would meet again, so the call is not
 * retried: the server's certificate did not verify against the CA (or Node's bundled CAs),
 * it does not name the host, the server refused the client's certificate, or the port
 * does not speak TLS 1.3. The message says which.
 */
export class TLSError extends ClientError {}

/** No answer within the call's timeout (retries included). */
export class TimeoutError extends ClientError {}

/** The client was closed. */
export class ClientClosedError extends ClientError {}
