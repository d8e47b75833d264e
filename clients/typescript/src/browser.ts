// @engram/client for browsers, Deno, Bun and edge runtimes (the package's "browser",
// "worker", "workerd" and "edge-light" conditions, and "@engram/client/http" anywhere):
// the fetch transport only. Nothing reachable from here imports a Node built-in or
// @msgpack/msgpack. `Client` is HttpClient, so code written against the Node entry's
// `new Client({ url: "http://...", apiKey })` runs here unchanged.
export { HttpClient, HttpClient as Client } from "./http.js";
export type {
  HttpClientConstructor,
  HttpClientConstructor as ClientConstructor,
  HttpClientOptions,
  HttpClientOptions as ClientOptions,
} from "./http.js";
export { DEFAULT_RETRY, embeddingBytes, parseEngramUrl, safeToRepeat } from "./wire.js";
export type { Endpoint } from "./wire.js";
export { METHODS, METHOD_PATHS } from "./api.js";
export * from "./api.js";
export * from "./errors.js";
export type * from "./types.js";
export type * from "./results.js";
