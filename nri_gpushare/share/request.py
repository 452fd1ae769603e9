"""Turn a container's annotations, labels and environment into one share request.

Sources, highest first (precedence is per attribute):

1. per-container pod annotation  ``gpushare.io/container.<name>.<key>``
2. pod-wide pod annotation       ``gpushare.io/<key>``
3. container annotation or label ``gpushare.io/<key>`` (ctr/nerdctl); these two
   are one level: if both are set and disagree, that is an error.
4. environment: cGPU variables and eGPU's ``EGPU=``; if both are set and
   disagree on an attribute, that is an error.

Levels 1-3 resolve by precedence.  The environment is not overridden silently:
when levels 1-3 and the environment both set an attribute and the values
differ, the request is refused with a message naming both.  Values that agree
are fine (``gpu-memory: 3Gi`` and ``ALIYUN_COM_GPU_MEM_CONTAINER=3``); the
higher source then supplies its defaults (e.g. the GPU count).

Keys (values are trimmed; enumerations are case-insensitive):

- ``gpu-memory``: per GPU.  ``Ki Mi Gi Ti`` are binary, ``K M G T`` decimal
  (a trailing ``B`` is accepted), a bare number is GiB; fractions are allowed
  when they give whole bytes.  A comma list is one value per GPU in order; a
  short list repeats its last value.  ``0`` opts the container out.
- ``gpu-core``: percent of each GPU, a multiple of 5 in 5..100; a list as above.
  Absent: no compute limit.
- ``gpu-count``: number of GPUs.  Default: the length of ``gpu-devices``, else
  of the longest list.
- ``gpu-devices``: GPU indexes or UUIDs, in the container's GPU order.
- ``priority``: normal | high.  ``placement``: binpack | spread (default from
  the node).  ``isolation``: full | memory (memory only; ``gpu-core`` is then an
  error) | none (placed and accounted, environment injected, not registered
  with the kernel module).

A container is managed when its resolved ``gpu-memory`` is non-zero.  Without
``gpu-memory``, ``gpu-core``/``gpu-count``/``gpu-devices`` set on the container
itself (per-container annotation, container annotation or label) are an error;
pod-wide ones simply do not apply to it, so a pod can share GPUs with some of
its containers only.

cGPU environment (considered only when ``ALIYUN_COM_GPU_MEM_CONTAINER`` is set
or ``CGPU_DISABLE`` is true, as cGPU does):

- ``CGPU_DISABLE=true``: not managed (an opt-out: gpu-memory 0).
- ``ALIYUN_COM_GPU_MEM_CONTAINER``: whole GiB, list as above; ``0``: not
  managed.  Without a device list it covers every GPU of the node (``3,1`` on
  4 GPUs is 3,1,1,1 GiB).
- ``ALIYUN_COM_GPU_VISIBLE_DEVICES`` (else an explicit ``NVIDIA_VISIBLE_DEVICES``
  list): the GPUs, by index or UUID.
- ``ALIYUN_COM_GPU_SCHD_WEIGHT=w``, 1..max_inst: 1 is cGPU's default (no
  weighting), so no compute limit; w > 1 gives a compute limit of
  ``floor(20 * w / max_inst) * 5`` percent (w/max_inst of the GPU, rounded down
  to a multiple of 5), so weights within cGPU's sum rule stay within 100%.
- ``ALIYUN_COM_GPU_HIGH_PRIO``: 1/true = high, 0/false = normal.
- ``ALIYUN_COM_GPU_MEM_DEV``: the GPU size in whole GiB, informative only: it
  must be a positive integer; a mismatch with the placed GPU is only logged.

eGPU: ``EGPU="POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10:..."``: an
optional header of node settings (ignored), then one block per GPU: ``PGPU``
the GPU index, ``MEM`` MiB, ``WEIGHT`` compute percent 1..100 (absent: no
limit on that GPU).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from .model import (
    ASSIGNED,
    ISOLATIONS,
    PLACEMENTS,
    PREFIX,
    PRIORITIES,
    ContainerInfo,
    GiB,
    Gpu,
    MiB,
    NodePolicy,
    ShareRefused,
    format_bytes,
)

log = logging.getLogger(__name__)

KEYS = ("gpu-memory", "gpu-core", "gpu-count", "gpu-devices", "priority", "placement", "isolation")
_ATTR = {
    "gpu-memory": "memory",
    "gpu-core": "core",
    "gpu-count": "count",
    "gpu-devices": "devices",
    "priority": "priority",
    "placement": "placement",
    "isolation": "isolation",
}
_DEMAND = ("core", "count", "devices")

_UNITS = {
    "": GiB,
    "Ki": 1 << 10,
    "Mi": MiB,
    "Gi": GiB,
    "Ti": 1 << 40,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
_QUANTITY = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT]i?|k)B?)?")
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no", "")


@dataclass(frozen=True)
class ShareRequest:
    """A validated request: one entry per GPU slot, in the container's GPU order."""

    memory_bytes: tuple[int, ...]
    core_percent: tuple[int, ...]  # 0 = no compute limit on that GPU
    devices: tuple[int, ...] | None  # GPU indexes; None: placement chooses
    priority: str
    placement: str
    isolation: str
    keys: Mapping[str, str]  # attribute -> the key a person changes
    memory_dev_bytes: int | None = None  # ALIYUN_COM_GPU_MEM_DEV, informative

    @property
    def count(self) -> int:
        return len(self.memory_bytes)

    def describe(self) -> str:
        text = f"gpu-memory {','.join(format_bytes(m) for m in self.memory_bytes)}"
        if any(self.core_percent):
            text += f", gpu-core {','.join(str(c) for c in self.core_percent)}"
        if self.priority == "high":
            text += ", priority high"
        return text


