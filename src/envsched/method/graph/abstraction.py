# Over 700 lines: the static extractor (E.1) is its vocabulary tables and the one pass over a spec that reads them.
"""The abstract representation of a task (EnvSched appendix E.1) and its deterministic static extractor.

Cross-environment similarity ``S_abs`` must not be driven by what is specific to one domain: tool names,
entity ids, database fields, literal numbers. Two tasks from different environments are alike when they
*execute* alike: the same families of operations, the same prerequisite gates, the same dependencies
between steps, the same groups of reward checks and the same conflicts. This module turns a task spec
into exactly that structure:

``operations``
    ``[{"family", "effect", "inputs", "required"}]``: one per tool the task can use. ``family`` is from a
    fixed vocabulary (:data:`OPERATION_FAMILIES`), ``effect`` is read/write/destructive, ``inputs`` are
    the categories of its parameters (identifier, date, money, ...), never their names; ``required``
    says whether the task's text, checks or code refer to it.
``gates``
    ``[{"type", "provenance"}]``: prerequisite gates (authentication, authorization, existence, state,
    eligibility, confirmation, sufficiency) and where the evidence came from (tool description,
    verifier, instruction, initial state).
``dependencies``
    ``[{"from", "to", "kind"}]`` between operation families: ``data`` (an operation consumes an identifier
    another one resolves), ``gate`` (a gate guards a writing operation), ``order`` (the order the task
    mentions operations in).
``check_groups``
    ``[{"controlled_by", "kinds", "size"}]``: the verifier checks partitioned by the operation family or
    gate that controls them.
``conflicts``
    ``[{"type", "families"}]``: ``ordering``, ``mutual_exclusion``, ``destructive``.
``literals``
    ``{category: count}``: the literals of the task text and checks, replaced by their categories.

The same structure is what the optional LLM extractor (:mod:`envsched.method.graph.llm_abstraction`) must
return; :data:`ABSTRACTION_SCHEMA` is its JSON schema and :func:`abstract_tokens` turns either into the
token views that ``S_abs`` is computed from. The static extractor is a heuristic: it reads keywords and
parameter names, so it is deterministic, offline and fast (it caches per tool set), but shallower than
an LLM reading the tool code.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache
from itertools import pairwise
from typing import Any

__all__ = [
    "ABSTRACTION_SCHEMA",
    "CHECK_KINDS",
    "CONFLICT_TYPES",
    "EFFECTS",
    "GATE_PROVENANCES",
    "GATE_TYPES",
    "INPUT_CATEGORIES",
    "LITERAL_CATEGORIES",
    "OPERATION_FAMILIES",
    "abstract_tokens",
    "extract_abstraction",
    "mask_literals",
    "split_identifier",
]

# --------------------------------------------------------------------------- vocabularies
#: Operation families (the verb of an operation, its domain removed). Order = matching priority.
OPERATION_FAMILIES: tuple[str, ...] = (
    "authenticate", "delete", "transfer", "communicate", "schedule", "create", "update", "control",
    "compute", "search", "lookup", "other",
)
EFFECTS: tuple[str, ...] = ("read", "write", "destructive")
GATE_TYPES: tuple[str, ...] = (
    "authentication", "authorization", "existence", "state", "eligibility", "confirmation", "sufficiency",
)
GATE_PROVENANCES: tuple[str, ...] = ("tool_description", "verifier", "instruction", "initial_state")
DEPENDENCY_KINDS: tuple[str, ...] = ("data", "gate", "order")
CHECK_KINDS: tuple[str, ...] = ("state_equals", "output", "count", "existence", "negative", "other")
CONFLICT_TYPES: tuple[str, ...] = ("ordering", "mutual_exclusion", "destructive")
INPUT_CATEGORIES: tuple[str, ...] = (
    "identifier", "name", "datetime", "money", "email", "phone", "location", "quantity", "text", "flag",
    "choice", "collection", "credential", "other",
)
LITERAL_CATEGORIES: tuple[str, ...] = (
    "identifier", "email", "phone", "url", "date", "time", "money", "percent", "number", "quoted",
)

_VERBS: dict[str, tuple[str, ...]] = {
    "authenticate": ("login", "logon", "signin", "authenticate", "auth", "logout", "signout", "verify",
                     "password", "unlock_account"),
    "delete": ("delete", "remove", "cancel", "revoke", "drop", "erase", "clear", "destroy", "unsubscribe",
               "terminate", "close", "release", "return"),
    "transfer": ("transfer", "pay", "refund", "charge", "purchase", "buy", "withdraw", "deposit", "refuel",
                 "sell", "trade", "checkout", "redeem"),
    "communicate": ("send", "message", "email", "notify", "reply", "call", "post", "share", "comment",
                    "tweet", "contact", "mention", "respond", "forward", "transfer_to_human"),
    "schedule": ("schedule", "book", "reserve", "reschedule", "appoint", "rebook", "block"),
    "create": ("create", "add", "register", "open", "insert", "new", "make", "place", "generate",
               "upload", "enroll", "apply", "submit", "write", "record", "assign"),
    "update": ("update", "modify", "edit", "change", "set", "rename", "exchange", "upgrade", "move",
               "replace", "adjust", "resolve", "mark", "approve", "reject", "advance", "toggle", "reset",
               "enable", "disable", "switch", "fill", "save"),
    "control": ("turn", "start", "stop", "activate", "deactivate", "lock", "unlock", "press", "launch",
                "run", "execute", "navigate", "go", "cd", "mkdir", "touch", "mv", "cp", "rm", "reboot",
                "restart", "connect", "disconnect", "pause", "play"),
    "compute": ("calculate", "compute", "convert", "sum", "estimate", "evaluate", "count", "think",
                "average", "add_numbers", "multiply", "divide", "subtract", "logarithm", "mean", "sort"),
    "search": ("search", "list", "filter", "browse", "find", "query", "ls", "grep", "match", "scan", "lookup",
               "explore"),
    "lookup": ("get", "read", "check", "view", "show", "fetch", "retrieve", "display", "describe", "load",
               "inspect", "cat", "info", "details", "status", "detail", "balance", "pwd", "wc", "tail", "look",
               "head", "diff", "stat", "du", "echo"),
}
_VERB_TO_FAMILY: dict[str, str] = {}
for _fam in OPERATION_FAMILIES:
    for _v in _VERBS.get(_fam, ()):
        _VERB_TO_FAMILY.setdefault(_v, _fam)

_EFFECT_OF: dict[str, str] = {
    "authenticate": "write", "delete": "destructive", "transfer": "write", "communicate": "write",
    "schedule": "write", "create": "write", "update": "write", "control": "write", "compute": "read",
    "search": "read", "lookup": "read", "other": "read",
}

# Literal categories, most specific first (one combined pass; each match is one category).
_LITERAL_PATTERNS: dict[str, str] = {
    "email": r"[\w.+-]+@[\w-]+\.[\w.-]+",
    "url": r"https?://\S+",
    "date": r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|"
            r"nov|dec)[a-z]*\.? \d{1,2}(?:st|nd|rd|th)?\b",
    "time": r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[ap]m)?\b",
    "phone": r"\+?\b\d{3}[-. ]\d{3}[-. ]\d{4}\b",
    "money": r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?|\b\d[\d,]*(?:\.\d+)?\s?(?:dollars|usd|eur|yuan|rmb)\b",
    "percent": r"\b\d+(?:\.\d+)?\s?%",
    "identifier": r"#?\b(?=[A-Za-z_]*\d)(?=\w*[A-Za-z])[A-Za-z0-9_]*[A-Za-z0-9]{3,}\b|#\w+|\b\d{5,}\b",
    "number": r"\b\d+(?:\.\d+)?\b",
    "quoted": r"\"[^\"\n]{1,200}\"|'[^'\n]{2,200}'",
}
_LITERAL_RE = re.compile("|".join(f"(?P<{k}>{v})" for k, v in _LITERAL_PATTERNS.items()), re.IGNORECASE)

# Fast keyword detection: one tokenisation per text, then set lookups (plus a few phrases).
_GATE_WORDS: dict[str, tuple[str, ...]] = {
    "authentication": ("login", "logged", "logon", "signin", "authenticate", "authenticated", "authentication",
                       "password", "passwords", "credential", "credentials", "identity", "otp", "passcode"),
    "authorization": ("authorize", "authorized", "authorise", "authorised", "authorization", "authorisation",
                      "permission", "permissions", "owner", "owners", "ownership", "admin", "administrator",
                      "privilege", "privileges", "role", "unauthorized"),
    "existence": ("exist", "exists", "existing", "locate", "resolve", "resolved", "unknown", "found"),
    "state": ("status", "state", "pending", "delivered", "processed", "active", "inactive", "available",
              "unavailable", "wifi", "enabled", "disabled", "connected", "disconnected", "open", "closed",
              "suspended", "expired"),
    "eligibility": ("eligible", "eligibility", "ineligible", "policy", "policies", "maximum", "minimum", "limit",
                    "limits", "limited", "restrict", "restricted", "restriction", "restrictions", "rule", "rules",
                    "allowed", "within"),
    "confirmation": ("confirm", "confirmed", "confirmation", "consent", "yes", "approve", "approval"),
    "sufficiency": ("balance", "sufficient", "insufficient", "funds", "quota", "remaining", "enough"),
}
_GATE_PHRASES: dict[str, tuple[str, ...]] = {
    "authentication": ("log in", "logged in", "sign in", "verify the user", "verify identity"),
    "authorization": ("not allowed", "allowed to", "access rights"),
    "existence": ("not found", "does not exist", "must exist", "valid id"),
    "state": ("must be", "only if", "in stock", "turned on", "turned off"),
    "eligibility": ("at most", "no more than", "cannot exceed"),
    "confirmation": ("explicit confirmation", "explicitly confirm"),
    "sufficiency": ("enough money",),
}
_CONFLICT_WORDS: dict[str, tuple[str, ...]] = {
    "ordering": ("before", "after", "first", "then", "once", "subsequently", "finally", "next", "afterwards"),
    "mutual_exclusion": ("either", "instead", "exclusive", "unless", "duplicate", "duplicates", "otherwise"),
    "destructive": ("irreversible", "irreversibly", "permanent", "permanently", "overwrite", "overwritten",
                    "delete", "deleted", "cancel", "cancelled", "canceled", "remove", "removed", "non"),
}
_CONFLICT_PHRASES: dict[str, tuple[str, ...]] = {
    "ordering": ("prior to", "followed by", "in order"),
    "mutual_exclusion": ("only one", "cannot both", "only once", "not both", "one of", "rather than"),
    "destructive": ("cannot be undone", "non-refundable"),
}


def _word_index(table: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for kind, words in table.items():
        for w in words:
            out.setdefault(w, []).append(kind)
    return out


_GATE_INDEX = _word_index(_GATE_WORDS)
_CONFLICT_INDEX = _word_index(_CONFLICT_WORDS)


def _phrase_re(phrases: dict[str, tuple[str, ...]]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?P<{k}>{'|'.join(re.escape(p) for p in ps)})" for k, ps in phrases.items()))


_PHRASE_RES: dict[int, re.Pattern[str]] = {}


def _hits(low: str, words: set[str], index: dict[str, list[str]],
          phrases: dict[str, tuple[str, ...]]) -> set[str]:
    found: set[str] = set()
    for w in words & index.keys():
        found.update(index[w])
    pattern = _PHRASE_RES.get(id(phrases))
    if pattern is None:
        pattern = _PHRASE_RES[id(phrases)] = _phrase_re(phrases)
    found.update(m.lastgroup for m in pattern.finditer(low) if m.lastgroup)
    return found


def _gates_in(text: str) -> set[str]:
    low = text.lower()
    return _hits(low, set(_WORD_RE.findall(low)), _GATE_INDEX, _GATE_PHRASES)


def _conflicts_in(text: str) -> set[str]:
    low = text.lower()
    return _hits(low, set(_WORD_RE.findall(low)), _CONFLICT_INDEX, _CONFLICT_PHRASES)


_LIT_TOKEN_RE = re.compile(r"[^\s,;()\[\]{}]*\d[^\s,;()\[\]{}]*|[^\s,;()]+@[^\s,;()]+|https?://\S+")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[t ]\d{1,2}:\d{2}(?::\d{2})?)?|\d{1,2}/\d{1,2}/\d{2,4}")
_TIME_RE = re.compile(r"\d{1,2}:\d{2}(?::\d{2})?(?:[ap]m)?")
_PHONE_RE = re.compile(r"\+?\d{1,3}?[-.]?\(?\d{3}\)?[-.]\d{3}[-.]\d{4}")
_NUMBER_RE = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def _literal_category(tok: str) -> str | None:
    t = tok.strip(".,!?:;'\"<>")
    if not t:
        return None
    low = t.lower()
    if low.startswith(("http://", "https://")):
        return "url"
    if "@" in t and "." in t.split("@")[-1]:
        return "email"
    if not any(c.isdigit() for c in t):
        return None
    if t[0] in "$€£¥" or low.endswith(("usd", "eur", "yuan", "rmb")):
        return "money"
    if t.endswith("%"):
        return "percent"
    if _DATE_RE.fullmatch(low):
        return "date"
    if _TIME_RE.fullmatch(low):
        return "time"
    if _PHONE_RE.fullmatch(t):
        return "phone"
    if t.startswith("#") or any(c.isalpha() for c in t) or (t.isdigit() and len(t) >= 5):
        return "identifier"
    if _NUMBER_RE.fullmatch(t):
        return "number"
    return "identifier"


def _literal_counts(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for tok in _LIT_TOKEN_RE.findall(text):
        cat = _literal_category(tok)
        if cat:
            counts[cat] += 1
    q = text.count('"') // 2
    if q:
        counts["quoted"] += q
    return counts


_CHECK_KIND_PATTERNS: dict[str, str] = {
    "negative": r"\bnot\b|\bnever\b|\bno\b|!=|\bshould not\b|\bmust not\b|\brefus\w*|\bwithout\b",
    "count": r"\blen\(|\bcount\b|\bnumber of\b|\btotal\b|\bsum\b",
    "output": r"\bsays?\b|\bmention\w*|\binform\w*|\btells?\b|\bcommunicat\w*|\bresponse\b|\breply\b|"
              r"\boutput\b|\bprint\w*|\breturn\w*|\bcontains?\b",
    "existence": r"\bexists?\b|\bis not none\b|\bin db\b|\bpresent\b|\bcreated\b|\brecorded\b|\bhas\b",
    "state_equals": r"==|\bequals?\b|\bis\b|\bstatus\b|\bset to\b|\bupdated\b|\bchanged\b",
}
_CHECK_KIND_RE = re.compile("|".join(f"(?P<{k}>{v})" for k, v in _CHECK_KIND_PATTERNS.items()), re.IGNORECASE)

_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|[^A-Za-z0-9]+")
_WORD_RE = re.compile(r"[a-z]+")


def split_identifier(name: str) -> list[str]:
    """``"getOrderDetails"`` / ``"get_order_details"`` -> ``["get", "order", "details"]``."""
    return [p.lower() for p in _CAMEL_RE.split(name) if p]


def mask_literals(text: str) -> tuple[str, Counter[str]]:
    """Replace identifiers, numbers, dates, amounts... by ``<category>``; return the text and the counts.

    This is how domain literals leave the abstract representation: only their categories remain.
    """
    counts: Counter[str] = Counter()

    def repl(m: re.Match[str]) -> str:
        counts[m.lastgroup or "other"] += 1
        return f"<{m.lastgroup}>"

    return _LITERAL_RE.sub(repl, text), counts


# --------------------------------------------------------------------------- operations
@lru_cache(maxsize=200_000)
def _verb_family(word: str) -> str | None:
    """Family of a verb, also in inflected form (``cancelled`` -> delete, ``updating`` -> update)."""
    fam = _VERB_TO_FAMILY.get(word)
    if fam is None and len(word) > 4:
        for suffix in ("led", "ied", "ed", "d", "ing", "es", "s"):
            if word.endswith(suffix):
                stem = word[: -len(suffix)] + ("y" if suffix == "ied" else "")
                fam = _VERB_TO_FAMILY.get(stem) or _VERB_TO_FAMILY.get(stem + "e")
                if fam:
                    break
    return fam


def _family_of(words: list[str], joined: str) -> str:
    for fam in OPERATION_FAMILIES[:-1]:
        for v in _VERBS[fam]:
            if "_" in v and v in joined:
                return fam
    for w in words:
        fam = _VERB_TO_FAMILY.get(w)
        if fam:
            return fam
    return "other"


def _input_category(pname: str, ptype: str, pdesc: str) -> str:
    words = set(split_identifier(pname))
    low = pname.lower()
    ptype = (ptype or "").lower()
    if words & {"password", "token", "otp", "pin", "secret", "credential", "credentials"}:
        return "credential"
    if low == "id" or low.endswith("_id") or (low.endswith("id") and len(low) > 2 and low[-3] in "_dD") \
            or words & {"id", "ids", "code", "number", "sku", "uuid", "key", "reference", "ref"}:
        return "identifier"
    if words & {"email", "mail"}:
        return "email"
    if words & {"phone", "mobile", "tel"}:
        return "phone"
    if words & {"date", "time", "day", "month", "year", "datetime", "timestamp", "hour", "deadline", "start",
                "end", "when", "duration"}:
        return "datetime"
    if words & {"amount", "price", "cost", "balance", "fee", "payment", "total", "budget", "salary", "money"}:
        return "money"
    if words & {"address", "city", "country", "location", "zip", "origin", "destination", "place", "path",
                "dir", "directory", "folder", "room", "zone"}:
        return "location"
    if words & {"name", "username", "user", "sender", "receiver", "recipient", "title", "author", "first",
                "last"}:
        return "name"
    if words & {"quantity", "count", "num", "amount", "size", "limit", "n", "passengers", "seats", "level"}:
        return "quantity"
    if ptype in ("boolean", "bool") or words & {"is", "enable", "enabled", "flag"}:
        return "flag"
    if ptype in ("array", "list", "tuple") or (low.endswith("s") and ptype == ""):
        return "collection"
    if words & {"type", "mode", "status", "category", "class", "kind", "option", "method", "cabin"} \
            or "enum" in pdesc.lower() or "one of" in pdesc.lower():
        return "choice"
    if words & {"message", "content", "text", "description", "reason", "comment", "body", "query", "keyword",
                "note", "notes", "subject", "summary"} or ptype == "string":
        return "text"
    if ptype in ("integer", "int", "number", "float"):
        return "quantity"
    return "other"


def _tool_params(tool: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    params = tool.get("parameters") or tool.get("input_schema") or tool.get("args") or {}
    out: list[tuple[str, str, str]] = []
    if isinstance(params, Mapping):
        props = params.get("properties") if isinstance(params.get("properties"), Mapping) else None
        if props is None and params.get("type") not in ("object", "dict"):
            props = params
        for pname, pdef in (props or {}).items():
            if isinstance(pdef, Mapping):
                out.append((str(pname), str(pdef.get("type", "")), str(pdef.get("description", ""))))
            else:
                out.append((str(pname), str(pdef) if isinstance(pdef, str) else "", ""))
    elif isinstance(params, list):
        for p in params:
            if isinstance(p, Mapping) and "name" in p:
                out.append((str(p["name"]), str(p.get("type", "")), str(p.get("description", ""))))
            elif isinstance(p, str):
                out.append((p, "", ""))
    return out


@lru_cache(maxsize=65536)
def _analyse_tool(name: str, description: str, params_json: str) -> dict[str, Any]:
    """Family, effect, input categories, entity words and gate hits of one tool (cached: tools repeat)."""
    words = split_identifier(name)
    fam = _family_of(words, name.lower())
    if fam == "other" and description:
        fam = _family_of(_WORD_RE.findall(description.lower())[:3], "")
    params = [tuple(p) for p in json.loads(params_json)]
    inputs = sorted({_input_category(p, t, d) for p, t, d in params})
    entities = {w for w in words if w not in _VERB_TO_FAMILY and len(w) > 2}
    id_entities = set()
    for pname, _t, _d in params:
        pw = split_identifier(pname)
        if pw and pw[-1] in ("id", "ids", "number", "code"):
            id_entities.update(w for w in pw[:-1] if len(w) > 2)
    gates = sorted(_gates_in(description))
    destructive_text = "destructive" in _conflicts_in(description) and fam in ("delete", "transfer", "update")
    effect = _EFFECT_OF[fam]
    if destructive_text and effect == "write" and fam == "delete":
        effect = "destructive"
    return {"family": fam, "effect": effect, "inputs": inputs, "entities": frozenset(entities),
            "id_entities": frozenset(id_entities), "gates": gates, "words": tuple(words)}


# --------------------------------------------------------------------------- helpers
def _text_of(value: Any, limit: int) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value[:limit]
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)[:limit]
    except (TypeError, ValueError):
        return str(value)[:limit]


def _state_gates(state: Any, depth: int = 0) -> set[str]:
    """Gates evident in the initial state: boolean switches (logged_in, wifi...) and status fields."""
    found: set[str] = set()
    if depth > 3:
        return found
    if isinstance(state, Mapping):
        for k, v in list(state.items())[:200]:
            key = str(k).lower()
            if isinstance(v, bool):
                if "log" in key or "auth" in key or "session" in key:
                    found.add("authentication")
                else:
                    found.add("state")
            elif key in ("status", "state") or key.endswith("_status"):
                found.add("state")
            elif "balance" in key or "quota" in key or "credit" in key:
                found.add("sufficiency")
            elif "permission" in key or "role" in key or "owner" in key:
                found.add("authorization")
            else:
                found |= _state_gates(v, depth + 1)
    elif isinstance(state, list):
        for v in state[:20]:
            found |= _state_gates(v, depth + 1)
    return found


def _bin(n: int) -> str:
    if n <= 2:
        return str(n)
    if n <= 4:
        return "3-4"
    if n <= 8:
        return "5-8"
    return "9+"


# --------------------------------------------------------------------------- extractor
def extract_abstraction(spec: Mapping[str, Any], *, max_chars: int = 4000,
                        tool_cache: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The E.1 abstract representation of one task spec, by the deterministic static extractor.

    Reads ``tools`` (names, descriptions, parameters), ``instruction``, ``verifier`` (checks and code)
    and ``initial_state``. Missing fields simply contribute nothing. The result holds no tool name,
    entity id, database field or literal: only families, categories and counts (see the module doc).

    ``tool_cache``: a dict the caller keeps while all the specs it passes stay alive; tool objects
    shared between tasks (one environment's tool list) are then analysed once.
    """
    instruction = spec.get("instruction") or ""
    verifier = spec.get("verifier") or {}
    checks = [c for c in (verifier.get("checks") or []) if isinstance(c, str)]
    code = verifier.get("code") or ""
    tools = [t for t in (spec.get("tools") or []) if isinstance(t, Mapping) and t.get("name")]
    instr_low = instruction[:max_chars].lower()
    checks_low = [c[:max_chars].lower() for c in checks]
    code_low = code[:max_chars].lower()
    evidence_low = " \n ".join([instr_low, *checks_low, code_low])
    evidence_words = set(_WORD_RE.findall(evidence_low))
    evidence_families = {f for f in map(_verb_family, evidence_words) if f}
    if any(p in evidence_low for p in ("log in", "sign in", "log on")):
        evidence_families.add("authenticate")
    if "look up" in evidence_low:
        evidence_families.add("lookup")

    # operations
    operations: list[dict[str, Any]] = []
    analysed = []
    infos = []
    for t in tools:
        info = tool_cache.get(id(t)) if tool_cache is not None else None
        if info is None:
            params = _tool_params(t)
            info = _analyse_tool(str(t["name"]), str(t.get("description") or "")[:2000],
                                 json.dumps(params, separators=(",", ":")))
            if tool_cache is not None:
                tool_cache[id(t)] = info
        infos.append(info)
    family_count = Counter(info["family"] for info in infos)
    for t, info in zip(tools, infos, strict=True):
        name_low = str(t["name"]).lower()
        words = info["words"]
        required = name_low in evidence_low or (
            len(words) > 1 and all(w in evidence_words for w in words if w not in ("the", "a", "of", "by")))
        if not required and info["family"] in evidence_families:
            # the task asks for this kind of operation: this tool, if it names a mentioned entity or is
            # the only tool of that family
            required = bool(info["entities"] & evidence_words) or family_count[info["family"]] == 1
        first_pos = evidence_low.find(name_low) if required else -1
        if required and first_pos < 0:
            first_pos = min((evidence_low.find(w) for w in words if w in evidence_words), default=-1)
        analysed.append((info, required, first_pos))
        operations.append({"family": info["family"], "effect": info["effect"], "inputs": list(info["inputs"]),
                           "required": bool(required)})

    # gates with provenance
    gates: set[tuple[str, str]] = set()
    for info, _req, _pos in analysed:
        for g in info["gates"]:
            gates.add((g, "tool_description"))
    for g in _gates_in(instr_low):
        gates.add((g, "instruction"))
    for g in _gates_in(" \n ".join([*checks_low, code_low])):
        gates.add((g, "verifier"))
    for g in _state_gates(spec.get("initial_state")):
        gates.add((g, "initial_state"))

    # dependencies
    deps: set[tuple[str, str, str]] = set()
    focus = [a for a in analysed if a[1]] or analysed
    readers = [(info["family"], info["entities"]) for info, _r, _p in focus if info["effect"] == "read"]
    for info, _r, _p in focus:
        for ent in info["id_entities"]:
            for rfam, rents in readers:
                if ent in rents and (rfam != info["family"] or info["effect"] != "read"):
                    deps.add((rfam, info["family"], "data"))
    gate_types = {g for g, _p in gates}
    writers = {info["family"] for info, _r, _p in focus if info["effect"] != "read"}
    for g in gate_types & {"authentication", "authorization", "existence", "state", "eligibility",
                           "confirmation", "sufficiency"}:
        for fam in writers:
            deps.add((g, fam, "gate"))
    ordered = sorted((p, info["family"]) for info, r, p in analysed if r and p >= 0)
    for (_p1, f1), (_p2, f2) in pairwise(ordered):
        if f1 != f2:
            deps.add((f1, f2, "order"))

    # verifier-check groups: partition checks by controlling family (or gate)
    families_by_word: dict[str, str] = {}
    for info, _r, _p in focus:
        for w in (*info["entities"], *info["words"]):
            families_by_word.setdefault(w, info["family"])
    groups: dict[str, Counter[str]] = {}
    check_texts = list(checks)
    if code:
        check_texts += [ln for ln in code.splitlines()
                        if re.search(r"\bassert\b|==|!=|\breturn\b", ln)][:100]
    for text in check_texts:
        low = text[:max_chars].lower()
        words = _WORD_RE.findall(low)
        controller = None
        for w in words:
            fam = _verb_family(w)
            if fam is not None and fam not in ("lookup", "search"):
                controller = fam
                break
        if controller is None:
            for w in words:
                if w in families_by_word:
                    controller = families_by_word[w]
                    break
        if controller is None:
            gh = sorted(_hits(low, set(words), _GATE_INDEX, _GATE_PHRASES))
            controller = f"gate_{gh[0]}" if gh else "other"
        km = _CHECK_KIND_RE.search(low)
        kind = km.lastgroup if km and km.lastgroup else "other"
        groups.setdefault(controller, Counter())[kind] += 1
    check_groups = [{"controlled_by": c, "kinds": sorted(k), "size": int(sum(k.values()))}
                    for c, k in sorted(groups.items())]

    # conflicts
    conflicts: set[tuple[str, tuple[str, ...]]] = set()
    for kind in _conflicts_in(" \n ".join([instr_low, *checks_low])):
        if kind == "destructive":
            fams = tuple(sorted({info["family"] for info, _r, _p in focus if info["effect"] == "destructive"
                                 or info["family"] in ("delete", "transfer")}))
            conflicts.add(("destructive", fams))
        elif kind == "ordering":
            conflicts.add(("ordering", tuple(f for _p, f in ordered[:2])))
        else:
            conflicts.add((kind, ()))
    for info, req, _p in analysed:
        if req and info["effect"] == "destructive":
            conflicts.add(("destructive", (info["family"],)))

    # literals (instruction and checks), by category only
    literals: Counter[str] = Counter()
    for text in (instruction[:max_chars], *[c[:max_chars] for c in checks]):
        literals.update(_literal_counts(text))

    return {
        "operations": operations,
        "gates": [{"type": g, "provenance": p} for g, p in sorted(gates)],
        "dependencies": [{"from": a, "to": b, "kind": k} for a, b, k in sorted(deps)],
        "check_groups": check_groups,
        "conflicts": [{"type": t, "families": list(f)} for t, f in sorted(conflicts)],
        "literals": dict(sorted(literals.items())),
    }


