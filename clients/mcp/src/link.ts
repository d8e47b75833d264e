// The connection to engramd as the tools see it: calls that fail fast while engramd cannot be
// reached, and a reconnect in the background. An unreachable engramd (down, refusing, not
// answering, a network that drops packets) costs a tool call about a second or two, never
// ENGRAM_TIMEOUT_MS: a refused or unanswered connect fails within the client's connect
// timeout (1 s); a call that has had no answer for PROBE_AFTER_MS is checked with a ping on
// the same client, and one that the ping finds dead is failed at once while the client is
// replaced. While engramd is away, calls fail without waiting (or after one reconnect
// attempt of at most about a second, when none was made in the last second) and a loop
// retries with backoff; the first answer brings the link back.
import { ClientClosedError, ConnectionLostError, EngramError, TimeoutError, TLSError, type Client } from "@engram/client";

/** How long a call may go without an answer before engramd is pinged. */
export const PROBE_AFTER_MS = 1000;
/** How long that ping, and a reconnect attempt, may take. */
export const PROBE_TIMEOUT_MS = 1000;
const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 5000;

/** engramd could not be reached; the message says since when and that a reconnect runs. */
export class UnreachableError extends Error {}

/**
 * A JSON-RPC error for resources and prompts. The SDK sends a handler's error as its code,
 * message and data; its McpError puts "MCP error CODE:" into the message, which the client's
 * McpError then prefixes again, so this one keeps the message as written.
 */
export class ProtocolError extends Error {
  constructor(readonly code: number, message: string, readonly data?: unknown) {
    super(message);
  }
}

/**
 * A ping of c that gives up after ms whatever the client does: a call's own timeoutMs does not
 * bound the wait for a connection (and its auth) that an earlier call opened with a longer
 * deadline, which is exactly the state of a client whose engramd stopped answering.
 */
