// @engram/client: TypeScript client for Engram, the memory server for agents.
export { Client, DEFAULT_RETRY, embeddingBytes, safeToRepeat } from "./client.js";
export type { ClientOptions } from "./client.js";
export { METHODS, METHOD_PATHS } from "./api.js";
export * from "./api.js";
export * from "./errors.js";
export type * from "./types.js";
