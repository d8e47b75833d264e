// Types of the parameters and results of the Engram protocol (docs/protocol.md is the
// specification). Results are plain objects as they come off the wire. Times are
// integers: milliseconds since the Unix epoch (UTC).

/**
 * An identifier as a parameter: a number, or a bigint (agent ids are unsigned 64-bit).
 * Results carry identifiers as `number`, or as `bigint` from a client made with
 * `{ bigint: true }`: result types take that type as their parameter `I`.
 */
export type Id = number | bigint;

/**
 * A vector. A Float32Array is sent as the compact binary form without copying; number[]
 * is converted once. A Uint8Array is taken to hold little-endian float32 values already.
 */
export type EmbeddingInput = Float32Array | readonly number[] | Uint8Array;

export type MemoryType = "fact" | "preference" | "episode" | "strategy_outcome" | "constraint";
export type Scope = "agent" | "clade" | "tenant";
export type Tier = "free" | "standard" | "premium";
export type SearchMode = "vector" | "text" | "hybrid";
export type ListOrderBy = "created_at" | "importance" | "composite";
export type ListOrder = "desc" | "asc";
export type Role = "system" | "user" | "assistant" | "tool";
export type NoteCategory = "decision" | "discovery" | "blocker" | "context" | "handoff";
export type NoteScope = "current_task" | "session" | "carry_forward";
export type SessionState = "active" | "ended" | "completed";
export type BranchType = "resume" | "sim" | "pre_steer" | "dream";
export type ReturnFormat = "summary" | "full";
export type HandoffMode = "continue" | "takeover" | "review" | "recovery";

/** When a call is repeated automatically (see README). */
export interface RetryPolicy {
  /** Repetitions of one call at most (default 4). */
  maxRetries: number;
  /** Wait `retry_after_ms` and repeat a rate-limited call (default true). */
  honorRateLimits: boolean;
  /** A longer `retry_after_ms` than this is raised instead (default 10000). */
  maxRateLimitWaitMs: number;
  /** First backoff before reconnecting or repeating (default 50), doubled per attempt. */
  backoffBaseMs: number;
  /** Longest backoff (default 2000). */
  backoffMaxMs: number;
}

/** Per-call options, the last argument of every method. */
export interface CallOptions {
  /** The call's deadline in ms, retries and reconnects included. */
  timeoutMs?: number;
  /** Overrides of the client's retry policy for this call. */
  retry?: Partial<RetryPolicy>;
}

/** A memory's typed metadata; any other field is `invalid_argument`. */
export interface Metadata {
  tokens?: string[];
  chains?: Id[];
  protocols?: string[];
  strategy_id?: string;
  attrs?: Record<string, unknown>;
}

/** One item of `memory.store_batch`: the parameters of `memory.store`. */
export interface MemoryInput {
  content: string;
  type: MemoryType;
  /** seed 003's name of `type` (an alias) */
  memory_type?: MemoryType;
  importance: number;
  metadata?: Metadata;
  embedding?: EmbeddingInput;
  agent_id?: Id;
  clade_id?: Id;
  scope?: Scope;
  created_at?: number;
  expires_at?: number;
  ttl_seconds?: number;
  pinned?: boolean;
  updated_at?: number;
  last_accessed_at?: number;
  access_count?: number;
}

/** The `filter` of `memory.delete`: the search filters, with `agent_id`/`clade_id` meaning
 * the memories stored with them. */
export interface MemoryFilter {
  type_filter?: MemoryType[];
  min_importance?: number;
  min_composite?: number;
  tokens?: string[];
  chains?: Id[];
  protocols?: string[];
  strategy_id?: string;
  attrs?: Record<string, unknown>;
  created_after?: number;
  created_before?: number;
  scopes?: Scope[];
  agent_id?: Id;
  clade_id?: Id;
  include_archived?: boolean;
}

export interface EmbeddingConfig {
  provider?: "builtin" | "openai";
  dim?: number;
}

export interface SessionConfig {
  model: string;
  system_prompt?: string;
  template?: { name: string; version?: string; params?: Record<string, string> };
  compaction?: {
    enabled?: boolean;
    threshold?: number;
    keep_recent?: number;
    tool_result_budget?: number;
    max_failures?: number;
  };
  max_cost_usdc?: number | null;
  transcript_replay_depth?: number;
}

export interface MethodInfo {
  name: string;
  flags: string[];
  params: { name: string; type: string; required: boolean }[];
}

export interface AuthResult<I extends Id = number> {
  tenant_id?: I;
  tier?: Tier;
  name?: string;
  admin?: boolean;
}

export interface Memory<I extends Id = number> {
  id: I;
  agent_id: I;
  clade_id: I;
  scope: Scope;
  type: MemoryType;
  content: string;
  importance: number;
  metadata: Record<string, unknown>;
  created_at: number;
  updated_at: number;
  last_accessed_at: number | null;
  access_count: number;
  expires_at: number | null;
  archived_at: number | null;
  archived_reason: string | null;
  superseded_by: I | null;
  merged_into: I | null;
  pinned: boolean;
  version: number;
  cited_count: number;
  injected_count: number;
  /** Only from `memory.list` with `include_embedding`. */
  embedding?: Float32Array;
}

