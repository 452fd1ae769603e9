"""1,000 seeded random add/update/delete operations, valid and invalid, against
a model of the module's rules: every answer is the predicted one, the
refcount always equals the live registrations, and no GPU is ever
over-committed.  Runs inside the guest; GPUSHARE_RANDOM_SEED replays a run."""

from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass, field

import pytest

from tests.guest.kmod_support import ROOT, ctl, ok, read, refcount, value, write

pytestmark = pytest.mark.usefixtures("kmod")

OPS = 1000
SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED", "20240611"))
GPUS = {0: 1000, 1: 1500, 2: 800}  # index -> memory
IDS = [f"ctr{i}" for i in range(14)]


@dataclass
class Model:
    quotas: dict[str, dict[int, list[int]]] = field(default_factory=dict)  # id -> gpu -> [mem, w]
    max_inst: dict[int, int] = field(default_factory=lambda: dict.fromkeys(GPUS, 16))

    def usage(self, gpu: int) -> tuple[int, int, int]:
        on = [q[gpu] for q in self.quotas.values() if gpu in q]
        return sum(m for m, _ in on), sum(w for _, w in on), len(on)

    def add(self, cid: str, spec: list[tuple[int, int, int]]) -> int:
        if len({g for g, _, _ in spec}) != len(spec) or any(w > 100 for _, _, w in spec):
            return errno.EINVAL
        if any(g >= 16 for g, _, _ in spec):
            return errno.EINVAL
        if cid in self.quotas:
            return errno.EEXIST
        if any(m == 0 for _, m, _ in spec):
            return errno.EINVAL  # default_memsize stays 0
        if any(g not in GPUS for g, _, _ in spec):
            return errno.ENXIO
        for g, m, w in spec:
            mem, weight, n = self.usage(g)
            if n >= self.max_inst[g] or mem + m > GPUS[g] or weight + w > 100:
                return errno.ENOSPC
        self.quotas[cid] = {g: [m, w] for g, m, w in spec}
        return 0

    def delete(self, cid: str) -> int:
        return 0 if self.quotas.pop(cid, None) is not None else errno.ENOENT

    def change(self, cid: str, gpu: int, what: str, v: int) -> int:
        if (what == "memsize" and v == 0) or (what == "weight" and v > 100):
            return errno.EINVAL
        q = self.quotas[cid][gpu]
        mem, weight, _ = self.usage(gpu)
        new = [v, q[1]] if what == "memsize" else [q[0], v]
        if mem - q[0] + new[0] > GPUS[gpu] or weight - q[1] + new[1] > 100:
            return errno.ENOSPC
        self.quotas[cid][gpu] = new
        return 0

    def set_max_inst(self, gpu: int, v: int) -> int:
        if not 1 <= v <= 25:
            return errno.EINVAL
        if v < self.usage(gpu)[2]:
            return errno.ENOSPC
        self.max_inst[gpu] = v
        return 0


def check_against(model: Model) -> None:
    expected = [f"gpu {g} {m}" for g, m in GPUS.items()]
    lines = read(ROOT / "inst_ctl").splitlines()
    assert lines[: len(GPUS)] == expected
    got = {}
    for line in lines[len(GPUS) :]:
        verb, cid, spec = line.split()
        assert verb == "add"
        got[cid] = {
            int(g): [int(m), int(w)] for g, m, w, _ in (item.split(":") for item in spec.split(","))
        }
    assert got == model.quotas
    for g, total in GPUS.items():
        mem, weight, n = model.usage(g)
        assert mem <= total and weight <= 100 and n <= model.max_inst[g]  # never over-committed
        assert value(ROOT / f"{g}/free_memsize") == total - mem
        assert value(ROOT / f"{g}/free_weight") == 100 - weight
        assert value(ROOT / f"{g}/nr_inst") == n
        assert value(ROOT / f"{g}/max_inst") == model.max_inst[g]
        for cid, q in model.quotas.items():
            if g in q:
                assert [value(ROOT / f"{g}/{cid}/memsize"), value(ROOT / f"{g}/{cid}/weight")] == q[
                    g
                ]


def test_random_operations() -> None:
    rng = random.Random(SEED)
    model = Model()
    for g, mem in GPUS.items():
        ok(f"gpu {g} {mem}")
    counts: dict[str, int] = {}
    for step in range(OPS):
        kind = rng.choices(["add", "del", "change", "max_inst", "garbage"], [45, 25, 20, 6, 4])[0]
        if kind == "add":
            cid = rng.choice(IDS)
            gpus = rng.sample([0, 1, 2, 3, 16], rng.choice([1, 1, 2, 3]))
            if rng.random() < 0.1:
                gpus.append(gpus[0])  # the same GPU twice
            spec = [
                (g, rng.choice([0, 1, 50, 100, 200, 400, 700]), rng.choice([0, 5, 10, 25, 50, 101]))
                for g in gpus
            ]
            command = f"add {cid} " + ",".join(f"{g}:{m}:{w}" for g, m, w in spec)
            want, got = model.add(cid, spec), ctl(command)
        elif kind == "del":
            cid = rng.choice(IDS)
            command = f"del {cid}"
            want, got = model.delete(cid), ctl(command)
        elif kind == "change" and model.quotas:
            cid = rng.choice(sorted(model.quotas))
            gpu = rng.choice(sorted(model.quotas[cid]))
            what = rng.choice(["memsize", "weight"])
            v = rng.choice(
                [0, 1, 30, 60, 150, 300, 600, 101]
                if what == "memsize"
                else [0, 5, 20, 40, 80, 100, 101]
            )
            command = f"{gpu}/{cid}/{what} <- {v}"
            want, got = model.change(cid, gpu, what, v), write(ROOT / f"{gpu}/{cid}/{what}", str(v))
        elif kind == "max_inst":
            gpu, v = rng.choice(list(GPUS)), rng.choice([0, 1, 2, 3, 5, 16, 26])
            command = f"{gpu}/max_inst <- {v}"
            want, got = model.set_max_inst(gpu, v), write(ROOT / f"{gpu}/max_inst", str(v))
        else:
            command = rng.choice(
                [
                    "add",
                    "del",
                    "bind x",
                    "add a 0:1:1:1:1",
                    "gpu 0 -1",
                    "add ctr1 0:x",
                    "del ctr1 ctr2",
                ]
            )
            want, got = errno.EINVAL, ctl(command)
        counts[errno.errorcode.get(want, "OK")] = counts.get(errno.errorcode.get(want, "OK"), 0) + 1
        assert got == want, f"step {step} (seed {SEED}): {command}: got {got}, want {want}"
        assert refcount() == len(model.quotas), f"step {step}: {command}"
        if step % 100 == 99:
            check_against(model)
    check_against(model)
    print(f"random operations (seed {SEED}): {dict(sorted(counts.items()))}")
    # The run must exercise every answer, or it proves little.
    assert {"OK", "EINVAL", "EEXIST", "ENOENT", "ENXIO", "ENOSPC"} <= set(counts)
    for cid in list(model.quotas):
        ok(f"del {cid}")
    assert refcount() == 0
