"""An independent model of Engram's ranking, filters and context block, for the tests.

Everything here is computed from the seed's definitions, not from server code: the
composite importance, the blended score, the visibility rules, the tag filters, the
<agent_memory> block with its 4-characters-per-token budget.
"""
import math
import time

import numpy as np

W_RECENCY, W_ACCESS, W_EXPLICIT = 0.3, 0.3, 0.4
RECENCY_DAYS, SATURATION = 30.0, 10.0
DAY_MS = 86400000


def now_ms():
    return int(time.time() * 1000)


def f32(x):
    """x rounded to float32, as the index holds importance."""
    return float(np.float32(x))


def composite(created_ms, access_count, importance, at_ms):
    age_days = max(at_ms - created_ms, 0) / DAY_MS
    return (W_RECENCY * math.exp(-age_days / RECENCY_DAYS)
            + W_ACCESS * min(access_count / SATURATION, 1.0)
            + W_EXPLICIT * importance)


class Mem:
    """What the test knows about one stored memory."""

    def __init__(self, id, vec, **f):
        self.id = id
        self.vec = np.asarray(vec, dtype=np.float64)
        self.vec /= np.linalg.norm(self.vec)
        self.type = f.get("type", "fact")
        self.importance = f.get("importance", 0.5)
        self.agent_id = f.get("agent_id", 0)
        self.clade_id = f.get("clade_id", 0)
        self.scope = f.get("scope", "agent" if "agent_id" in f else "tenant")
        self.created_at = f["created_at"]
        md = f.get("metadata", {}) or {}
        self.tokens = set(md.get("tokens", []))
        self.chains = set(md.get("chains", []))
        self.protocols = set(md.get("protocols", []))
        self.strategy = md.get("strategy_id")
        self.attrs = md.get("attrs", {})
        self.access_count = 0
        self.archived = False


def contains(doc, sub):
    """JSON containment as PostgreSQL's @> defines it for objects, arrays and scalars."""
    if isinstance(sub, dict):
        return isinstance(doc, dict) and all(k in doc and contains(doc[k], v) for k, v in sub.items())
    if isinstance(sub, list):
        return isinstance(doc, list) and all(any(contains(d, s) for d in doc) for s in sub)
    return doc == sub


def passes(m, flt, at_ms):
    if "type_filter" in flt and m.type not in flt["type_filter"]:
        return False
    if m.archived and not flt.get("include_archived"):
        return False
    scopes = set(flt.get("scopes", ["agent", "clade", "tenant"]))
    if "agent_id" in flt:
        a, c = flt["agent_id"], flt.get("clade_id")
        ok = ((m.scope == "agent" and m.agent_id == a and "agent" in scopes)
              or (m.scope == "clade" and c is not None and m.clade_id == c and "clade" in scopes)
              or (m.scope == "tenant" and "tenant" in scopes))
        if not ok:
            return False
    elif m.scope not in scopes:
        return False
    if "created_after" in flt and not m.created_at > flt["created_after"]:
        return False
    if "created_before" in flt and not m.created_at < flt["created_before"]:
        return False
    if "tokens" in flt and not (m.tokens & set(flt["tokens"])):
        return False
    if "chains" in flt and not (m.chains & set(flt["chains"])):
        return False
    if "protocols" in flt and not (m.protocols & set(flt["protocols"])):
        return False
    if "strategy_id" in flt and m.strategy != flt["strategy_id"]:
        return False
    if "attrs" in flt and not contains(m.attrs, flt["attrs"]):
        return False
    if "min_importance" in flt and f32(m.importance) < f32(flt["min_importance"]):
        return False  # the author's importance (compared in float32, as the index holds it)
    if "min_composite" in flt and composite(m.created_at, m.access_count, m.importance,
                                            at_ms) < flt["min_composite"]:
        return False
    return True


def rank(mems, qvec, flt, w, k, at_ms):
    """The best k memories passing flt: [(score, similarity, composite, mem)], best first."""
    q = np.asarray(qvec, dtype=np.float64)
    q /= np.linalg.norm(q)
    out = []
    for m in mems:
        if not passes(m, flt, at_ms):
            continue
        sim = float(m.vec @ q)
        comp = composite(m.created_at, m.access_count, m.importance, at_ms)
        out.append((w * sim + (1 - w) * comp, sim, comp, m))
    out.sort(key=lambda t: (-t[0], -t[1], t[3].id))
    return out[:k], len(out)


def age_display(age_ms):
    minutes = max(age_ms, 0) // 60000
    hours, days = minutes // 60, minutes // 60 // 24
    if minutes < 60:
        return f"{minutes}m"
    if hours < 24:
        return f"{hours}h"
    if days < 7:
        return f"{days}d"
    if days < 30:
        return f"{days // 7}w"
    if days < 365:
        return f"{days // 30}mo"
    return f"{days // 365}y"


def xml_escape(s):
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


def context_block(entries, budget, at_ms):
    """entries: [(type, importance, created_ms, content)] in rank order."""
    xml = "<agent_memory>\n"
    used = 4
    taken = 0
    for typ, imp, created, content in entries:
        entry = (f'  <memory type="{typ}" importance="{imp:.2f}" age="{age_display(at_ms - created)}">\n'
                 f"    {xml_escape(content)}\n  </memory>\n")
        tokens = len(entry.encode()) // 4
        if used + tokens > budget:
            break
        used += tokens
        xml += entry
        taken += 1
    return xml + "</agent_memory>", used, taken
