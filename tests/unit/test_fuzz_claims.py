"""Bad input to the prepared DRA claims: the claims record a crash or a hand
edit may leave (`Claims.load`), and the ``claim-prepare`` request the
driver sends over the local API (`decode_request`, `check_claim`).

Properties: loading never raises, books only claims that were written
(each exactly as written, on GPUs of this node), never books more than a
GPU can hold per claim, and a refused or garbled claim books nothing; a
request either decodes to a checked claim or raises ProtocolError.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.local.claim_wire import check_claim
from nri_gpushare.local.protocol import ProtocolError, decode_request
from nri_gpushare.share.claim_model import decode_entry
from nri_gpushare.share.claims import Claims, MemoryClaimStore
from nri_gpushare.share.model import NodePolicy
from nri_gpushare.share.placement import Ledger
from tests.fakes import GiB, make_gpus
from tests.unit.test_fuzz_common import fuzz, text_with_odd_unicode

GPUS = make_gpus(2, 16 * GiB)
UUIDS = [g.uuid for g in GPUS] + ["GPU-other", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


@st.composite
def claim_entries(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "uid": draw(st.sampled_from(["u1", "u2", "u3", "u1", "../x"])),
        "namespace": draw(st.sampled_from(["ns", "ns", "NS"])),
        "name": draw(st.sampled_from(["c", "c.d", "-x"])),
        "pods": draw(st.lists(st.sampled_from(["p1", "p1", "p 2"]), max_size=2)),
        "gpus": [
            {
                "uuid": draw(st.sampled_from(UUIDS)),
                "memory": draw(st.sampled_from([-1, 0, 1 << 20, GiB, 20 * GiB, 1 << 62])),
                "core": draw(st.sampled_from([0, 5, 33, 100, 105])),
            }
            for _ in range(draw(st.integers(0, 3)))
        ],
    }
    if draw(st.integers(0, 3)) == 0:
        entry[draw(st.sampled_from(sorted(entry)))] = draw(json_values)
    return entry


@fuzz(300)
@given(entries=st.lists(claim_entries(), max_size=5), cut=st.integers(0, 4000))
def test_loading_any_claims_record_never_raises_or_overbooks(
    entries: list[dict[str, Any]], cut: int
) -> None:
    text = json.dumps({"claims": entries})
    for candidate in (text, text[:cut]):
        ledger = Ledger(GPUS, NodePolicy())
        claims = Claims(GPUS, lambda ledger=ledger: ledger, dict, MemoryClaimStore(candidate))
        claims.load()
        for uid, claim in claims.book.items():
            written = [
                e
                for e in entries
                if e.get("uid") == uid
                and isinstance(e.get("gpus"), list)
                and all(
                    isinstance(g, dict) and {"uuid", "memory", "core"} <= set(g) for g in e["gpus"]
                )
            ]
            assert written
            for s in claim.shares:
                # exactly as written (the whole GPU for -1), on a GPU of this node
                asked = {(g["uuid"], g["memory"], g["core"]) for e in written for g in e["gpus"]}
                whole = (s.uuid, -1, s.core_percent if s.core_percent != 100 else 0)
                assert (s.uuid, s.memory_bytes, s.core_percent) in asked or (
                    s.memory_bytes == 16 * GiB and any(a[:2] == whole[:2] for a in asked)
                )
                assert s.memory_bytes >= 1 << 20 and s.core_percent % 5 == 0
        booked = sum(u.memory_bytes for u in ledger.usage.values())
        assert booked == sum(s.memory_bytes for c in claims.book.values() for s in c.shares)


@fuzz(300)
@given(value=json_values | claim_entries(), noise=text_with_odd_unicode(20))
def test_a_claim_request_decodes_or_is_a_protocol_error(value: Any, noise: str) -> None:
    for obj in ({"v": 1, "op": "claim-prepare", "claim": value}, {"v": 1, "op": noise}):
        try:
            request = decode_request(json.dumps(obj).encode())
        except ProtocolError:
            continue
        if request.op == "claim-prepare":
            assert request.claim == check_claim(value)
            assert request.id == value["uid"]


@fuzz(300)
@given(entry=claim_entries() | json_values)
def test_a_claim_record_entry_decodes_checked_or_raises(entry: Any) -> None:
    try:
        ask = decode_entry(entry)
    except Exception:
        return
    assert ask.uid == entry["uid"] and len(ask.shares) == len(entry["gpus"]) > 0
