"""Decision logs: one line per decision the daemon takes about a container
(placed, refused, released, resized), and the log formats (config `log_format`).

Text (``log_format: text``), greppable, logfmt-style::

    2026-11-24 06:40:01,123 INFO nri_gpushare.decisions: decision=placed
    container=4f1c... pod=ml/train name=main gpus=0(GPU-8a1c...) memory=8Gi core=30
    priority=normal isolation=full

A resize (`nri-gpushare resize`) is ``decision=resized`` with the new
``memory``, ``core`` and ``priority`` and the old ones as ``was_memory``,
``was_core``, ``was_priority``; a refused resize is ``decision=refused``
with ``operation=resize``.

A value with a blank, a quote, ``=`` or a character that is not printable is
written in double quotes with ``\\``, ``"`` and those characters escaped, so
a value a pod chose (its name, a refusal message quoting its annotations)
can neither start a new line nor forge a field.  Every other log line's
message is escaped the same way (not quoted): one record, one line, but
for a traceback, which follows on lines indented by two spaces (escaped
too): a line that does not start with a time continues the record above.

JSON (``log_format: json``): every log line is one JSON object with ``ts``
(UTC, ISO 8601), ``level``, ``logger`` and ``msg``; a decision adds
``decision`` and its fields (``container``, ``pod``, ``origin``, ``name``,
``gpus`` [{index, uuid}], ``memory`` and ``core`` per GPU, ``reason``,
``message``, ``why``, ...); a traceback goes to ``exc``.

Refusal reasons are classified into a fixed set (`REFUSAL_REASONS`) for the
metrics' ``reason`` label: never free text.

Lines decided while answering the runtime may be held (`DecisionLog.held`)
and written right after the answer is sent: the runtime does not wait for
the log.  Counts are taken at once either way.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from nri_gpushare.share.model import Allocation, ContainerInfo
from nri_gpushare.units import format_bytes

# The logger's name is what operators filter the decision log by: it stays
# "nri_gpushare.decisions" wherever this module lives.
log = logging.getLogger("nri_gpushare.decisions")

DECISIONS = ("placed", "refused", "released", "resized")

REFUSAL_REASONS = (
    "capacity",  # does not fit on the GPUs (memory, core, high-priority slots)
    "fragmentation",  # admitted by the kubelet on the node's free total; no GPU has its part
    "invalid_request",  # a bad value, or sources that disagree
    "source_denied",  # the node does not take requests from there (config `sources`)
    "claim",  # a DRA claim's variable the container may not use (not prepared, held, not its pod)
    "interposer_missing",  # isolation full|memory needs libgpushare.so, the node lacks it
    "kmod",  # the kernel module refused, is missing, or did not bind
    "state",  # the allocation could not be recorded
    "timeout",  # not placed within the runtime's (or the caller's) time
    "unavailable",  # containerd could not be asked (labels of a hand-started container)
    "other",
)
"""The `reason` label's values: the domain's ShareRefused reasons, classified."""

_REASON_CLASS = {
    "capacity": "capacity",
    "fragmentation": "fragmentation",
    "invalid": "invalid_request",
    "conflict": "invalid_request",
    "forbidden": "source_denied",
    "claim": "claim",
    "interposer": "interposer_missing",
    "kmod": "kmod",
    "state": "state",
    "timeout": "timeout",
    "unavailable": "unavailable",
}


def refusal_reason(reason: str) -> str:
    """The `REFUSAL_REASONS` entry for a ShareRefused or local-API reason."""
    return _REASON_CLASS.get(reason, "other")


# -- the decisions -------------------------------------------------------------------

Fields = dict[str, Any] | Callable[[], dict[str, Any]]


@dataclass
class DecisionLog:
    """Logs each decision once and counts them (for the metrics): refusals
    by reason class.  Used on the event loop only."""

    counts: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)

    def placed(self, alloc: Allocation) -> None:
        if not log.isEnabledFor(logging.INFO):  # counted, not logged
            self.counts["placed"] += 1
            return
        self._emit("placed", logging.INFO, lambda: _who(alloc) | _shares(alloc))

    def released(self, alloc: Allocation, why: str) -> None:
        if not log.isEnabledFor(logging.INFO):
            self.counts["released"] += 1
            return
        self._emit("released", logging.INFO, _who(alloc) | _shares(alloc) | {"why": why})

    def resized(self, old: Allocation, new: Allocation) -> None:
        was = _shares(old)
        fields = _who(new) | _shares(new)
        fields |= {f"was_{key}": was[key] for key in ("memory", "core", "priority")}
        self._emit("resized", logging.INFO, fields)

    def refused(
        self,
        container_id: str,
        reason: str,
        message: str,
        *,
        pod: str = "",
        name: str = "",
        origin: str = "",
        operation: str = "",
    ) -> None:
        """`message`: what the caller is told (kubectl describe, the terminal);
        `operation`: what was refused when it is not a create ("resize")."""
        kind = refusal_reason(reason)
        self.refusals[kind] += 1
        fields: dict[str, Any] = {"container": container_id}
        if pod:
            fields["pod"] = pod
        if origin:
            fields["origin"] = origin
        fields["name"] = name
        if operation:
            fields["operation"] = operation
        fields |= {"reason": kind, "message": message}
        self._emit("refused", logging.WARNING, fields)

    def refused_container(
        self, c: ContainerInfo, reason: str, message: str, origin: str = ""
    ) -> None:
        self.refused(c.id, reason, message, pod=c.pod, name=c.name, origin=origin)

    def _emit(self, decision: str, level: int, fields: Fields) -> None:
        """`fields`, or what makes them (an allocation is immutable: they can
        wait until the line is written)."""
        self.counts[decision] += 1
        held = _HELD.get()
        if held is not None:
            held.append((decision, level, fields))
        else:
            _write(decision, level, fields)

    @contextmanager
    def held(self, release: Callable[[Callable[[], None]], object]) -> Iterator[None]:
        """Hold the lines decided inside (in this task only) and hand their
        writing to `release` when it ends (the daemon: the event loop's
        `call_soon`, which runs after the answer being made is sent)."""
        lines: list[tuple[str, int, Fields]] = []
        token = _HELD.set(lines)
        try:
            yield
        finally:
            _HELD.reset(token)
            if lines:
                release(lambda: _write_all(lines))


_HELD: ContextVar[list[tuple[str, int, Fields]] | None] = ContextVar(
    "gpushare_held_decisions", default=None
)


def _write(decision: str, level: int, fields: Fields) -> None:
    if not isinstance(fields, dict):
        fields = fields()
    # The line is written only when a handler formats the record: nothing
    # is formatted on the event loop for a level that is off.
    log.log(level, "%s", _Line(decision, fields), extra={"decision": decision, "fields": fields})


def _write_all(lines: list[tuple[str, int, Fields]]) -> None:
    for decision, level, fields in lines:
        _write(decision, level, fields)


class _Line:
    """A decision's logfmt text, made the first time a handler asks for it."""

    __slots__ = ("decision", "fields", "_text")

    def __init__(self, decision: str, fields: dict[str, Any]) -> None:
        self.decision = decision
        self.fields = fields
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = logfmt({"decision": self.decision, **self.fields})
        return self._text


