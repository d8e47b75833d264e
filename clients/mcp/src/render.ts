// Text for models: what the tools, resources and prompts return, rendered from Engram's
// results as short plain text (ISO times, no JSON, no epoch milliseconds, no XML entity
// noise). Pure functions of their inputs.

type Rec = Record<string, unknown>;

const isRec = (v: unknown): v is Rec => v !== null && typeof v === "object" && !Array.isArray(v);
const arr = (v: unknown): Rec[] => (Array.isArray(v) ? v.filter(isRec) : []);
const s = (v: unknown): string => (v === null || v === undefined ? "" : typeof v === "string" ? v : String(v));

/** An epoch-ms time as ISO 8601 to the second (UTC), or "" for nil. */
export function iso(ms: unknown): string {
  if (ms === null || ms === undefined) return "";
  const n = Number(ms);
  if (!Number.isFinite(n)) return "";
  return new Date(n).toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** The day of an epoch-ms time (YYYY-MM-DD, UTC). */
export function day(ms: unknown): string {
  return iso(ms).slice(0, 10);
}

/** A duration in ms as "45 s", "12 min", "3.5 h", "2 d". */
export function duration(ms: unknown): string {
  const n = Number(ms);
  if (!Number.isFinite(n) || n < 0) return "";
  if (n < 60_000) return `${Math.round(n / 1000)} s`;
  if (n < 3_600_000) return `${Math.round(n / 60_000)} min`;
  if (n < 86_400_000) return `${(n / 3_600_000).toFixed(1)} h`;
  return `${(n / 86_400_000).toFixed(1)} d`;
}

const plural = (n: number, one: string, many = one + "s") => `${n} ${n === 1 ? one : many}`;

// ---- relevance ----------------------------------------------------------------------------

/** The cosine similarities at which a match reads strong, good and weak (below: little
 * relation). ENGRAM_MCP_MATCH_LEVELS overrides them ("0.6,0.4,0.2"): the scale depends on
 * the tenant's embedder (the built-in one, feature hashing, scores shared wording high and
 * paraphrases low: 0.68 and 0.10 for the README's example). */
export interface MatchLevels {
  strong: number;
  good: number;
  weak: number;
}

export const DEFAULT_LEVELS: MatchLevels = { strong: 0.6, good: 0.4, weak: 0.2 };

/** Parses "strong,good,weak" (three decreasing numbers in (-1, 1]); throws naming the variable. */
export function parseLevels(v: string | undefined, name = "ENGRAM_MCP_MATCH_LEVELS"): MatchLevels {
  if (v === undefined || v.trim() === "") return DEFAULT_LEVELS;
  const n = v.split(",").map((x) => Number(x.trim()));
  if (n.length !== 3 || n.some((x) => !Number.isFinite(x) || x > 1 || x <= -1) || !(n[0]! > n[1]! && n[1]! > n[2]!)) {
    throw new Error(`${name} must be three decreasing similarities, e.g. 0.6,0.4,0.2`);
  }
  return { strong: n[0]!, good: n[1]!, weak: n[2]! };
}

/** "strong match", "good match", "weak match" or "little relation" for a cosine similarity. */
export function relevance(similarity: number, levels: MatchLevels = DEFAULT_LEVELS): string {
  if (similarity >= levels.strong) return "strong match";
  if (similarity >= levels.good) return "good match";
  if (similarity >= levels.weak) return "weak match";
  return "little relation";
}

// ---- memories -----------------------------------------------------------------------------

function tagsOf(m: Rec): string[] {
  const md = isRec(m.metadata) ? m.metadata : {};
  return Array.isArray(md.tokens) ? md.tokens.map(s) : [];
}

function scopeOf(m: Rec): string {
  const scope = s(m.scope);
  if (scope === "agent") return `agent ${s(m.agent_id)}'s`;
  if (scope === "clade") return `clade ${s(m.clade_id)}'s`;
  return "tenant-wide";
}

/** One line per memory for lists: id, type, importance, day, then the content (cut at max
 * characters, with a pointer to memory_get). */
export function memoryLine(m: Rec, max = 300): string {
  let content = s(m.content).replace(/\s*\n\s*/g, " ");
  if (content.length > max) content = content.slice(0, max) + "… (cut; memory_get for all of it)";
  const flags = [s(m.type), `importance ${Number(m.importance).toFixed(2)}`, day(m.created_at)];
  if (m.archived_at !== null && m.archived_at !== undefined) flags.push("archived");
  return `[id ${s(m.id)}] (${flags.join(", ")}) ${content}`;
}

/** A memory in full: a header line of what it is, its tags and history, then its content. */
export function memoryText(m: Rec): string {
  const head = [`Memory ${s(m.id)}: ${s(m.type)}, importance ${Number(m.importance).toFixed(2)}, ${scopeOf(m)}` +
    (m.pinned === true ? ", pinned" : "")];
  const when = [`created ${iso(m.created_at)}`];
  if (m.updated_at !== m.created_at) when.push(`updated ${iso(m.updated_at)}`);
  when.push(`version ${s(m.version)}`, `read ${plural(Number(m.access_count ?? 0), "time")}`);
  if (m.last_accessed_at) when.push(`last ${iso(m.last_accessed_at)}`);
  head.push(when.join(", "));
  const tags = tagsOf(m);
  if (tags.length) head.push(`Tags: ${tags.join(", ")}`);
  if (m.archived_at) head.push(`Archived ${iso(m.archived_at)}${m.archived_reason ? ` (${s(m.archived_reason)})` : ""}`);
  if (m.expires_at) head.push(`Expires ${iso(m.expires_at)}`);
  if (m.superseded_by) head.push(`Superseded by memory ${s(m.superseded_by)}`);
  if (m.merged_into) head.push(`Merged into memory ${s(m.merged_into)}`);
  return `${head.join("\n")}\n\n${s(m.content)}`;
}

/**
 * The `<agent_memory>` block of memory.context with the entities that cannot form markup
 * decoded: `&apos;`, `&quot;` and `&amp;`. `&lt;` and `&gt;` stay, so no stored text can
 * close the block and pass for something other than a memory.
 */
export function contextText(xml: string): string {
  return xml.replace(/&(apos|quot|amp);/g, (_, e: string) => (e === "apos" ? "'" : e === "quot" ? '"' : "&"));
}

// ---- sessions -----------------------------------------------------------------------------

/** "[decision/carry_forward] db: PostgreSQL 15" (the notes tool's format). */
export function noteLine(n: Rec): string {
  return `[${s(n.category)}/${s(n.scope)}] ${s(n.key)}: ${s(n.value)}`;
}

export function notesText(sessionId: unknown, notes: Rec[]): string {
  if (notes.length === 0) return `Session ${s(sessionId)} has no live notes.`;
  return `Live notes of session ${s(sessionId)}, oldest first:\n` + notes.map(noteLine).join("\n");
}

/** A transcript page: one entry per line as a model reads it, "[role] content". */
export function transcriptText(r: Rec): string {
  const msgs = arr(r.messages);
  const head = `Transcript of session ${s(r.session_id)}: ${plural(msgs.length, "entry", "entries")}` +
    ` (position ${s(r.position)}${Number(r.compaction_count) ? `, ${plural(Number(r.compaction_count), "compaction")}` : ""})`;
  const lines = msgs.map((m) => {
    const who = m.type === "message" ? s(m.role) : s(m.type);
    return `${iso(m.created_at)} [${who}] ${s(m.content)}`;
  });
  return [head, ...lines].join("\n");
}

/** session.get as a few lines. */
export function sessionText(g: Rec, scratchpad?: Rec): string {
  const lines = [
    `Session ${s(g.session_id)}: ${s(g.state)}, agent ${s(g.agent_id)}, model ${s(g.model)}` +
      (g.parent_id ? `, sub-agent of session ${s(g.parent_id)}` : ""),
    `Created ${iso(g.created_at)}, last active ${iso(g.updated_at)}` + (g.ended_at ? `, ended ${iso(g.ended_at)}` : ""),
    `${plural(Number(g.entry_count ?? 0), "transcript entry", "transcript entries")} (${s(g.entry_bytes)} bytes), ` +
      `${plural(Number(g.rounds ?? 0), "round")}, ${plural(Number(g.note_count ?? 0), "live note")}, ` +
      `${plural(Number(g.checkpoint_count ?? 0), "checkpoint")}, ${plural(Number(g.child_count ?? 0), "sub-agent")}, ` +
      `cost ${s(g.total_cost_usdc ?? 0)} USDC` + (g.max_cost_usdc != null ? ` of ${s(g.max_cost_usdc)}` : ""),
  ];
  if (g.resumed_from && isRec(g.resumed_from)) {
    lines.push(`Resumed from checkpoint ${s(g.resumed_from.checkpoint_id)} of session ${s(g.resumed_from.session_id)}`);
  }
  if (g.summary) lines.push(`Summary: ${s(g.summary)}`);
  if (g.task) lines.push(`Task: ${s(g.task)}`);
  if (scratchpad) {
    lines.push("", `Scratchpad (version ${s(scratchpad.version)}):`, s(scratchpad.content) || "(empty)");
  }
  return lines.join("\n");
}

// ---- handoff ------------------------------------------------------------------------------

function workItemLine(w: Rec): string {
  let line = `- #${s(w.work_item_id)} ${s(w.title)} (${s(w.status)}, owner agent ${s(w.owner_agent_id)})`;
  if (w.description) line += `: ${s(w.description)}`;
  for (const n of arr(w.notes)) line += `\n    ${noteLine(n)}`;
  return line;
}

function eventLine(e: Rec): string {
  const at = iso(e.at);
  switch (e.type) {
    case "note":
      return `- ${at} note ${noteLine(e)}${e.live === false ? " (since replaced or cleared)" : ""}`;
    case "checkpoint":
      return `- ${at} checkpoint ${s(e.checkpoint_id)} "${s(e.label)}"`;
    default: {
      const rest = Object.entries(e).filter(([k]) => k !== "at" && k !== "type")
        .map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : s(v)}`);
      return `- ${at} ${s(e.type)}${rest.length ? ": " + rest.join(", ") : ""}`;
    }
  }
}

function auditLine(a: Rec): string {
  const d = isRec(a.detail) ? Object.entries(a.detail).map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : s(v)}`) : [];
  const target = a.target_type ? ` ${s(a.target_type)} ${s(a.target_id)}` : "";
  return `- ${iso(a.at)} ${s(a.action)}${target}${a.agent_id != null ? ` by agent ${s(a.agent_id)}` : ""}` +
    (d.length ? ` (${d.join(", ")})` : "");
}

/**
 * session.handoff as short text: a header, one line of metrics, then the sections the mode
 * selected that hold something (summary, carry-forward, blockers, open work items, done,
 * decisions, scratchpad, recent events, every note, checkpoint, sub-agents), with ISO times.
 * The audit log is shown only when the package has no events (review) or in recovery, and
 * at most its last 10 records there.
 */
export function handoffText(h: Rec): string {
  const m = isRec(h.metrics) ? h.metrics : {};
  const out: string[] = [];
  out.push(`Handoff of session ${s(h.session_id)} (mode ${s(h.mode)}): ${s(h.state)}, agent ${s(h.agent_id)}, ` +
    `model ${s(h.model)}, as of ${iso(h.generated_at)}.`);
  out.push(`Metrics: ${plural(Number(m.entries ?? 0), "transcript entry", "transcript entries")}, ` +
    `${plural(Number(m.rounds ?? 0), "round")}, ${plural(Number(m.notes ?? 0), "note")}, ` +
    `${plural(Number(m.checkpoints ?? 0), "checkpoint")}, ${plural(Number(m.compactions ?? 0), "compaction")}, ` +
    `tasks ${s(m.tasks_done ?? 0)} done / ${s(m.tasks_remaining ?? 0)} open / ${s(m.tasks_cancelled ?? 0)} cancelled, ` +
    `cost ${s(m.cost_usdc ?? 0)} USDC, running ${duration(m.duration_ms)}.`);
  const section = (title: string, lines: string[]) => {
    if (lines.length) out.push("", `${title}:`, ...lines);
  };
  // a note appears once, in the first section that holds it
  const shown = new Set<string>();
  const fresh = (notes: Rec[]) => notes.filter((n) => {
    const id = s(n.note_id);
    if (shown.has(id)) return false;
    shown.add(id);
    return true;
  });
  if (h.summary) section("Summary", [s(h.summary)]);
  section("Carry forward", fresh(arr(h.carry_forward)).map((n) => `- ${noteLine(n)}`));
  section("Open blockers", fresh(arr(h.blockers)).map((n) => `- ${s(n.key)}: ${s(n.value)}`));
  section("Open work items", arr(h.work_items).map(workItemLine));
  section("Done", arr(h.tasks_done).map((t) => `- #${s(t.work_item_id)} ${s(t.title)} (done ${iso(t.done_at)})`));
  section("Decisions", fresh(arr(h.decisions)).map((n) => `- ${s(n.key)}: ${s(n.value)}`));
  if (isRec(h.scratchpad)) {
    section(`Scratchpad (version ${s(h.scratchpad.version)})`, [s(h.scratchpad.content) || "(empty)"]);
  }
  section("Other live notes", fresh(arr(h.notes)).map((n) => `- ${noteLine(n)}`));
  // events: what happened, without the live notes already listed above
  section("Recent events, oldest first", arr(h.events)
    .filter((e) => !(e.type === "note" && e.live !== false && shown.has(s(e.note_id))))
    .map(eventLine));
  if ("checkpoint" in h) {
    const c = isRec(h.checkpoint) ? h.checkpoint : undefined;
    section("Latest checkpoint", [c
      ? `- ${s(c.checkpoint_id)} "${s(c.label)}" at position ${s(c.position)}, ${iso(c.created_at)}, expires ${iso(c.expires_at)}`
      : "- none"]);
  }
  if ("children" in h) {
    const kids = arr(h.children);
    section("Active sub-agents", kids.length
      ? kids.map((c) => `- session ${s(c.session_id)}, agent ${s(c.agent_id)}${c.task ? `: ${s(c.task)}` : ""}`)
      : ["- none"]);
  }
  const audit = arr(h.audit);
  if (audit.length && (h.mode === "recovery" || arr(h.events).length === 0)) {
    section(`Audit log, last ${Math.min(10, audit.length)} of ${audit.length}`, audit.slice(-10).map(auditLine));
  }
  return out.join("\n");
}