export interface SearchHit<I extends Id = number> extends Memory<I> {
  similarity: number | null;
  composite: number;
  score: number;
}

export interface StoreResult<I extends Id = number> { id: I; created_at: number; replayed: boolean }
export interface StoreBatchResult<I extends Id = number> { ids: I[]; created_at: number[]; replayed: boolean }
/** `missing`: the ids asked for that are not there (from servers that send it). */
export interface MemoriesResult<I extends Id = number> { memories: Memory<I>[]; missing?: I[] }
export interface ListResult<I extends Id = number> { memories: Memory<I>[]; next_cursor: string | null }
export interface SearchResult<I extends Id = number> { results: SearchHit<I>[] }
export interface SearchResultItem { source: string; title: string; content: string }
/** `text` with format "xml" (the default), `items` with format "search_results". */
export interface ContextResult<I extends Id = number> { text?: string; items?: SearchResultItem[]; ids: I[]; tokens_used: number }
/** `memory.prompt`: `text` is the three parts' texts concatenated; `messages` the same as
 * chat messages (a system message with the blocks and the summary, then the transcript's
 * messages as stored; the turn's own message is not repeated). */
export interface PromptResult<I extends Id = number> {
  session_id: I;
  budget_tokens: number;
  tokens_used: number;
  text: string;
  messages: { role: string; content: string }[];
  parts: {
    /** The <agent_memory> block and a newline, or "" (no memory found). */
    agent_memory: { text: string; tokens_used: number; budget_tokens: number; ids: I[] };
    working_memory: {
      text: string;
      tokens_used: number;
      budget_tokens: number;
      scratchpad: { version: number; included: boolean; truncated: boolean };
      notes: { included: number; omitted: number; note_ids: I[] };
      work_items: { included: number; omitted: number; work_item_ids: I[] };
    };
    transcript: {
      text: string;
      tokens_used: number;
      budget_tokens: number;
      summary: { entry_id: I; through_entry_id: I; included: boolean; truncated: boolean } | null;
      /** `more`: older messages after the summary were left out. */
      messages: { included: number; entry_ids: I[]; more: boolean };
    };
  };
}
export interface UpdateResult<I extends Id = number> { id: I; version: number; updated_at: number }
/** `memory.delete`: `deleted` (the ids) by `ids`; `count` and `dry_run` by `filter`. */
export interface DeleteResult<I extends Id = number> { deleted?: I[]; count?: number; dry_run?: boolean }
export interface ArchiveResult<I extends Id = number> { archived: I[] }
export interface RestoreResult<I extends Id = number> { restored: I[] }
export interface HistoryResult<I extends Id = number> { id: I; versions: Record<string, unknown>[] }
export interface StatsResult<I extends Id = number> {
  total: number;
  archived: number;
  by_type: Record<string, number>;
  by_scope: Record<string, number>;
  oldest_at: number | null;
  newest_at: number | null;
  storage_bytes: number;
}
export interface TenantCreateResult<I extends Id = number> { tenant_id: I; api_key: string; key_id: I }
export interface SessionCreateResult<I extends Id = number> { session_id: I; created_at: number; config: SessionConfig }
export interface AppendResult<I extends Id = number> { entry_id: I; seq: number; total_cost_usdc: number }
export interface Scratchpad<I extends Id = number> {
  session_id: I;
  content: string;
  version: number;
  last_updated_at: number | null;
  token_count: number;
}
export interface NoteAddResult<I extends Id = number> { note_id: I; superseded: I | null; created_at: number }
export interface Note<I extends Id = number> {
  note_id: I;
  category: NoteCategory;
  key: string;
  value: string;
  scope: NoteScope;
  work_item_id: I | string | null;
  agent_id: I;
  created_at: number;
  supersedes: I | null;
}
export interface NotesResult<I extends Id = number> { session_id: I; notes: Note<I>[] }
export interface CheckpointResult<I extends Id = number> {
  checkpoint_id: I;
  session_id: I;
  position: number;
  created_at: number;
  expires_at: number;
  delta: { scratchpad: boolean; notes_added: I[]; notes_removed: I[]; entries: number };
}
export interface Entry<I extends Id = number> {
  entry_id: I;
  seq: number;
  type: "message" | "summary" | "event";
  role: Role | null;
  content: string;
  parent_id: I | null;
  tokens: number | null;
  cost_usdc: number | null;
  agent_id: I;
  created_at: number;
  through_entry_id: I | null;
  messages_compacted: number | null;
  event?: string;
  data?: Record<string, unknown>;
  /** a tool result auto-compact cut: its length before */
  truncated_from_chars?: number;
}
export interface MessagesResult<I extends Id = number> {
  session_id: I;
  position: number;
  as_of: number;
  compaction_count: number;
  messages: Entry<I>[];
  next_cursor: string | null;
}
export interface ResumeResult<I extends Id = number> {
  session_id: I;
  checkpoint_id: I;
  resumed_from: I;
  branch_type: BranchType;
  simulation: unknown;
  restored: Record<string, unknown>;
  agents: { agent_id: I; tail: Entry<I>[] }[];
  children: Record<string, unknown>[];
  children_missing: I[];
}