def _who(alloc: Allocation) -> dict[str, Any]:
    who: dict[str, Any] = {"container": alloc.container_id}
    if alloc.pod:
        who["pod"] = alloc.pod
    if alloc.local:
        who["origin"] = alloc.where
    who["name"] = alloc.name
    return who


def _shares(alloc: Allocation) -> dict[str, Any]:
    return {
        "gpus": [{"index": s.index, "uuid": s.uuid} for s in alloc.shares],
        "memory": [s.memory_bytes for s in alloc.shares],
        "core": [s.core_percent for s in alloc.shares],
        "priority": alloc.priority,
        "isolation": alloc.isolation,
    }


# -- text: logfmt-style, escaped ---------------------------------------------------------

_NEEDS_QUOTES = re.compile(r'[ "=\\]')
"""Characters that make a printable value quoted."""
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(text: str) -> str:
    """`text` on one line: backslash, quote and characters that are not
    printable escaped."""
    if text.isprintable() and "\\" not in text and '"' not in text:
        return text  # the usual case: nothing to escape
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif not c.isprintable():
            out.append(repr(c)[1:-1] if c != "'" else c)
        else:
            out.append(c)
    return "".join(out)


def value_text(value: Any) -> str:
    """A field's value as the text format writes it, quoted when it must be."""
    text = _plain(value)
    if text and text.isprintable() and _NEEDS_QUOTES.search(text) is None:
        return text
    return f'"{escape(text)}"'


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple) or isinstance(value, Sequence):  # the cheap test first
        return ",".join(_item(v) for v in value)
    return str(value)


