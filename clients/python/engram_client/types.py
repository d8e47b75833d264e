"""Types of the parameters and results (docs/protocol.md is the specification).

Results are plain dicts as they come off the wire; these TypedDicts describe them for type
checkers. Times are integers, milliseconds since the Unix epoch (UTC).
"""
from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Literal, NotRequired, Sequence, TypedDict, Union

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Embedding = Union[Sequence[float], array, bytes, bytearray, memoryview,
                      npt.NDArray[np.floating[Any]]]
else:
    Embedding = Any
"""A vector: a list of floats, ``array('f')``, a numpy array, or bytes of little-endian
float32. float32 numpy arrays and ``array('f')`` are sent without copying."""

MemoryType = Literal["fact", "preference", "episode", "strategy_outcome", "constraint"]
Scope = Literal["agent", "clade", "tenant"]
Tier = Literal["free", "standard", "premium"]
SearchMode = Literal["vector", "text", "hybrid"]
ListOrderBy = Literal["created_at", "importance", "composite"]
ListOrder = Literal["desc", "asc"]
Role = Literal["system", "user", "assistant", "tool"]
NoteCategory = Literal["decision", "discovery", "blocker", "context", "handoff"]
NoteScope = Literal["current_task", "session", "carry_forward"]
SessionState = Literal["active", "ended", "completed"]
BranchType = Literal["resume", "sim", "pre_steer", "dream"]
ReturnFormat = Literal["summary", "full"]
HandoffMode = Literal["continue", "takeover", "review", "recovery"]


class Metadata(TypedDict, total=False):
    """A memory's typed metadata; any other field is ``invalid_argument``."""
    tokens: Sequence[str]
    chains: Sequence[int]
    protocols: Sequence[str]
    strategy_id: str
    attrs: dict[str, Any]


class MemoryInput(TypedDict, total=False):
    """One item of ``memory.store_batch``: the parameters of ``memory.store``."""
    content: str
    type: MemoryType
    memory_type: MemoryType  # seed 003's name of ``type`` (an alias)
    importance: float
    metadata: Metadata
    embedding: Embedding
    agent_id: int
    clade_id: int
    scope: Scope
    created_at: int
    expires_at: int
    ttl_seconds: int
    pinned: bool
    updated_at: int
    last_accessed_at: int
    access_count: int


class MemoryFilter(TypedDict, total=False):
    """The ``filter`` of ``memory.delete``: the search filters (docs/protocol.md, Filters),
    with ``agent_id``/``clade_id`` meaning the memories stored with them."""
    type_filter: Sequence[MemoryType]
    min_importance: float
    min_composite: float
    tokens: Sequence[str]
    chains: Sequence[int]
    protocols: Sequence[str]
    strategy_id: str
    attrs: dict[str, Any]
    created_after: int
    created_before: int
    scopes: Sequence[Scope]
    agent_id: int
    clade_id: int
    include_archived: bool


class EmbeddingConfig(TypedDict, total=False):
    provider: Literal["builtin", "openai"]
    dim: int


class SessionConfig(TypedDict, total=False):
    model: str
    system_prompt: str
    template: dict[str, Any]
    compaction: dict[str, Any]
    max_cost_usdc: float | None
    transcript_replay_depth: int


class MethodParam(TypedDict):
    name: str
    type: str
    required: bool
    aliases: NotRequired[list[str]]  # further names of it (a seed's)
    enum: NotRequired[list[str]]  # the strings it takes (each of its strings, for string[])


class MethodInfo(TypedDict):
    name: str
    flags: list[str]
    params: list[MethodParam]
    result: NotRequired[dict[str, Any]]  # the JSON Schema of its result, components expanded


class AuthResult(TypedDict, total=False):
    tenant_id: int
    tier: Tier
    name: str
    admin: bool


class Memory(TypedDict, total=False):
    id: int
    agent_id: int
    clade_id: int
    scope: Scope
    type: MemoryType
    content: str
    importance: float
    metadata: dict[str, Any]
    created_at: int
    updated_at: int
    last_accessed_at: int | None
    access_count: int
    expires_at: int | None
    archived_at: int | None
    archived_reason: str | None
    superseded_by: int | None
    merged_into: int | None
    pinned: bool
    version: int
    cited_count: int
    injected_count: int
    embedding: Any


class SearchHit(Memory, total=False):
    similarity: float | None
    composite: float
    score: float


class StoreResult(TypedDict):
    id: int
    created_at: int
    replayed: bool


class StoreBatchResult(TypedDict):
    ids: list[int]
    created_at: list[int]
    replayed: bool


class _Missing(TypedDict, total=False):
    missing: list[int]  # the ids asked for that are not there (from servers that send it)


class MemoriesResult(_Missing):
    memories: list[Memory]


class ListResult(TypedDict):
    memories: list[Memory]
    next_cursor: str | None


class SearchResult(TypedDict):
    results: list[SearchHit]
    # with min_similarity: how many ranked candidates fell below it (docs/protocol.md)
    below_min_similarity: NotRequired[int]


class SearchResultItem(TypedDict):
    source: str
    title: str
    content: str