def abstract_tokens(rep: Mapping[str, Any]) -> dict[str, list[str]]:
    """The token views of an abstract representation (static or LLM), one list per abstract view.

    Tokens are built only from vocabulary values and counts, so two tasks share a token only when they
    share structure.
    """
    ops = rep.get("operations") or []
    op_tokens: list[str] = []
    req = [o for o in ops if o.get("required")]
    for o in ops:
        fam = o.get("family", "other")
        weight = 3 if o.get("required") else 1
        op_tokens += [f"op:{fam}"] * weight + [f"effect:{o.get('effect', 'read')}"] * weight
        for c in o.get("inputs") or []:
            op_tokens.append(f"in:{fam}:{c}")
            if o.get("required"):
                op_tokens.append(f"reqin:{fam}:{c}")
    if req:
        op_tokens.append(f"nreq:{_bin(len(req))}")
    if ops:
        op_tokens.append(f"nops:{_bin(len(ops))}")
    fams_req = Counter(o.get("family", "other") for o in req)
    op_tokens += [f"reqfam:{f}:{_bin(n)}" for f, n in fams_req.items()]

    gate_tokens: list[str] = []
    for g in rep.get("gates") or []:
        gate_tokens += [f"gate:{g.get('type')}", f"gate:{g.get('type')}@{g.get('provenance')}"]
    dep_tokens = [f"dep:{d.get('kind')}:{d.get('from')}>{d.get('to')}" for d in rep.get("dependencies") or []]
    dep_tokens += [f"depkind:{d.get('kind')}" for d in rep.get("dependencies") or []]
    check_tokens: list[str] = []
    groups = rep.get("check_groups") or []
    if groups:
        check_tokens.append(f"ngroups:{_bin(len(groups))}")
    for g in groups:
        c = g.get("controlled_by", "other")
        check_tokens.append(f"group:{c}")
        check_tokens.append(f"groupsize:{c}:{_bin(int(g.get('size', 1)))}")
        check_tokens += [f"check:{c}:{k}" for k in g.get("kinds") or []]
    conflict_tokens: list[str] = []
    for c in rep.get("conflicts") or []:
        conflict_tokens.append(f"conflict:{c.get('type')}")
        conflict_tokens += [f"conflict:{c.get('type')}:{f}" for f in c.get("families") or []]
    literal_tokens: list[str] = []
    for cat, n in (rep.get("literals") or {}).items():
        literal_tokens += [f"lit:{cat}", f"lit:{cat}:{_bin(int(n))}"]
    return {
        "operations": op_tokens,
        "gates": gate_tokens,
        "dependencies": dep_tokens,
        "check_groups": check_tokens,
        "conflicts": conflict_tokens,
        "literals": literal_tokens,
    }


