// MCP prompts: ready-made messages a host offers its user (slash commands and the like),
// filled from Engram when asked for:
//   recall_before_answering  question [, budget_tokens]: the memories relevant to a question
//                            (memory.context), then the question, with how to use them
//   handoff                  [mode] [, session_id]: a session's handoff package as text, with
//                            what to do first when picking it up
//   remember_what_matters    [topic]: asks the model to store what is worth keeping from the
//                            conversation with the remember tool (no Engram call)
// Arguments are strings, as MCP has them. A missing required argument, an unknown one or a
// value out of range is invalid params (-32602), naming it.
import { EngramError, NotFoundError } from "@engram/client";
import { ErrorCode, type GetPromptResult, type Prompt } from "@modelcontextprotocol/sdk/types.js";

import { ProtocolError, UnreachableError } from "./link.js";
import { contextText, handoffText } from "./render.js";
import { session, type ToolContext } from "./tools.js";

const MODES = ["continue", "takeover", "review", "recovery"];

export const PROMPTS: Prompt[] = [
  {
    name: "recall_before_answering",
    title: "Recall before answering",
    description: "Answer a question with what Engram remembers about it: the relevant memories, then the question.",
    arguments: [
      { name: "question", description: "The question or task to answer.", required: true },
      { name: "budget_tokens", description: "The most tokens the memories may take (default 1500).", required: false },
    ],
  },
  {
    name: "handoff",
    title: "Pick up a session",
    description: "Continue a session from its handoff package: summary, carry-forward notes, blockers, open work, " +
      "decisions, scratchpad and recent events.",
    arguments: [
      { name: "mode", description: "continue (the same agent, the default), takeover (another agent), review (a human) or recovery (after a crash).", required: false },
      { name: "session_id", description: "The session to pick up (default: this conversation's current session).", required: false },
    ],
  },
  {
    name: "remember_what_matters",
    title: "Remember what matters",
    description: "Store the durable facts, preferences, constraints and outcomes of this conversation as memories.",
    arguments: [
      { name: "topic", description: "Only what concerns this topic.", required: false },
    ],
  },
];

function checkArgs(p: Prompt, args: Record<string, string>): void {
  const known = (p.arguments ?? []).map((a) => a.name);
  for (const k of Object.keys(args)) {
    if (!known.includes(k)) {
      throw new ProtocolError(ErrorCode.InvalidParams, `unknown argument '${k}' for prompt '${p.name}': it takes ` +
        (known.length ? known.join(", ") : "no arguments"));
    }
  }
  for (const a of p.arguments ?? []) {
    if (a.required && !(args[a.name] ?? "").trim()) {
      throw new ProtocolError(ErrorCode.InvalidParams, `prompt '${p.name}' needs the argument '${a.name}'`);
    }
  }
}

function uintArg(args: Record<string, string>, k: string, min: number, max: number): number | undefined {
  const v = args[k]?.trim();
  if (v === undefined || v === "") return undefined;
  const n = Number(v);
  if (!/^\d+$/.test(v) || n < min || n > max) throw new ProtocolError(ErrorCode.InvalidParams, `argument '${k}' must be an integer from ${min} to ${max}`);
  return n;
}

async function engram<T>(ctx: ToolContext, fn: () => Promise<T>): Promise<T> {
  try {
    return await ctx.link.run(fn);
  } catch (e) {
    if (e instanceof ProtocolError) throw e;
    if (e instanceof NotFoundError) throw new ProtocolError(ErrorCode.InvalidParams, `Engram error not_found: ${e.serverMessage}`);
    if (e instanceof EngramError) throw new ProtocolError(ErrorCode.InternalError, `Engram error ${e.code}: ${e.serverMessage}`);
    if (e instanceof UnreachableError) throw new ProtocolError(ErrorCode.InternalError, e.message);
    throw new ProtocolError(ErrorCode.InternalError, `Engram failed: ${e instanceof Error ? e.message : String(e)}`);
  }
}

const user = (text: string): GetPromptResult["messages"][number] => ({ role: "user", content: { type: "text", text } });

/** prompts/get. Throws ProtocolError for an unknown prompt or bad arguments. */
export async function getPrompt(ctx: ToolContext, name: string, args: Record<string, string> = {}): Promise<GetPromptResult> {
  const p = PROMPTS.find((x) => x.name === name);
  if (!p) throw new ProtocolError(ErrorCode.InvalidParams, `unknown prompt '${name}': ${PROMPTS.map((x) => x.name).join(", ")}`);
  checkArgs(p, args);
  if (name === "recall_before_answering") {
    const question = args.question!.trim();
    const budget = uintArg(args, "budget_tokens", 1, 100000) ?? 1500;
    const r = await engram(ctx, () => ctx.client.memory.context({
      query: question, budget_tokens: budget, mode: "hybrid", top_k: 50, agent_id: ctx.agentId,
    }));
    const n = (r.ids ?? []).length;
    const memories = n ? contextText(r.text ?? "") : "(nothing stored is relevant)";
    return {
      description: `${n} remembered item${n === 1 ? "" : "s"} for: ${question}`,
      messages: [user(
        "Here is what you remember that may bear on the question below (from Engram, your long-term memory; " +
        "each memory has its type, importance and age):\n\n" + memories + "\n\n" +
        "Answer using these memories where they apply, prefer constraints and recent facts when they conflict, and " +
        "say so when they do not cover the question. If you learn something durable while answering, store it with " +
        "the remember tool.\n\nQuestion: " + question)],
    };
  }
  if (name === "handoff") {
    const mode = (args.mode ?? "").trim() || "continue";
    if (!MODES.includes(mode)) throw new ProtocolError(ErrorCode.InvalidParams, `argument 'mode' must be one of ${MODES.join(", ")}`);
    const sid = uintArg(args, "session_id", 0, Number.MAX_SAFE_INTEGER);
    const h = await engram(ctx, async () => ctx.client.session.handoff({
      session_id: await session(sid === undefined ? {} : { session_id: sid }, ctx),
      mode: mode as "continue" | "takeover" | "review" | "recovery",
    }));
    const text = handoffText(h as unknown as Record<string, unknown>);
    return {
      description: `Handoff (${mode}) of session ${String((h as unknown as Record<string, unknown>).session_id)}`,
      messages: [user(
        `You are picking up a session${mode === "takeover" ? " from another agent" : ""}. Its handoff package from ` +
        "Engram:\n\n" + text + "\n\n" +
        (mode === "review"
          ? "Review the work: what was decided, what is done, what looks wrong or unfinished."
          : "Continue the work: check the open blockers and work items first, keep the carry-forward notes in mind, " +
            "update the scratchpad as you go and record decisions with note_add."))],
    };
  }
  const topic = (args.topic ?? "").trim();
  return {
    description: "Store what is worth keeping from this conversation",
    messages: [user(
      "Look back over this conversation" + (topic ? ` for what concerns ${topic}` : "") + " and store what will " +
      "still matter in later conversations with the remember tool: facts about the user and their world, " +
      "preferences, constraints that must always hold (importance 0.9 or more), and how strategies worked out. One " +
      "self-contained statement per memory; recall first and use update_memory instead of storing a contradiction. " +
      "Skip small talk and anything true only for this task. Then list what you stored.")],
  };
}