class ContextResult(TypedDict, total=False):
    text: str  # format "xml" (the default)
    items: list[SearchResultItem]  # format "search_results"
    ids: list[int]
    tokens_used: int


class PromptMessage(TypedDict):
    role: str  # "system" (the blocks), then the transcript's roles as stored
    content: str


class PromptAgentMemory(TypedDict):
    text: str  # the <agent_memory> block and a newline, or "" (no memory found)
    tokens_used: int
    budget_tokens: int  # its share plus what the other parts left
    ids: list[int]  # the memories in the block, in rank order


class PromptScratchpad(TypedDict):
    version: int
    included: bool
    truncated: bool


class PromptNotes(TypedDict):
    included: int
    omitted: int
    note_ids: list[int]


class PromptWorkItems(TypedDict):
    included: int
    omitted: int
    work_item_ids: list[int]


class PromptWorkingMemory(TypedDict):
    text: str  # the <working_memory> block and a newline, or "" (nothing in it)
    tokens_used: int
    budget_tokens: int
    scratchpad: PromptScratchpad
    notes: PromptNotes
    work_items: PromptWorkItems


class PromptSummary(TypedDict):
    entry_id: int
    through_entry_id: int
    included: bool
    truncated: bool


class PromptTranscriptMessages(TypedDict):
    included: int
    entry_ids: list[int]
    more: bool  # older messages after the summary were left out


class PromptTranscript(TypedDict):
    text: str  # <transcript> with the <summary> and the newest messages, or ""
    tokens_used: int
    budget_tokens: int
    summary: PromptSummary | None
    messages: PromptTranscriptMessages


class PromptParts(TypedDict):
    agent_memory: PromptAgentMemory
    working_memory: PromptWorkingMemory
    transcript: PromptTranscript


class PromptResult(TypedDict):
    """``memory.prompt``: ``text`` is the three parts' texts concatenated; ``messages`` the
    same as chat messages (the turn's own message is not repeated)."""
    session_id: int
    budget_tokens: int
    tokens_used: int
    text: str
    messages: list[PromptMessage]
    parts: PromptParts


class UpdateResult(TypedDict):
    id: int
    version: int
    updated_at: int


class DeleteResult(TypedDict, total=False):
    """``memory.delete``: ``deleted`` (the ids) by ``ids``; ``count`` and ``dry_run`` by
    ``filter``."""
    deleted: list[int]
    count: int
    dry_run: bool


class ArchiveResult(TypedDict):
    archived: list[int]


class RestoreResult(TypedDict):
    restored: list[int]


class HistoryResult(TypedDict):
    id: int
    versions: list[dict[str, Any]]


class StatsResult(TypedDict):
    total: int
    archived: int
    by_type: dict[str, int]
    by_scope: dict[str, int]
    oldest_at: int | None
    newest_at: int | None
    storage_bytes: int
    index: NotRequired[dict[str, Any]]  # the tenant's vector index here (docs/protocol.md)
    # the re-embedding in progress, or None (results.Reembed; docs/protocol.md)
    reembed: NotRequired[dict[str, Any] | None]


class TenantCreateResult(TypedDict):
    tenant_id: int
    api_key: str
    key_id: int


class SessionCreateResult(TypedDict):
    session_id: int
    created_at: int
    config: SessionConfig


class AppendResult(TypedDict):
    entry_id: int
    seq: int
    total_cost_usdc: float


class Scratchpad(TypedDict):
    session_id: int
    content: str
    version: int
    last_updated_at: int | None
    token_count: int


class NoteAddResult(TypedDict):
    note_id: int
    superseded: int | None
    created_at: int


class Note(TypedDict):
    note_id: int
    category: NoteCategory
    key: str
    value: str
    scope: NoteScope
    work_item_id: int | str | None
    agent_id: int
    created_at: int
    supersedes: int | None


class NotesResult(TypedDict):
    session_id: int
    notes: list[Note]


class CheckpointResult(TypedDict):
    checkpoint_id: int
    session_id: int
    position: int
    created_at: int
    expires_at: int
    delta: dict[str, Any]


class Entry(TypedDict, total=False):
    entry_id: int
    seq: int
    type: Literal["message", "summary", "event"]
    role: Role | None
    content: str
    parent_id: int | None
    tokens: int | None
    cost_usdc: float | None
    agent_id: int
    created_at: int
    through_entry_id: int | None
    messages_compacted: int | None
    event: str
    data: dict[str, Any]
    truncated_from_chars: int  # a tool result auto-compact cut: its length before


class MessagesResult(TypedDict):
    session_id: int
    position: int
    as_of: int
    compaction_count: int
    messages: list[Entry]
    next_cursor: str | None


class ResumeResult(TypedDict, total=False):
    session_id: int
    checkpoint_id: int
    resumed_from: int
    branch_type: BranchType
    simulation: Any
    restored: dict[str, Any]
    agents: list[dict[str, Any]]
    children: list[dict[str, Any]]
    children_missing: list[int]


__all__ = [n for n in list(globals()) if not n.startswith("_") and n not in (
    "annotations", "array", "TYPE_CHECKING", "Any", "Literal", "Sequence", "TypedDict",
    "Union")]
