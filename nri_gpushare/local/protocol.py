"""The local API's messages (sans-IO): one request, one reply, each one JSON
object on one line, then the connection closes.

The client writes its request and shuts its side of the connection (the
server reads to end of file, at most `MAX_MESSAGE` bytes), then reads the
reply.

Request::

    {"v": 1, "op": "create", "namespace": "default", "id": "c1",
     "via": "runc", "bundle": "/run/containerd/.../c1", "pid": 0,
     "cgroups_path": "/default/c1", "env": {"K": "V"}, "annotations": {...},
     "gpu_minors": [0]}

``namespace`` is the containerd namespace; "" for a container that
containerd does not run (podman through CDI): its labels are not read and
only its poststop hook releases it.

- ``create``: place and register the container's share.  ``env`` and
  ``annotations`` are the bundle's (config.json); the daemon reads the
  container's labels from containerd itself.  ``gpu_minors``: the NVIDIA
  device minors the container was given by CDI (the share must be placed on
  exactly those GPUs); null when the daemon chooses.  With ``pid`` > 0 the
  container's cgroup exists and the registration is bound to it at once.
  Reply ``{"ok": true, "plan": PLAN}``, or ``"plan": null`` when the
  container asks for no share.
- ``start``: the container's first process ``pid`` exists: bind the
  registration to its cgroup.  Reply ``{"ok": true}``.
- ``release``: free the share (idempotent).  Reply ``{"ok": true,
  "released": bool}``.
- ``resize``: change a running container's share live (`nri-gpushare
  resize`, the node's operator): ``id`` is the container's ID, a unique
  prefix of it or its name; ``memory``, ``core`` and ``priority`` the new
  values as text (a ``gpu-memory`` size or list, a ``gpu-core`` percent or
  list, normal|high), "" to leave one as it is.  Reply ``{"ok": true,
  "resized": {"container_id", "name", "pod", "priority", "changed": bool,
  "gpus": [{"index", "uuid", "memory", "core"}]}}``.

Three ops for the DRA driver (`nri_gpushare.k8s.dra`; root only, as
``resize``): ``claim-prepare`` ``{"claim": CLAIM}`` books a prepared claim
(`claim_wire`), reply ``{"ok": true, "claim": {..., "gpus": [{"index",
"uuid", "memory", "core"}], "holder"}}``; ``claim-unprepare`` ``{"id": UID}``
forgets it, reply ``{"ok": true, "released": bool}``; ``claims``: reply
``{"ok": true, "claims": [...]}``.

Two ops for the compiled front (``front/``: gpushare-runc and the CDI
hooks), which parses no JSON: the daemon reads and edits the bundle itself
(`nri_gpushare.daemon.local_bundle`).

- ``runc-create``: ``{"id", "bundle", "root"}`` (``bundle`` absolute, ``root``
  runc's ``--root``): the daemon reads the bundle's config.json, asks as
  ``create`` via "runc" would, and when a share results writes the plan into
  config.json.  Reply as ``create``'s, with ``"namespace"``: the one it was
  booked under (for the ``start`` and ``release`` that follow).
- ``hook``: ``{"hook": "create-runtime"|"poststop", "state": TEXT}``, the OCI
  state the runtime gave the hook, as text: create-runtime asks as the hook's
  ``create`` via "cdi", poststop releases.

For both, reason ``bundle`` says the daemon could not read or edit the
bundle (or the state) itself: the front then runs the Python program, which
says why in its own words.

A refusal is ``{"ok": false, "error": "<a message for a person>",
"reason": "capacity|invalid|conflict|forbidden|kmod|state|interposer|
unavailable|protocol|internal"}``.

PLAN: ``{"devices": [{"path", "type", "major", "minor", "mode"}], "env":
{...}, "mounts": [{"destination", "type", "source", "options": [...]}],
"annotations": {...}, "remove_annotations": [...]}``.

Everything here is pure: bytes in, values out, and the reverse; every field
is checked (type, size) because a container chooses its env and annotations.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from nri_gpushare.local.claim_wire import check_claim

VERSION = 1
MAX_MESSAGE = 4 << 20
"""Bytes one request or reply may take (a container's whole environment fits)."""
Op = Literal[
    "create",
    "start",
    "release",
    "resize",
    "runc-create",
    "hook",
    "claim-prepare",
    "claim-unprepare",
    "claims",
]
Via = Literal["cdi", "runc", ""]
"""Who asks: the CDI hook, gpushare-runc, or "" (not sent: a start or a release)."""
OPS: tuple[Op, ...] = get_args(Op)
VIAS: tuple[Via, ...] = get_args(Via)
MAX_ENTRIES = 4096
"""env or annotation entries one request may carry."""
MAX_TEXT = 64 << 10
"""Bytes one key or value may take."""
MAX_STATE_TEXT = 4 << 20
"""Characters of a hook's OCI state (oci.MAX_STATE bytes)."""
Hook = Literal["create-runtime", "poststop"]
HOOKS: tuple[Hook, ...] = get_args(Hook)
MAX_VALUE = 1024
"""Characters a resize's value may take (a list of 64 sizes fits)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
"""containerd namespaces and container IDs (a strict superset of what containerd allows)."""


class ProtocolError(ValueError):
    """A message that is not one of ours; str() says what is wrong."""


@dataclass(frozen=True)
class Request:
    op: Op
    namespace: str
    id: str
    via: Via = ""
    bundle: str = ""
    pid: int = 0
    cgroups_path: str = ""
    env: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    gpu_minors: tuple[int, ...] | None = None
    memory: str = ""  # resize: the new values, "" unchanged
    core: str = ""
    priority: str = ""
    root: str = ""  # runc-create: runc's --root
    hook: Hook | None = None  # hook: which one
    state: str = ""  # hook: the OCI state, as text
    claim: dict[str, Any] | None = None  # claim-prepare: `claim_wire.check_claim`'s


@dataclass(frozen=True)
class Reply:
    ok: bool
    error: str = ""
    reason: str = ""
    plan: dict[str, Any] | None = None
    released: bool | None = None
    resized: dict[str, Any] | None = None
    namespace: str | None = None  # runc-create: where the share is booked
    claim: dict[str, Any] | None = None  # claim-prepare: the claim as booked
    claims: list[Any] | None = None  # claims: every prepared claim

    @classmethod
    def refused(cls, error: str, reason: str) -> Reply:
        return cls(False, error=error, reason=reason)


def _line(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes, more than {MAX_MESSAGE}")
    return data


def encode_request(r: Request) -> bytes:
    """The request's line; ProtocolError when the daemon would refuse it (a
    field of the wrong type or too big), saying which."""
    obj: dict[str, Any] = {"v": VERSION, "op": r.op, "namespace": r.namespace, "id": r.id}
    if r.op == "create":
        obj.update(
            via=r.via,
            bundle=r.bundle,
            pid=r.pid,
            cgroups_path=r.cgroups_path,
            env=r.env,
            annotations=r.annotations,
            gpu_minors=None if r.gpu_minors is None else list(r.gpu_minors),
        )
    elif r.op == "start":
        obj.update(pid=r.pid)
    elif r.op == "resize":
        obj.update(memory=r.memory, core=r.core, priority=r.priority)
    elif r.op == "runc-create":
        obj.update(bundle=r.bundle, root=r.root)
    elif r.op == "hook":
        obj = {"v": VERSION, "op": r.op, "hook": r.hook, "state": r.state}
    elif r.op == "claim-prepare":
        obj = {"v": VERSION, "op": r.op, "claim": r.claim}
    elif r.op == "claims":
        obj = {"v": VERSION, "op": r.op}
    _request(obj)  # the daemon's checks, here: a clear error before sending
    return _line(obj)


def encode_reply(r: Reply) -> bytes:
    obj: dict[str, Any] = {"ok": r.ok}
    if not r.ok:
        obj.update(error=r.error, reason=r.reason)
    if r.plan is not None or (
        r.ok and r.released is None and r.resized is None and r.claim is None and r.claims is None
    ):
        obj["plan"] = r.plan
    if r.released is not None:
        obj["released"] = r.released
    if r.resized is not None:
        obj["resized"] = r.resized
    if r.namespace is not None:
        obj["namespace"] = r.namespace
    if r.claim is not None:
        obj["claim"] = r.claim
    if r.claims is not None:
        obj["claims"] = r.claims
    return _line(obj)


def _load(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes, more than {MAX_MESSAGE}")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    except RecursionError:
        raise ProtocolError("not JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError("not a JSON object")
    return obj


def _text(obj: dict[str, Any], key: str, *, required: bool = False) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str) or len(value) > MAX_TEXT or "\0" in value:
        raise ProtocolError(f"{key}: not a string of at most {MAX_TEXT} bytes")
    if required and not value:
        raise ProtocolError(f"{key}: missing")
    return value


def _name(obj: dict[str, Any], key: str, *, required: bool = True) -> str:
    value = _text(obj, key, required=required)
    if value and not _NAME.fullmatch(value):
        raise ProtocolError(f"{key}: {value[:80]!r} is not a containerd name")
    return value


def _mapping(obj: dict[str, Any], key: str) -> dict[str, str]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
        raise ProtocolError(f"{key}: not an object of at most {MAX_ENTRIES} entries")
    for k, v in value.items():
        if (
            not isinstance(k, str)
            or not isinstance(v, str)
            or len(k) > MAX_TEXT
            or len(v) > MAX_TEXT
        ):
            raise ProtocolError(
                f"{key}: {str(k)[:40]!r}: entries must be strings of at most {MAX_TEXT} bytes"
            )
    return dict(value)


def _reference(obj: dict[str, Any]) -> str:
    """A resize's container: an ID, a prefix of one, or a name (a pod's
    "namespace/pod/name" has slashes)."""
    value = _text(obj, "id", required=True)
    if len(value) > MAX_VALUE or not value.isprintable():
        raise ProtocolError(f"id: not a container ID or name of at most {MAX_VALUE} characters")
    return value


def decode_request(data: bytes) -> Request:
    """The request in `data` (one line, newline optional); ProtocolError if it is not one."""
    return _request(_load(data))


def _request(obj: dict[str, Any]) -> Request:
    version = obj.get("v")
    if type(version) is not int or version != VERSION:
        raise ProtocolError(f"protocol version {version!r:.20}; this daemon speaks {VERSION}")
    op = obj.get("op")
    if op not in OPS:
        raise ProtocolError(f"op {op!r:.40}: not one of {', '.join(OPS)}")
    if op == "hook":
        return _hook(obj)
    if op == "claims":
        return Request(op, "", "")
    if op == "claim-prepare":
        try:
            claim = check_claim(obj.get("claim"))
        except ValueError as e:
            raise ProtocolError(str(e)) from None
        return Request(op, "", claim["uid"], claim=claim)
    namespace = _name(obj, "namespace", required=False)
    cid = _reference(obj) if op == "resize" else _name(obj, "id")
    pid = obj.get("pid", 0)
    if type(pid) is not int or not 0 <= pid < 1 << 31:
        raise ProtocolError("pid: not a process ID")
    if op in ("release", "claim-unprepare"):
        return Request(op, namespace, cid)
    if op == "resize":
        memory, core, priority = (_text(obj, key) for key in ("memory", "core", "priority"))
        if max(len(memory), len(core), len(priority)) > MAX_VALUE:
            raise ProtocolError(f"memory, core, priority: at most {MAX_VALUE} characters each")
        if not (memory or core or priority):
            raise ProtocolError("resize: give memory, core or priority")
        return Request(op, namespace, cid, memory=memory, core=core, priority=priority)
    if op == "runc-create":
        bundle = _text(obj, "bundle", required=True)
        if not bundle.startswith("/"):
            raise ProtocolError(f"bundle: {bundle[:200]!r} is not an absolute path")
        return Request(op, namespace, cid, via="runc", bundle=bundle, root=_text(obj, "root"))
    if op == "start":
        if pid == 0:
            raise ProtocolError("pid: missing")
        return Request(op, namespace, cid, pid=pid)
    via = obj.get("via", "")
    if via not in VIAS:
        raise ProtocolError(f"via {via!r:.40}: not one of cdi, runc")
    minors = obj.get("gpu_minors")
    if minors is not None:
        if (
            not isinstance(minors, list)
            or not 0 < len(minors) <= 64
            or any(type(m) is not int or not 0 <= m < 1 << 20 for m in minors)
        ):
            raise ProtocolError("gpu_minors: not a list of 1 to 64 device minors")
        minors = tuple(minors)
    return Request(
        op,
        namespace,
        cid,
        via=via,
        bundle=_text(obj, "bundle"),
        pid=pid,
        cgroups_path=_text(obj, "cgroups_path"),
        env=_mapping(obj, "env"),
        annotations=_mapping(obj, "annotations"),
        gpu_minors=minors,
    )


def _hook(obj: dict[str, Any]) -> Request:
    hook = obj.get("hook")
    if hook not in HOOKS:
        raise ProtocolError(f"hook {hook!r:.40}: not one of {', '.join(HOOKS)}")
    state = obj.get("state")
    if not isinstance(state, str) or not state or len(state) > MAX_STATE_TEXT:
        raise ProtocolError(f"state: not a string of 1 to {MAX_STATE_TEXT} characters")
    return Request("hook", "", "", via="cdi", hook=hook, state=state)


def decode_reply(data: bytes) -> Reply:
    """The reply in `data`; ProtocolError if it is not one."""
    obj = _load(data)
    ok = obj.get("ok")
    if type(ok) is not bool:
        raise ProtocolError("ok: not true or false")
    if not ok:
        return Reply(False, error=_text(obj, "error"), reason=_text(obj, "reason"))
    plan = obj.get("plan")
    if plan is not None and not isinstance(plan, dict):
        raise ProtocolError("plan: not an object")
    released = obj.get("released")
    if released is not None and type(released) is not bool:
        raise ProtocolError("released: not true or false")
    resized = obj.get("resized")
    if resized is not None and not isinstance(resized, dict):
        raise ProtocolError("resized: not an object")
    namespace = obj.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise ProtocolError("namespace: not a string")
    claim, claims = obj.get("claim"), obj.get("claims")
    if (claim is not None and not isinstance(claim, dict)) or (
        claims is not None and not isinstance(claims, list)
    ):
        raise ProtocolError("claim, claims: not an object, a list")
    return Reply(
        True,
        plan=plan,
        released=released,
        resized=resized,
        namespace=namespace,
        claim=claim,
        claims=claims,
    )
