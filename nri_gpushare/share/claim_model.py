"""The values of prepared DRA claims (`nri_gpushare.share.claims`): what the
driver asks, what is booked, how a claim's record is written and read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nri_gpushare.names import DRA_CLAIM_ENV
from nri_gpushare.share.model import Allocation, GpuShare, NodePolicy, ShareRefused
from nri_gpushare.share.request import ShareRequest
from nri_gpushare.units import format_bytes, quote

BOOKING_PREFIX = "claim:"
"""The ledger's name for a claim's booking (never a container ID: has a colon)."""
WHOLE = -1
"""A share's memory when the scheduler allocated the whole GPU (no consumable
capacity): everything the GPU can give."""
MAX_CLAIMS = 4096
MAX_PODS = 256
MAX_SHARES = 64
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


def is_uid(text: str) -> bool:
    """Whether `text` is a Kubernetes UID (and so safe in a file name)."""
    return _UID.fullmatch(text) is not None


_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class ClaimStore(Protocol):
    """Where the claims live between runs (`MemoryClaimStore`: in memory only)."""

    def load(self) -> str | None: ...

    def replace(self, text: str) -> None: ...


@dataclass(frozen=True)
class ShareAsk:
    """One GPU of a claim as the driver read it from the allocation."""

    uuid: str
    memory_bytes: int  # WHOLE: the whole GPU
    core_percent: int


@dataclass(frozen=True)
class ClaimAsk:
    """A claim to prepare: what the scheduler allocated on this node."""

    uid: str
    namespace: str
    name: str
    pods: tuple[str, ...]
    shares: tuple[ShareAsk, ...]


@dataclass
class Claim:
    uid: str
    namespace: str
    name: str
    pods: frozenset[str]
    shares: tuple[GpuShare, ...]
    holder: str = ""  # the container holding its share; "": booked as the claim
    booking: Allocation = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.booking = Allocation(
            BOOKING_PREFIX + self.uid, self.name, f"{self.namespace}/{self.name}", self.shares
        )

    def describe(self) -> str:
        return f"claim {quote(self.namespace)}/{quote(self.name)} ({self.uid})"

    def json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "pods": sorted(self.pods),
            "gpus": [
                {"index": s.index, "uuid": s.uuid, "memory": s.memory_bytes, "core": s.core_percent}
                for s in self.shares
            ],
            "holder": self.holder,
        }


def check_ask(ask: ClaimAsk) -> None:
    """ShareRefused ("invalid") unless every field is one a claim can have."""
    problems = []
    if not _UID.fullmatch(ask.uid):
        problems.append(f"uid {quote(ask.uid)} is not a Kubernetes UID")
    if not _NAME.fullmatch(ask.namespace) or not _NAME.fullmatch(ask.name):
        problems.append(f"{quote(ask.namespace)}/{quote(ask.name)} is not a namespace/name")
    if len(ask.pods) > MAX_PODS or not all(_UID.fullmatch(p) for p in ask.pods):
        problems.append(f"the reserved pods must be at most {MAX_PODS} pod UIDs")
    if not 0 < len(ask.shares) <= MAX_SHARES:
        problems.append(f"it must give 1 to {MAX_SHARES} GPUs")
    if problems:
        raise ShareRefused(f"gpushare: cannot prepare the claim: {'; '.join(problems)}")


def claim_request(claim: Claim, policy: NodePolicy) -> ShareRequest:
    """What a container holding `claim` is given: the claim's share on the
    claim's GPUs, isolation full, normal priority."""
    keys = dict.fromkeys(("memory", "core", "devices", "count"), DRA_CLAIM_ENV)
    return ShareRequest(
        memory_bytes=tuple(s.memory_bytes for s in claim.shares),
        core_percent=tuple(s.core_percent for s in claim.shares),
        devices=tuple(s.index for s in claim.shares),
        priority="normal",
        placement=policy.default_placement,
        isolation="full",
        keys=keys,
    )


def describe_shares(shares: Iterable[GpuShare]) -> str:
    return ", ".join(
        f"GPU {s.index} {format_bytes(s.memory_bytes)}"
        + (f" {s.core_percent}%" if s.core_percent else "")
        for s in shares
    )


def encode(claims: Iterable[Claim]) -> str:
    """The claims record: every claim but its holder (the allocations say it)."""
    entries = [{k: v for k, v in c.json().items() if k != "holder"} for c in claims]
    return json.dumps({"version": 1, "claims": entries}, sort_keys=True) + "\n"


def decode_entry(entry: Any) -> ClaimAsk:
    """One claim of the record as it was asked; raises for a malformed one."""
    ask = ClaimAsk(
        _text(entry, "uid"),
        _text(entry, "namespace"),
        _text(entry, "name"),
        tuple(_texts(entry["pods"])),
        tuple(
            ShareAsk(_text(g, "uuid"), _int(g, "memory"), _int(g, "core")) for g in entry["gpus"]
        ),
    )
    check_ask(ask)
    return ask


def _text(entry: Mapping[str, Any], key: str) -> str:
    value = entry[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is not a string")
    return value


def _texts(values: Any) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise TypeError("not a list of strings")
    return values


def _int(entry: Mapping[str, Any], key: str) -> int:
    value = entry[key]
    if type(value) is not int:
        raise TypeError(f"{key} is not a number")
    return value
