"""1,000 seeded random ledger operations (reserve, release, info, close and
reopen, SIGKILL, memsize writes) by processes of 3 containers, each process
an Agent (kmod_support.py), against a model: every answer is the predicted
one, and after every step no container holds more than its quota and each
meminfo is exactly the model's (free bytes and one line per holding
process).  Everything ends at zero.  Runs inside the guest;
GPUSHARE_RANDOM_SEED replays a run."""

from __future__ import annotations

import collections
import errno
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.guest.kmod_support import NOBODY, ROOT, Agent, meminfo, ok, value, write

pytestmark = pytest.mark.usefixtures("kmod")

OPS = 1000
SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED") or "20241124")
GPUS = {0: 4000, 1: 3000}
# container -> {gpu: memsize}
CONTAINERS = {"r0": {0: 1000, 1: 500}, "r1": {0: 700, 1: 700}, "r2": {0: 300}}
AGENTS = 3  # processes per container
FDS = 2  # descriptors per process
SIZES = [0, 1, 50, 100, 250, 400, 2**64 - 1]


@dataclass
class Proc:
    """One agent and what the model says each of its descriptors holds."""

    agent: Agent
    fds: list[int]
    mine: list[dict[int, int]] = field(default_factory=list)  # per fd: gpu -> bytes


class Model:
    def __init__(self, cgroups: dict[str, Path], rng: random.Random) -> None:
        self.quota = {cid: dict(q) for cid, q in CONTAINERS.items()}
        self.cgroups = cgroups
        self.rng = rng
        self.procs: dict[str, list[Proc]] = {cid: [] for cid in CONTAINERS}
        for cid in CONTAINERS:
            for i in range(AGENTS):
                self.procs[cid].append(self.spawn(cid, i))

    def spawn(self, cid: str, i: int) -> Proc:
        agent = Agent.spawn(self.cgroups[cid], NOBODY if i % 2 else None)
        fds = [agent.open() for _ in range(FDS)]
        assert min(fds) >= 0, fds
        return Proc(agent, fds, [{} for _ in fds])

    def used(self, cid: str, gpu: int) -> int:
        return sum(m.get(gpu, 0) for p in self.procs[cid] for m in p.mine)

    def lines(self, cid: str, gpu: int) -> dict[int, int]:
        out = {p.agent.pid: sum(m.get(gpu, 0) for m in p.mine) for p in self.procs[cid]}
        return {pid: n for pid, n in out.items() if n}

    def check(self, step: int) -> None:
        for cid, quotas in self.quota.items():
            for gpu, quota in quotas.items():
                used = self.used(cid, gpu)
                assert used <= quota, f"step {step}: model over quota"
                got = meminfo(gpu, cid)
                want = (quota - used, self.lines(cid, gpu))
                assert got == want, f"step {step} (seed {SEED}): {cid} GPU {gpu}: {got} != {want}"
                assert value(ROOT / f"{gpu}/{cid}/memused") == used


def test_random_ledger_operations(cgroups: Callable[[str], Path]) -> None:
    rng = random.Random(SEED)
    for g, total in GPUS.items():
        ok(f"gpu {g} {total}")
    paths = {}
    for cid, quotas in CONTAINERS.items():
        ok(f"add {cid} " + ",".join(f"{g}:{m}" for g, m in quotas.items()))
        paths[cid] = cgroups(f"gs-{cid}")
        ok(f"bind {cid} /gs-{cid}")
    model = Model(paths, rng)
    seen: collections.Counter[str] = collections.Counter()
    try:
        for step in range(OPS):
            cid = rng.choice(sorted(CONTAINERS))
            slot = rng.randrange(AGENTS)
            proc = model.procs[cid][slot]
            f = rng.randrange(FDS)
            fd, mine = proc.fds[f], proc.mine[f]
            gpu = rng.choice([*model.quota[cid], *model.quota[cid], 1, 5])
            quota = model.quota[cid].get(gpu)
            kind = rng.choices(
                ["reserve", "release", "info", "reopen", "kill", "memsize"],
                [40, 30, 5, 8, 7, 10],
            )[0]
            what = f"step {step} (seed {SEED}): {kind} {cid}/{slot}/{f} GPU {gpu}"
            if kind in ("reserve", "release", "info"):
                held = mine.get(gpu, 0)
                if kind == "reserve":
                    n = rng.choice(SIZES)
                    answer = proc.agent.reserve(fd, gpu, n)
                    if quota is None:
                        want_err = errno.ENXIO
                    elif n > quota - model.used(cid, gpu):
                        want_err = errno.EDQUOT
                    else:
                        want_err = 0
                        mine[gpu] = held + n
                elif kind == "release":
                    n = rng.choice([held, held // 2, held + 1, 1, 2**64 - 1])
                    answer = proc.agent.release(fd, gpu, n)
                    if quota is None:
                        want_err = errno.ENXIO
                    elif n > held:
                        want_err = errno.EINVAL
                    else:
                        want_err = 0
                        mine[gpu] = held - n
                else:
                    answer = proc.agent.info(fd, gpu)
                    want_err = 0 if quota is not None else errno.ENXIO
                want_state = (
                    None if quota is None else (quota, model.used(cid, gpu), mine.get(gpu, 0))
                )
                assert answer == (want_err, want_state), f"{what}: {answer}"
                seen[errno.errorcode.get(want_err, "OK") if want_err else f"{kind} OK"] += 1
            elif kind == "reopen":
                assert proc.agent.close(fd) == 0
                proc.fds[f] = proc.agent.open()
                assert proc.fds[f] >= 0
                proc.mine[f] = {}
                seen["reopen"] += 1
            elif kind == "kill":
                proc.agent.kill()
                model.procs[cid][slot] = model.spawn(cid, slot)
                seen["kill"] += 1
            elif quota is not None:
                v = rng.choice([1, 100, 300, 500, 700, 1000, 1500, 5000])
                used = model.used(cid, gpu)
                others = sum(q.get(gpu, 0) for c, q in model.quota.items() if c != cid)
                if v < used:
                    want_err = errno.EBUSY
                elif others + v > GPUS[gpu]:
                    want_err = errno.ENOSPC
                else:
                    want_err = 0
                    model.quota[cid][gpu] = v
                err = write(ROOT / f"{gpu}/{cid}/memsize", str(v))
                assert err == want_err, f"{what} <- {v}: {os.strerror(err)}"
                seen[f"memsize {errno.errorcode.get(want_err, 'OK')}"] += 1
            model.check(step)
    finally:
        for procs in model.procs.values():
            for p in procs:
                if p.agent.alive:
                    p.agent.kill()
    print(f"random ledger operations (seed {SEED}): {dict(sorted(seen.items()))}")
    for cid, quotas in model.quota.items():
        for gpu, quota in quotas.items():
            assert meminfo(gpu, cid) == (quota, {})
            assert value(ROOT / f"{gpu}/{cid}/memused") == 0
        ok(f"del {cid}")
    for g, total in GPUS.items():
        assert value(ROOT / f"{g}/free_memsize") == total
        assert value(ROOT / f"{g}/orphaned_memsize") == 0
    # Every answer, or the run proves little.
    for outcome in ("reserve OK", "release OK", "EDQUOT", "EINVAL", "ENXIO", "kill", "reopen"):
        assert seen[outcome], f"no {outcome}: {dict(seen)}"
    for outcome in ("memsize OK", "memsize EBUSY", "memsize ENOSPC"):
        assert seen[outcome], f"no {outcome}: {dict(seen)}"
