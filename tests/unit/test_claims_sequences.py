"""Prepared DRA claims under random sequences of prepare, unprepare, create,
release, Synchronize (containerd listing only some containers) and readopt,
over the fake kernel module (written for the hostile review, which found
double counts this way; each seed is one sequence of 40 steps).

After every step: the ledger holds exactly the claims nobody holds plus the
allocations, no claim is both booked and held, and no claim is held by two
containers."""

from __future__ import annotations

import dataclasses
import random

import pytest

from nri_gpushare.share.claims import ClaimAsk, ShareAsk
from nri_gpushare.share.model import ShareRefused
from nri_gpushare.share.records import MemoryStore
from tests.fakes import GiB, done
from tests.unit.test_claims import container, service

UIDS = ["u1", "u2", "u3"]
PODS = ["pa", "pb"]
OPS = ["prepare", "prepare", "unprepare", "create", "create", "release", "sync", "readopt"]


def check(svc, history: list[str]) -> None:
    want: dict[int, tuple[int, int, int]] = {}
    booked = [c.shares for c in svc.claims.book.values() if not c.holder]
    for shares in booked + [a.shares for a in svc.allocations.values()]:
        for s in shares:
            m, c, n = want.get(s.index, (0, 0, 0))
            want[s.index] = (m + s.memory_bytes, c + s.core_percent, n + 1)
    got = {
        i: (u.memory_bytes, u.core_percent, len(u.containers))
        for i, u in svc.ledger.usage.items()
        if (u.memory_bytes, u.core_percent, len(u.containers)) != (0, 0, 0)
    }
    steps = "\n".join(history)
    assert got == want, f"ledger {got}, wanted {want} after:\n{steps}"
    held = [a.claim for a in svc.allocations.values() if a.claim]
    assert len(held) == len(set(held)), f"a claim held twice after:\n{steps}"
    both = [u for u, c in svc.claims.book.items() if not c.holder and u in held]
    assert not both, f"{both} booked and held after:\n{steps}"


@pytest.mark.parametrize("seed", range(200))
def test_the_ledger_counts_every_claim_once(seed: int) -> None:
    rnd = random.Random(seed)
    svc, _ = service(store=MemoryStore(), gpus=2)
    live = {}
    history: list[str] = []
    for n in range(40):
        op = rnd.choice(OPS)
        uid, pod = rnd.choice(UIDS), rnd.choice(PODS)
        try:
            if op == "prepare":
                history.append(f"prepare {uid} for {pod}")
                gpu = svc.by_index[UIDS.index(uid) % 2]
                memory = GiB * (1 + UIDS.index(uid))
                svc.claims.prepare(
                    ClaimAsk(uid, "ns", uid, (pod,), (ShareAsk(gpu.uuid, memory, 10),))
                )
            elif op == "unprepare":
                history.append(f"unprepare {uid}")
                svc.claims.unprepare(uid)
            elif op == "create":
                cid = f"c{n}"
                history.append(f"create {cid} in {pod} with {uid}")
                c = container(cid, pod_uid=pod, uid=uid)
                plan = done(svc.lifecycle.create_container(c))
                live[cid] = dataclasses.replace(c, annotations=dict(plan.annotations))
            elif op == "release" and live:
                cid = rnd.choice(sorted(live))
                history.append(f"release {cid}")
                done(svc.lifecycle.release(cid))
                del live[cid]
            elif op == "sync":
                shown = [c for c in live.values() if rnd.random() < 0.7]
                history.append(f"synchronize listing {[c.id for c in shown]}")
                done(svc.recovery.synchronize(shown))
            elif op == "readopt" and live:
                cid = rnd.choice(sorted(live))
                history.append(f"readopt {cid}")
                done(svc.lifecycle.readopt(live[cid]))
        except ShareRefused as e:
            history[-1] += f": refused ({e.reason})"
        check(svc, history)