def _item(value: Any) -> str:
    if isinstance(value, str | int):
        return str(value)
    if isinstance(value, Mapping) and "index" in value:  # a GPU: 0(GPU-...)
        return f"{value['index']}({value.get('uuid', '')})"
    return str(value)


def logfmt(fields: Mapping[str, Any]) -> str:
    """`key=value ...`; memory in the project's size notation, core 0 as '-'."""
    parts = []
    for key, value in fields.items():
        if key in ("memory", "was_memory"):
            value = [format_bytes(v) for v in value]
        elif key in ("core", "was_core"):
            value = [str(v) if v else "-" for v in value]
        parts.append(f"{key}={value_text(value)}")
    return " ".join(parts)


class TextFormatter(logging.Formatter):
    """The usual `time LEVEL logger: message`, the message on one line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        if getattr(record, "decision", None) is None:  # decisions are escaped already
            record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return _continuation(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return _continuation(super().formatStack(stack_info))


def _continuation(text: str) -> str:
    """A traceback under its record: each line indented and escaped, so that
    an exception's message quoting a pod's value cannot start a line that
    reads as a record of its own."""
    return "\n".join(
        "  " + "".join(c if c.isprintable() else escape(c) for c in line)
        for line in text.split("\n")
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record (json.dumps escapes whatever a value holds)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        document: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        decision = getattr(record, "decision", None)
        if decision is not None:
            fields = getattr(record, "fields", {})
            document["msg"] = _sentence(decision, fields)
            document["decision"] = decision
            document.update(
                (k, v) for k, v in fields.items() if k not in ("ts", "level", "logger", "msg")
            )
        else:
            document["msg"] = record.getMessage()
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exc"] = record.exc_text
        return json.dumps(document, ensure_ascii=False, default=str)


def _sentence(decision: str, fields: Mapping[str, Any]) -> str:
    """The decision for a person: 'refused container x (pod ns/name): ...'."""
    who = f"container {fields.get('name') or fields.get('container')}"
    if fields.get("pod"):
        who += f" (pod {fields['pod']})"
    elif fields.get("origin"):
        who += f" ({fields['origin']})"
    if decision == "refused":
        return f"refused {who}: {fields.get('message', '')}"
    gpus = ", ".join(
        f"GPU {g['index']} {format_bytes(m)}" + (f" {c}%" if c else "")
        for g, m, c in zip(fields["gpus"], fields["memory"], fields["core"], strict=False)
    )
    why = f" ({fields['why']})" if fields.get("why") else ""
    return f"{decision} {who}: {gpus}{why}"


def configure_logging(level: str, fmt: str) -> None:
    """The root logger to stderr in `fmt` ("text" or "json") at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Neither format shows the caller, thread or process: not gathered for each
    # record (the logging HOWTO's "Optimization"), a decision line on every create.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
