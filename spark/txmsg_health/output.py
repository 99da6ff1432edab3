"""Write ``summary.json`` atomically, so a reader never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_summary(out: str, summary: dict[str, Any]) -> str:
    """Write ``out/summary.json`` (top level ``flagged`` and ``groups`` first) and return its path."""
    os.makedirs(out, exist_ok=True)
    ordered = {"flagged": summary["flagged"], "groups": summary["groups"]}
    ordered.update({k: v for k, v in summary.items() if k not in ordered})
    path = os.path.join(out, "summary.json")
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".summary.", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(ordered, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)
    return path
