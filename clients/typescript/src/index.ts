// @engram/client for Node (and Bun and Deno, which have node:net): the Client speaking
// MessagePack-RPC over TCP or TLS, or HTTP/JSON through fetch for http(s) URLs, and the
// fetch-only HttpClient. Browsers and edge runtimes get ./browser.ts instead.
export { Client } from "./client.js";
export type { ClientConstructor, ClientOptions } from "./client.js";
export { HttpClient } from "./http.js";
export type { HttpClientConstructor, HttpClientOptions } from "./http.js";
export { DEFAULT_RETRY, embeddingBytes, parseEngramUrl, safeToRepeat } from "./wire.js";
export type { Endpoint } from "./wire.js";
export { METHODS, METHOD_PATHS } from "./api.js";
export * from "./api.js";
export * from "./errors.js";
export type * from "./types.js";
export type * from "./results.js";