#: JSON schema of the abstract representation (what the LLM extractor must return).
ABSTRACTION_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "EnvSched abstract task representation (appendix E.1)",
    "type": "object",
    "additionalProperties": False,
    "required": ["operations", "gates", "dependencies", "check_groups", "conflicts"],
    "properties": {
        "operations": {
            "type": "array", "maxItems": 200,
            "items": {
                "type": "object", "additionalProperties": False,
                "required": ["family", "effect"],
                "properties": {
                    "family": {"enum": list(OPERATION_FAMILIES)},
                    "effect": {"enum": list(EFFECTS)},
                    "inputs": {"type": "array", "items": {"enum": list(INPUT_CATEGORIES)}, "maxItems": 30},
                    "required": {"type": "boolean"},
                },
            },
        },
        "gates": {
            "type": "array", "maxItems": 100,
            "items": {
                "type": "object", "additionalProperties": False, "required": ["type", "provenance"],
                "properties": {"type": {"enum": list(GATE_TYPES)}, "provenance": {"enum": list(GATE_PROVENANCES)}},
            },
        },
        "dependencies": {
            "type": "array", "maxItems": 200,
            "items": {
                "type": "object", "additionalProperties": False, "required": ["from", "to", "kind"],
                "properties": {
                    "from": {"enum": list(OPERATION_FAMILIES) + list(GATE_TYPES)},
                    "to": {"enum": list(OPERATION_FAMILIES)},
                    "kind": {"enum": list(DEPENDENCY_KINDS)},
                },
            },
        },
        "check_groups": {
            "type": "array", "maxItems": 100,
            "items": {
                "type": "object", "additionalProperties": False, "required": ["controlled_by", "size"],
                "properties": {
                    "controlled_by": {"enum": list(OPERATION_FAMILIES) + [f"gate_{g}" for g in GATE_TYPES]},
                    "kinds": {"type": "array", "items": {"enum": list(CHECK_KINDS)}},
                    "size": {"type": "integer", "minimum": 1, "maximum": 10000},
                },
            },
        },
        "conflicts": {
            "type": "array", "maxItems": 100,
            "items": {
                "type": "object", "additionalProperties": False, "required": ["type"],
                "properties": {
                    "type": {"enum": list(CONFLICT_TYPES)},
                    "families": {"type": "array", "items": {"enum": list(OPERATION_FAMILIES)}},
                },
            },
        },
        "literals": {
            "type": "object", "additionalProperties": False,
            "properties": {c: {"type": "integer", "minimum": 0} for c in LITERAL_CATEGORIES},
        },
    },
}