function ping(c: Client, ms: number): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    c.ping({ timeoutMs: ms }),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new TimeoutError(`ping: no answer within ${ms / 1000} s`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** True for failures that mean "no answer from engramd", as opposed to an answer (an Engram
 * error), a TLS refusal (trying again meets it again) or a closed client. */
export function isUnreachable(e: unknown): boolean {
  if (e instanceof EngramError || e instanceof TLSError || e instanceof ClientClosedError) return false;
  if (e instanceof ConnectionLostError || e instanceof TimeoutError) return true;
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^(ECONNREFUSED|ECONNRESET|EHOSTUNREACH|ENETUNREACH|ETIMEDOUT|EPIPE)$/.test(code);
}

/**
 * One Engram client behind a reachability check. `make` builds a fresh client (acting with
 * the same key) when the current one has to be dropped; `where` names engramd in messages
 * (never a key); `log` takes one line.
 */
export class EngramLink {
  private current: Client;
  private down = false;
  private reason = "";
  private downSince = 0;
  private attempting: Promise<boolean> | undefined;
  private lastAttemptEnd = 0;
  private loop: Promise<void> | undefined;
  private wake: (() => void) | undefined;
  private closed = false;

  constructor(client: Client, private readonly make: () => Client, private readonly where: string,
    private readonly log: (msg: string) => void = () => {}) {
    this.current = client;
  }

  /** The client calls go through now (it changes after a reconnect). */
  get client(): Client {
    return this.current;
  }

  /** Whether engramd is taken to be reachable now. */
  get up(): boolean {
    return !this.down;
  }

  /**
   * Runs fn with the current client. Rejects with UnreachableError, at once while engramd is
   * known to be away, or within about PROBE_AFTER_MS + PROBE_TIMEOUT_MS when it stops
   * answering during the call (then, for a write, saying it may have taken effect); with
   * fn's own error otherwise.
   */
  async run<T>(fn: (c: Client) => Promise<T>, opts: { write?: boolean } = {}): Promise<T> {
    if (this.closed) throw new ClientClosedError("the MCP session is closed");
    if (this.down) {
      await this.attemptIfStale();
      if (this.down) throw new UnreachableError(this.downMessage());
    }
    const c = this.current;
    const work = fn(c);
    work.catch(() => {}); // settled below, or abandoned to the watchdog
    let timer: NodeJS.Timeout | undefined;
    let settled = false;
    let answered = false; // the last ping was answered: engramd lives, the call is slow
    // every PROBE_AFTER_MS the call goes without an answer, a ping on the same client
    const watchdog = new Promise<never>((_, reject) => {
      const probe = () => {
        timer = setTimeout(() => {
          if (settled) return;
          ping(c, PROBE_TIMEOUT_MS).then(() => {
            answered = true;
            if (!settled) probe();
          }, (e: unknown) => {
            if (settled) return;
            if (!isUnreachable(e)) {
              answered = true;
              probe();
              return;
            }
            answered = false;
            this.markDown(c, e, "no answer");
            reject(new UnreachableError(this.downMessage() +
              (opts.write ? " The change may or may not have been made: check before repeating it." : "")));
          });
        }, PROBE_AFTER_MS);
      };
      probe();
    });
    try {
      return await Promise.race([work, watchdog]);
    } catch (e) {
      if (e instanceof UnreachableError) throw e;
      if (isUnreachable(e) && !(answered && e instanceof TimeoutError)) {
        this.markDown(c, e, "unreachable");
        const maybe = opts.write && (e instanceof TimeoutError || (e instanceof ConnectionLostError && e.maybeCommitted));
        throw new UnreachableError(this.downMessage() +
          (maybe ? " The change may or may not have been made: check before repeating it." : ""));
      }
      throw e;
    } finally {
      settled = true;
      clearTimeout(timer);
    }
  }

  /** Stops the reconnect loop and closes the client. */
  close(): void {
    this.closed = true;
    this.wake?.();
    this.current.close();
  }

  private downMessage(): string {
    const secs = Math.max(0, Math.round((Date.now() - this.downSince) / 1000));
    return `Engram is unreachable (${this.where}: ${this.reason}; for ${secs} s). ` +
      "Reconnecting in the background: try again in a few seconds.";
  }

  /** engramd stopped answering client c: drop c (a connection may hang half-open) for a fresh
   * client, and start the reconnect loop. Nothing when c was replaced already. */
  private markDown(c: Client, e: unknown, what: string): void {
    if (c !== this.current || this.closed) return;
    const msg = e instanceof Error ? e.message : String(e);
    this.reason = what === "no answer" ? `no answer within ${(PROBE_AFTER_MS + PROBE_TIMEOUT_MS) / 1000} s` : msg;
    if (!this.down) {
      this.down = true;
      this.downSince = Date.now();
      this.log(`${this.where} unreachable (${this.reason}); reconnecting in the background`);
    }
    this.replace();
    this.loop ??= this.reconnect().finally(() => {
      this.loop = undefined;
    });
  }

  private replace(): void {
    const old = this.current;
    this.current = this.make();
    old.close();
  }

  /** One reconnect attempt (shared by concurrent callers): a ping on the current client, which
   * connects and authenticates first. Resolves to whether engramd answered. */
  private attempt(): Promise<boolean> {
    this.attempting ??= (async () => {
      const c = this.current;
      try {
        await ping(c, PROBE_TIMEOUT_MS + 500);
        return true;
      } catch (e) {
        if (!isUnreachable(e)) return true; // refused the key, rate limited...: it answered
        this.reason = e instanceof Error ? e.message : String(e);
        if (c === this.current && !this.closed) this.replace(); // never reuse a stuck connection
        return false;
      }
    })().then((ok) => {
      this.attempting = undefined;
      this.lastAttemptEnd = Date.now();
      if (ok && this.down && !this.closed) {
        this.down = false;
        this.log(`${this.where} reachable again after ${Math.round((Date.now() - this.downSince) / 1000)} s`);
      }
      return ok;
    });
    return this.attempting;
  }

  /** For a call while down: wait for the attempt in flight, or make one if none was made in
   * the last PROBE_AFTER_MS; else nothing (the call fails at once). */
  private async attemptIfStale(): Promise<void> {
    if (this.attempting !== undefined || Date.now() - this.lastAttemptEnd >= PROBE_AFTER_MS) {
      await this.attempt();
    }
  }

  private async reconnect(): Promise<void> {
    let delay = BACKOFF_MIN_MS;
    while (this.down && !this.closed) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, delay);
        t.unref?.();
        this.wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.wake = undefined;
      if (this.closed || !this.down) return;
      if (await this.attempt()) return;
      delay = Math.min(delay * 2, BACKOFF_MAX_MS);
    }
  }
}
