"""Synthetic task pools for the graph benchmark, generated from realistic templates.

Not real tasks: each environment gets a business domain (airline, retail, clinic...), a tool set built
from operation families x domain entities (with descriptions and JSON-schema parameters like tau2-bench
or ACEBench tools), and each task an instruction with literals (ids, dates, amounts), verifier checks,
verifier code and an initial state. Environments of different domains therefore share execution
structure (lookup -> authorise -> modify) but no identifiers, as the real pools do. Deterministic for a
given seed. Used only to measure speed and memory at sizes no real pool here has.
"""

from __future__ import annotations

import random
from typing import Any

DOMAINS: dict[str, list[str]] = {
    "airline": ["reservation", "flight", "passenger", "baggage", "seat"],
    "retail": ["order", "product", "item", "payment", "address"],
    "clinic": ["patient", "appointment", "doctor", "prescription", "slot"],
    "bank": ["account", "transaction", "card", "loan", "statement"],
    "insurance": ["policy", "claim", "coverage", "member", "premium"],
    "library": ["book", "loan", "member", "hold", "fine"],
    "hotel": ["booking", "room", "guest", "invoice", "stay"],
    "telecom": ["line", "plan", "device", "bill", "roaming"],
    "school": ["student", "course", "grade", "enrollment", "teacher"],
    "logistics": ["shipment", "package", "carrier", "route", "warehouse"],
    "hr": ["employee", "leave", "payroll", "position", "review"],
    "realestate": ["listing", "lease", "tenant", "unit", "inspection"],
    "gym": ["membership", "class", "trainer", "session", "locker"],
    "vet": ["pet", "owner", "visit", "vaccine", "invoice"],
    "blood_bank": ["donor", "donation", "facility", "appointment", "eligibility"],
    "licensing": ["license", "applicant", "exam", "renewal", "violation"],
}
FAMILIES: list[tuple[str, str, str]] = [
    ("get", "{e}_details", "Get the details of a {e} by its id. Returns the {e} record or an error if not found."),
    ("find", "{e}_by_name", "Find the {e} id from a name. The {e} must exist."),
    ("list", "{e}s", "List the {e}s of the current user, optionally filtered by status."),
    ("create", "{e}", "Create a new {e}. The user must be logged in and authorized."),
    ("update", "{e}", "Update a {e}. Only allowed if the {e} status is active or pending."),
    ("cancel", "{e}", "Cancel a {e}. This cannot be undone. Refund only within 24 hours of booking."),
    ("transfer", "{e}", "Transfer a {e} to another owner; the balance must be sufficient."),
    ("send", "{e}_notice", "Send a notice about a {e} to the user by email."),
    ("calculate", "{e}_total", "Calculate the total cost of a {e} including fees."),
    ("reschedule", "{e}", "Reschedule a {e} to a new date and time slot, if available."),
]
NAMES = ["Ava", "Ben", "Chen", "Dana", "Eve", "Farah", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lena", "Mo", "Nia"]
STATUSES = ["active", "pending", "cancelled", "delivered", "closed", "approved"]


def _tool(verb: str, pattern: str, desc: str, entity: str) -> dict[str, Any]:
    name = f"{verb}_{pattern.format(e=entity)}"
    props: dict[str, Any] = {f"{entity}_id": {"type": "string", "description": f"The {entity} id."}}
    if verb in ("create", "update", "reschedule"):
        props["date"] = {"type": "string", "description": "Date as YYYY-MM-DD."}
    if verb in ("transfer", "calculate"):
        props["amount"] = {"type": "number", "description": "Amount in dollars."}
    if verb == "find":
        props = {"name": {"type": "string", "description": "Full name."}}
    if verb == "send":
        props["message"] = {"type": "string", "description": "Message body."}
    return {"name": name, "description": desc.format(e=entity),
            "parameters": {"type": "object", "properties": props, "required": list(props)}}


def make_env(env_id: int, rng: random.Random) -> dict[str, Any]:
    domain = rng.choice(list(DOMAINS))
    entities = rng.sample(DOMAINS[domain], 3)
    tools = [{"name": "login_user", "description": "Log in the user with a password.",
              "parameters": {"type": "object", "properties": {"user_id": {"type": "string"},
                                                             "password": {"type": "string"}}}}]
    for e in entities:
        for verb, pattern, desc in rng.sample(FAMILIES, rng.randint(2, 4)):
            tools.append(_tool(verb, pattern, desc, e))
    return {"name": f"env_{env_id:05d}_{domain}", "domain": domain, "entities": entities, "tools": tools}


def make_task(env: dict[str, Any], t: int, rng: random.Random) -> dict[str, Any]:
    tools = env["tools"]
    steps = rng.sample(tools[1:], min(len(tools) - 1, rng.randint(1, 4)))
    who = rng.choice(NAMES)
    ident = f"{rng.choice('ABCDEFGHJK')}{rng.randint(10000, 99999)}"
    parts = [f"You are {who} (user id {who.lower()}_{rng.randint(100, 9999)})."]
    checks, code = [], []
    for tool in steps:
        verb, _, rest = tool["name"].partition("_")
        obj = rest.replace("_", " ")
        if verb in ("get", "find", "list"):
            parts.append(f"First {verb} the {obj} {ident}.")
        elif verb == "cancel":
            parts.append(f"Then cancel the {obj} {ident} if it was booked within 24 hours; otherwise keep it.")
            checks.append(f"{obj} {ident} status is cancelled")
            code.append(f"assert db['{rest}s']['{ident}']['status'] == 'cancelled'")
        elif verb in ("update", "reschedule", "create"):
            day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            parts.append(f"Then {verb} the {obj} to {day} at {rng.randint(8, 18)}:00.")
            status = rng.choice(STATUSES)
            checks.append(f"{obj} {ident} date equals {day} and status is {status}")
            code.append(f"assert db['{rest}s']['{ident}']['date'] == '{day}'")
        elif verb in ("transfer", "calculate"):
            amt = f"${rng.randint(5, 900)}.{rng.randint(0, 99):02d}"
            parts.append(f"{verb.capitalize()} {amt} for the {obj}; the balance must be sufficient.")
            checks.append(f"total for {obj} equals {amt}")
            code.append(f"assert abs(db['{rest}s']['{ident}']['total'] - {amt[1:]}) < 0.01")
        else:
            parts.append(f"Finally {verb} the user a message confirming the {obj}.")
            checks.append(f"agent mentions the {obj} confirmation")
    state = {"session": {"logged_in": rng.random() < 0.5},
             f"{env['entities'][0]}s": {ident: {"status": rng.choice(STATUSES), "owner": who.lower()}}}
    return {"id": f"{env['name']}/task_{t}", "env": env["name"], "split": "train", "index": t,
            "instruction": " ".join(parts), "tools": tools, "initial_state": state,
            "verifier": {"checks": checks, "code": "\n".join(code)}}


def synthetic_specs(n_tasks: int, n_envs: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n_tasks`` task specs spread evenly over ``n_envs`` synthetic environments."""
    rng = random.Random(seed)
    envs = [make_env(e, rng) for e in range(n_envs)]
    return [make_task(envs[i % n_envs], i // n_envs, rng) for i in range(n_tasks)]