class _Invalid(Exception):
    """A value's problem, without the key (the caller knows the key)."""


@dataclass(frozen=True)
class _Value:
    value: object
    cite: str  # "pod annotation gpushare.io/gpu-memory=2Gi"
    key: str  # what a person edits
    level: str  # "container" (set on the container itself), "pod" or "env"
    default_count: int | None = None


def parse_request(c: ContainerInfo, gpus: Sequence[Gpu], policy: NodePolicy) -> ShareRequest | None:
    """The container's validated request, or None when it is not managed.

    Raises ShareRefused (reason "invalid" or "conflict") naming the key, the
    value and what is allowed.  Nothing is reserved here.
    """
    return _Parser(c, gpus, policy).parse()


class _Parser:
    def __init__(self, c: ContainerInfo, gpus: Sequence[Gpu], policy: NodePolicy) -> None:
        self.c = c
        self.gpus = list(gpus)
        self.policy = policy
        self.by_uuid = {g.uuid.lower(): g.index for g in self.gpus}
        self.indexes = {g.index for g in self.gpus}

    def fail(self, message: str, key: str | None, reason: str = "invalid") -> ShareRefused:
        return ShareRefused(f"gpushare: {self.c.describe()}: {message}", reason, key)

    # -- entry point ---------------------------------------------------------

    def parse(self) -> ShareRequest | None:
        upper = self._annotation_levels()
        env = self._merge(self._cgpu(), self._egpu())
        merged = self._merge(upper, env)
        memory = merged.get("memory")
        if memory is None or memory.value == (0,):
            if memory is None:
                self._demand_without_memory(merged)
            return None
        return self._resolve(merged)

    # -- sources ---------------------------------------------------------------

    def _annotation_levels(self) -> dict[str, _Value]:
        c = self.c
        own = f"{PREFIX}container.{c.name}."
        self._check_pod_keys(c.pod_annotations)
        self._check_container_keys(c.annotations, "container annotation")
        self._check_container_keys(c.labels, "container label")
        out: dict[str, _Value] = {}
        for key in KEYS:
            attr = _ATTR[key]
            if (text := c.pod_annotations.get(own + key)) is not None:
                out[attr] = self._value(key, text, own + key, "pod annotation", "container")
            elif (text := c.pod_annotations.get(PREFIX + key)) is not None:
                out[attr] = self._value(key, text, PREFIX + key, "pod annotation", "pod")
            else:
                ann, lab = c.annotations.get(PREFIX + key), c.labels.get(PREFIX + key)
                a = b = None
                if ann is not None:
                    a = self._value(key, ann, PREFIX + key, "container annotation", "container")
                if lab is not None:
                    b = self._value(key, lab, PREFIX + key, "container label", "container")
                if a and b and not _same(attr, a.value, b.value):
                    raise self._conflict(a, b)
                if a or b:
                    out[attr] = a or b  # type: ignore[assignment]
        return out

    def _check_pod_keys(self, annotations: Mapping[str, str]) -> None:
        for key in annotations:
            if not key.startswith(PREFIX) or key == ASSIGNED:
                continue
            rest = key[len(PREFIX) :]
            if rest.startswith("container."):
                _, _, name_key = rest.partition(".")
                name, _, sub = name_key.rpartition(".")
                if name and sub in KEYS:
                    continue
                raise self.fail(
                    f"pod annotation {key}: not a known key; per-container keys are "
                    f"{PREFIX}container.<name>.<key> with <key> one of {', '.join(KEYS)}",
                    key,
                )
            if rest not in KEYS:
                raise self._unknown(key, "pod annotation")

    def _check_container_keys(self, values: Mapping[str, str], where: str) -> None:
        for key in values:
            if not key.startswith(PREFIX) or key == ASSIGNED:
                continue
            rest = key[len(PREFIX) :]
            # Pod annotations copied to the container by the runtime: read from the pod.
            if rest.startswith("container."):
                continue
            if rest not in KEYS:
                raise self._unknown(key, where)

    def _unknown(self, key: str, where: str) -> ShareRefused:
        return self.fail(
            f"{where} {key}: not a known key; known keys are {', '.join(PREFIX + k for k in KEYS)}",
            key,
        )

    def _value(self, key: str, text: str, full_key: str, where: str, level: str) -> _Value:
        cite = f"{where} {full_key}={text}"
        try:
            value = _PARSERS[key](self, text.strip())
        except _Invalid as e:
            raise self.fail(f"{cite}: {e}", full_key) from None
        return _Value(value, cite, full_key, level)

    def _cgpu(self) -> dict[str, _Value]:
        env = self.c.env
        disable = env.get("CGPU_DISABLE")
        if disable is not None:
            flag = disable.strip().lower()
            if flag in _TRUE:
                return {"memory": _Value((0,), f"CGPU_DISABLE={disable}", "CGPU_DISABLE", "env")}
            if flag not in _FALSE:
                raise self.fail(f"CGPU_DISABLE={disable}: must be true or false", "CGPU_DISABLE")
        text = env.get("ALIYUN_COM_GPU_MEM_CONTAINER")
        if text is None or not text.strip():
            return {}
        key = "ALIYUN_COM_GPU_MEM_CONTAINER"
        try:
            gib = _int_list(text, 0, None)
            if len(gib) > 1 and 0 in gib:
                raise _Invalid("0 opts out and cannot be one value of a list")
        except _Invalid as e:
            raise self.fail(
                f"{key}={text}: {e}; use whole GiB per GPU, e.g. 3 or 3,1 (0: no sharing)", key
            ) from None
        memory = tuple(v * GiB for v in gib)
        out = {
            "memory": _Value(
                memory, f"environment {key}={text}", key, "env", default_count=len(self.gpus)
            )
        }
        if memory == (0,):
            return out
        for var in ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
            devs = env.get(var)
            if devs is None or devs.strip().lower() in ("", "all", "none", "void"):
                continue
            try:
                out["devices"] = _Value(
                    self._devices(devs.strip()), f"environment {var}={devs}", var, "env"
                )
            except _Invalid as e:
                raise self.fail(f"{var}={devs}: {e}", var) from None
            break
        if (w := env.get("ALIYUN_COM_GPU_SCHD_WEIGHT")) is not None and w.strip():
            var = "ALIYUN_COM_GPU_SCHD_WEIGHT"
            max_inst = self.policy.max_inst
            try:
                (weight,) = _int_list(w, 1, max_inst, single=True)
            except _Invalid:
                raise self.fail(
                    f"{var}={w}: must be a whole number between 1 and {max_inst} "
                    f"(max_inst of this node)",
                    var,
                ) from None
            if weight > 1:
                core = max(5, 20 * weight // max_inst * 5)
                out["core"] = _Value((core,), f"environment {var}={w} ({core}%)", var, "env")
        if (p := env.get("ALIYUN_COM_GPU_HIGH_PRIO")) is not None:
            var = "ALIYUN_COM_GPU_HIGH_PRIO"
            flag = p.strip().lower()
            if flag not in _TRUE + _FALSE:
                raise self.fail(f"{var}={p}: must be 1 (high) or 0 (normal)", var)
            prio = "high" if flag in _TRUE else "normal"
            out["priority"] = _Value(prio, f"environment {var}={p}", var, "env")
        return out

    def _memory_dev(self) -> int | None:
        var = "ALIYUN_COM_GPU_MEM_DEV"
        text = self.c.env.get(var)
        if text is None or not text.strip():
            return None
        try:
            (gib,) = _int_list(text, 1, None, single=True)
        except _Invalid:
            raise self.fail(f"{var}={text}: must be the GPU's memory in whole GiB", var) from None
        return gib * GiB

    def _egpu(self) -> dict[str, _Value]:
        text = self.c.env.get("EGPU")
        if text is None or not text.strip():
            return {}
        blocks = [b.strip() for b in text.strip().split(":")]
        parsed: list[dict[str, str]] = []
        for number, block in enumerate(blocks):
            fields: dict[str, str] = {}
            for item in filter(None, (i.strip() for i in block.split(","))):
                name, eq, value = item.partition("=")
                if not eq:
                    raise self.fail(f"EGPU block '{block}': '{item}' is not NAME=VALUE", "EGPU")
                fields[name.strip().upper()] = value.strip()
            if number == 0 and "PGPU" not in fields:
                continue  # header: node settings (POLICY, ONLINE, TYPE), not ours
            parsed.append(fields)
        if not parsed:
            raise self.fail(
                "EGPU has no GPU block; expected PGPU=<index>,MEM=<MiB>[,WEIGHT=<percent>] "
                "blocks separated by ':'",
                "EGPU",
            )
        devices: list[int] = []
        memory: list[int] = []
        core: list[int] = []
        for fields in parsed:
            block = ",".join(f"{k}={v}" for k, v in fields.items())

            def bad(what: str, block: str = block) -> ShareRefused:
                return self.fail(f"EGPU block '{block}': {what}", "EGPU")

            if unknown := set(fields) - {"PGPU", "MEM", "WEIGHT"}:
                raise bad(f"unknown field {', '.join(sorted(unknown))}; allowed PGPU, MEM, WEIGHT")
            if "PGPU" not in fields or "MEM" not in fields:
                raise bad("needs PGPU=<GPU index> and MEM=<MiB>")
            try:
                devices.extend(self._devices(fields["PGPU"], indexes_only=True))
            except _Invalid as e:
                raise bad(f"PGPU={fields['PGPU']}: {e}") from None
            try:
                memory.extend(m * MiB for m in _int_list(fields["MEM"], 1, None, single=True))
            except _Invalid:
                raise bad(f"MEM={fields['MEM']}: must be a whole number of MiB, at least 1") from (
                    None
                )
            if "WEIGHT" in fields:
                try:
                    core.extend(_int_list(fields["WEIGHT"], 1, 100, single=True))
                except _Invalid:
                    raise bad(
                        f"WEIGHT={fields['WEIGHT']}: must be a percentage between 1 and 100"
                    ) from None
            else:
                core.append(0)
        if len(set(devices)) != len(devices):
            raise self.fail(f"EGPU={text}: a GPU appears in two blocks", "EGPU")
        listed = ",".join(str(d) for d in devices)
        out = {
            "memory": _Value(
                tuple(memory),
                f"environment EGPU MEM={','.join(str(m // MiB) for m in memory)} (MiB)",
                "EGPU",
                "env",
            ),
            "devices": _Value(tuple(devices), f"environment EGPU PGPU={listed}", "EGPU", "env"),
        }
        if any(core):
            cite = f"environment EGPU WEIGHT={','.join(str(x) for x in core)}"
            out["core"] = _Value(tuple(core), cite, "EGPU", "env")
        return out

    # -- combining ---------------------------------------------------------------

    def _merge(self, high: dict[str, _Value], low: dict[str, _Value]) -> dict[str, _Value]:
        out = dict(low)
        for attr, a in high.items():
            b = low.get(attr)
            if b is not None and not _same(attr, a.value, b.value):
                raise self._conflict(a, b)
            out[attr] = a
        return out

    def _conflict(self, a: _Value, b: _Value) -> ShareRefused:
        return self.fail(
            f"{a.cite} disagrees with {b.cite}; remove one of them or make them agree",
            a.key,
            "conflict",
        )

    def _demand_without_memory(self, merged: dict[str, _Value]) -> None:
        for attr in _DEMAND:
            v = merged.get(attr)
            if v is not None and v.level == "container":
                name = next(k for k in KEYS if _ATTR[k] == attr)
                key = v.key[: -len(name)] + "gpu-memory"
                raise self.fail(f"{v.cite} needs a GPU memory request: add {key} (e.g. 2Gi)", key)
        if merged:
            log.info("%s: gpushare keys without gpu-memory; not managed", self.c.describe())

    def _resolve(self, m: dict[str, _Value]) -> ShareRequest:
        memory = m["memory"]
        if not self.gpus:
            raise self.fail(f"{memory.cite}: this node has no GPUs", memory.key, "capacity")
        core, count, devices = m.get("core"), m.get("count"), m.get("devices")
        lists = [v for v in (memory, core) if v is not None]
        if count is not None and devices is not None and count.value != len(devices.value):
            raise self.fail(
                f"{count.cite} does not match {devices.cite} "
                f"({len(devices.value)} GPUs); remove one or make them agree",
                count.key,
            )
        if count is not None:
            n, why, key = count.value, count.cite, count.key
        elif devices is not None:
            n, why, key = len(devices.value), devices.cite, devices.key
        elif memory.default_count is not None:
            n, why, key = memory.default_count, "every GPU of the node", memory.key
        else:
            n = max(len(v.value) for v in lists)  # type: ignore[arg-type]
            why, key = memory.cite, memory.key
        for v in lists:
            if len(v.value) > n:  # type: ignore[arg-type]
                raise self.fail(
                    f"{v.cite} gives {len(v.value)} values for {n} GPUs ({why}); "  # type: ignore[arg-type]
                    f"give at most {n}",
                    v.key,
                )
        if n > len(self.gpus):
            raise self.fail(
                f"{why} asks for {n} GPUs but this node has {len(self.gpus)}",
                key,
                "capacity",
            )
        isolation = m["isolation"].value if "isolation" in m else "full"
        if isolation == "memory" and core is not None:
            raise self.fail(
                f"{core.cite} cannot be used with {m['isolation'].cite} (memory isolation "
                f"only); remove the compute request or use isolation full",
                core.key,
            )
        priority = m["priority"].value if "priority" in m else "normal"
        if priority == "high" and self.policy.max_high_priority_per_gpu == 0:
            raise self.fail(
                f"{m['priority'].cite}: this node allows no high-priority containers; "
                f"use priority normal",
                m["priority"].key,
            )
        placement = m["placement"].value if "placement" in m else self.policy.default_placement
        keys = {attr: v.key for attr, v in m.items()}
        keys.setdefault("count", key)
        keys.setdefault("core", PREFIX + "gpu-core")
        keys.setdefault("priority", PREFIX + "priority")
        return ShareRequest(
            memory_bytes=_expand(memory.value, n),  # type: ignore[arg-type]
            core_percent=_expand(core.value, n) if core else (0,) * n,  # type: ignore[arg-type]
            devices=devices.value if devices else None,  # type: ignore[arg-type]
            priority=priority,  # type: ignore[arg-type]
            placement=placement,  # type: ignore[arg-type]
            isolation=isolation,  # type: ignore[arg-type]
            keys=keys,
            memory_dev_bytes=self._memory_dev(),
        )

    # -- value parsers -----------------------------------------------------------

    def _devices(self, text: str, indexes_only: bool = False) -> tuple[int, ...]:
        out: list[int] = []
        for item in _items(text):
            if _is_number(item):
                index = int(item)
                if index not in self.indexes:
                    raise _Invalid(f"no GPU {index} on this node; {self._known()}")
            elif not indexes_only and item.lower() in self.by_uuid:
                index = self.by_uuid[item.lower()]
            else:
                what = "an index" if indexes_only else "an index or a UUID"
                raise _Invalid(f"'{item}' is not {what} of a GPU of this node; {self._known()}")
            if index in out:
                raise _Invalid(f"GPU {item} is listed twice")
            out.append(index)
        return tuple(out)

    def _known(self) -> str:
        if not self.gpus:
            return "this node has no GPUs"
        return "GPUs here: " + ", ".join(f"{g.index} ({g.uuid})" for g in self.gpus)


def _items(text: str) -> list[str]:
    items = [i.strip() for i in text.split(",")]
    if not text.strip() or "" in items:
        raise _Invalid("empty value in the list")
    return items


def _int_list(text: str, low: int, high: int | None, single: bool = False) -> list[int]:
    items = _items(text)
    if single and len(items) != 1:
        raise _Invalid("must be a single value")
    out = []
    for item in items:
        if not _is_number(item) or int(item) < low or (high is not None and int(item) > high):
            raise _Invalid(f"'{item}' is not allowed")
        out.append(int(item))
    return out


def _is_number(text: str) -> bool:
    """ASCII decimal digits only (str.isdigit also accepts e.g. '²')."""
    return text.isascii() and text.isdigit()


def parse_memory(text: str) -> int:
    """Bytes from a size written as in requests: 2Gi, 3276Mi, 512M, a bare number is GiB."""
    try:
        return _memory(text.strip())
    except _Invalid as e:
        raise ValueError(str(e)) from None


def _memory(text: str) -> int:
    m = _QUANTITY.fullmatch(text)
    if not m:
        raise _Invalid(
            f"'{text}' is not a memory size; use e.g. 2Gi, 3276Mi, 512M "
            f"(Ki Mi Gi Ti binary, K M G T decimal, a bare number is GiB)"
        )
    try:
        exact = Decimal(m.group(1)) * _UNITS[m.group(2) or ""]
    except InvalidOperation:  # pragma: no cover - the regex admits only numbers
        raise _Invalid(f"'{text}' is not a number") from None
    if exact != exact.to_integral_value():
        raise _Invalid(f"'{text}' is not a whole number of bytes")
    return int(exact)


def _parse_memory(_: _Parser, text: str) -> tuple[int, ...]:
    values = tuple(_memory(i) for i in _items(text))
    if values != (0,) and 0 in values:
        raise _Invalid("every GPU needs more than 0 bytes (a single 0 opts the container out)")
    return values


def _parse_core(_: _Parser, text: str) -> tuple[int, ...]:
    items = _items(text)
    out = []
    for item in items:
        if not _is_number(item) or not 5 <= int(item) <= 100 or int(item) % 5:
            which = f"'{item}' " if len(items) > 1 else ""
            raise _Invalid(f"{which}must be a multiple of 5 between 5 and 100 (percent of a GPU)")
        out.append(int(item))
    return tuple(out)


def _parse_count(p: _Parser, text: str) -> int:
    if not _is_number(text) or int(text) < 1:
        raise _Invalid(f"must be a whole number of GPUs, at least 1 (this node has {len(p.gpus)})")
    return int(text)


def _parse_devices(p: _Parser, text: str) -> tuple[int, ...]:
    return p._devices(text)


def _choice(allowed: Sequence[str]) -> Callable[[_Parser, str], str]:
    def parse(_: _Parser, text: str) -> str:
        if text.lower() not in allowed:
            raise _Invalid(f"must be one of {', '.join(allowed)}")
        return text.lower()

    return parse


_PARSERS: dict[str, Callable[[_Parser, str], object]] = {
    "gpu-memory": _parse_memory,
    "gpu-core": _parse_core,
    "gpu-count": _parse_count,
    "gpu-devices": _parse_devices,
    "priority": _choice(PRIORITIES),
    "placement": _choice(PLACEMENTS),
    "isolation": _choice(ISOLATIONS),
}


def _expand(values: tuple[int, ...], n: int) -> tuple[int, ...]:
    """A short list repeats its last value."""
    return values[:n] + (values[-1],) * (n - len(values))


def _same(attr: str, a: object, b: object) -> bool:
    if attr in ("memory", "core"):
        assert isinstance(a, tuple) and isinstance(b, tuple)
        n = max(len(a), len(b))
        return _expand(a, n) == _expand(b, n)
    return a == b
