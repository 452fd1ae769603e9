"""The benchmark JSON convention every bench script follows with `--json PATH`:

    {"benchmark": "<name>", "machine": "<host> / <n> CPUs / <cpu model> / Linux <release>",
     "date": "<ISO 8601, UTC>", "figures": {"<flat name>": <number>, ...}, ...extra}

`figures` holds the numbers the report judges against the issue's goals;
the extra keys hold what its plots need (raw samples, rows).  Import it from
a script with its own folder on sys.path (`from report_common import ...`).
"""

from __future__ import annotations

import json
import math
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('' where it says none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return ""


def machine() -> str:
    """One line naming the machine: host, CPUs, CPU model, kernel."""
    parts = [platform.node() or "?", f"{os.cpu_count()} CPUs"]
    if model := cpu_model():
        parts.append(model)
    parts.append(f"{platform.system()} {platform.release()}")
    return " / ".join(parts)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (q in [0, 1])."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def document(name: str, figures: dict[str, float], **extra: Any) -> dict[str, Any]:
    """The convention's object for benchmark `name`."""
    for key, value in figures.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"figure {key!r} is not a number: {value!r}")
    return {"benchmark": name, "machine": machine(), "date": now(), "figures": figures, **extra}


def write_json(path: Path | str | None, name: str, figures: dict[str, float], **extra: Any) -> None:
    """Write the convention's object to `path` (nothing when it is None)."""
    if path is None:
        return
    doc = document(name, figures, **extra)
    Path(path).write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
