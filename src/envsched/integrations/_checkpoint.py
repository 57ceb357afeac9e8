"""The sampler file every trainer integration writes into a trainer checkpoint folder.

One JSON file, ``envsched_sampler.json``, written atomically (a temporary file renamed over it), so a crash
mid-write leaves the previous file or none. What goes in it is each integration's own format.
"""

from __future__ import annotations

import json
import os
from typing import Any

SAMPLER_STATE_FILE = "envsched_sampler.json"


def write_state_file(folder: str, payload: dict[str, Any]) -> str:
    """Write ``payload`` as ``folder/envsched_sampler.json`` (atomically); returns the path."""
    path = os.path.join(folder, SAMPLER_STATE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)
    return path


def read_state_file(folder: str) -> tuple[str, Any]:
    """``(path, parsed JSON)`` of ``folder/envsched_sampler.json``; ``FileNotFoundError`` when the checkpoint
    has none (it was not written by an envsched trainer, so the sampler cannot resume its draws)."""
    path = os.path.join(folder, SAMPLER_STATE_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: the checkpoint was not written by an envsched trainer, so the "
                                "sampler cannot resume its draws")
    with open(path) as f:
        return path, json.load(f)
