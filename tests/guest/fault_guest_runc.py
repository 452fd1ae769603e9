"""The plugin SIGKILLed during container starts through gpushare-runc
(`ctr run --runc-binary`, as nerdctl and docker use it), with gpushare.ko.

STARTS containers are started one after another with `ctr run -d` through
the wrapper, asking for a share by containerd label; for KILLS of them,
drawn from the seed, the plugin is SIGKILLed a drawn 0-3 s after `ctr run`
began (before, during or after the wrapper's request, the runc create and
the wrapper's bind), and a new plugin is started once `ctr run` returned.
After each start: every running task whose bundle's config.json carries
the share (`gpushare.io/assigned`, written by the wrapper) has exactly one
allocation of origin runc:default, registered in the module with that memory
and bound to the task's cgroup, no other allocation exists, and the module's
reference count is the number of registrations.  A `ctr run` the kill made
fail is allowed (counted); a container started without its share (the
daemon was away: labels cannot be read without it) must hold nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

from tests.guest.fault_support import (
    BASE,
    SLOW,
    P,
    Plugins,
    memory_limits,
    module_registry,
    report,
    rng,
)
from tests.guest.kmod_support import CGROUP2, ROOT, refcount, value
from tests.testbed.containerd import Containerd
from tests.testbed.images import BUSYBOX_IMAGE, build_images

STARTS = int(os.environ.get("GPUSHARE_FAULT_STARTS") or 3)
# How long a restarted plugin may take to bind a container whose start it
# missed (its reconciler's first pass; the guest runs under TCG).
BIND_WAIT = 90.0
KILLS = 2
NS = "default"
ASSIGNED = P + "assigned"


def ctr(bed: Containerd, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(bed.ctr), "-a", str(bed.grpc_address), "-n", NS, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SLOW)
    assert done.returncode == 0 or not check, f"ctr {' '.join(args)}: {done.stderr}"
    return done


def wrapper(api_socket: Path) -> Path:
    """gpushare-runc asking whichever plugin serves api_socket."""
    script = BASE / "gpushare-runc"
    real = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "gpushare-runc"
    script.write_text(f'#!/bin/sh\nGPUSHARE_API_SOCKET={api_socket} exec {real} "$@"\n')
    script.chmod(0o755)
    return script


def running_tasks(bed: Containerd) -> set[str]:
    lines = ctr(bed, "tasks", "ls").stdout.splitlines()[1:]
    return {f[0] for f in (line.split() for line in lines) if len(f) >= 3 and f[2] == "RUNNING"}


def bundle_share(bed: Containerd, cid: str) -> list[int] | None:
    """The memory the wrapper wrote into the bundle's config.json, if any."""
    config = bed.base / "state" / "io.containerd.runtime.v2.task" / NS / cid / "config.json"
    spec = json.loads(config.read_text())
    if ASSIGNED not in spec.get("annotations", {}):
        return None
    env = dict(e.split("=", 1) for e in spec["process"]["env"] if "=" in e)
    return memory_limits(env["GPUSHARE_MEMORY_LIMIT"])


def check(
    bed: Containerd, plugins: Plugins, killed: frozenset[str] = frozenset()
) -> dict[str, int]:
    """The invariant.  A container in `killed` (the plugin was SIGKILLed during
    its `ctr run`) may have been left registered but unbound, when the kill
    fell between the wrapper's create request and its start: the restarted
    plugin's reconciler must bind it to the cgroup of the task containerd
    runs, within BIND_WAIT; counted as "adopted"."""
    tasks = running_tasks(bed)
    shared = {cid: m for cid in tasks if (m := bundle_share(bed, cid)) is not None}
    status = plugins.current.status()
    allocs = {a["container_id"]: a for a in status["allocations"]}
    registry = module_registry()
    where = f"tasks {sorted(tasks)}, shared {shared}, allocations {sorted(allocs)}, {registry}"
    adopted: list[str] = []
    assert set(allocs) == set(shared), f"allocations differ from shared tasks: {where}"
    assert set(registry) == set(allocs), f"module registry differs: {where}"
    for cid, alloc in allocs.items():
        assert alloc["origin"] == f"runc:{NS}", alloc
        shares = {g["index"]: g["memory"] for g in alloc["gpus"]}
        assert registry[cid] == shares and sorted(shares.values()) == sorted(shared[cid]), where
        cgroup = ROOT / str(min(shares)) / cid / "cgroup"
        bound = value(cgroup)
        if bound == 0 and cid in killed:
            deadline = time.monotonic() + BIND_WAIT
            while bound == 0 and time.monotonic() < deadline:
                time.sleep(0.5)
                bound = value(cgroup)
            adopted.append(cid)
        assert bound == os.stat(CGROUP2 / NS / cid).st_ino, f"{cid} not bound: {bound}"
    assert refcount() == len(registry), (refcount(), registry)
    return {"shared": len(shared), "unshared": len(tasks) - len(shared), "adopted": len(adopted)}


async def test_sigkill_during_starts_through_gpushare_runc(bed, plugins):
    r = rng("runc")
    plugins.running()
    ctr(bed, "images", "import", str(build_images()))
    runtime = wrapper(plugins.api_socket)
    kill_at = {i: round(r.uniform(0, 3), 2) for i in r.sample(range(STARTS), KILLS)}
    names = [f"gs-fk-{i}" for i in range(STARTS)]
    failed: list[str] = []
    checks = []
    try:
        for i, cid in enumerate(names):
            memory = r.choice(["1Gi", "2Gi"])
            proc = await asyncio.create_subprocess_exec(
                str(bed.ctr), "-a", str(bed.grpc_address), "-n", NS, "run", "-d",
                "--runc-binary", str(runtime), "--runc-root", str(bed.runc_root),
                "--label", f"{P}gpu-memory={memory}", BUSYBOX_IMAGE, cid, "sleep", "3600",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            if i in kill_at:
                await asyncio.sleep(kill_at[i])
                plugins.kill()
            _, err = await asyncio.wait_for(proc.communicate(), SLOW)
            if proc.returncode:
                assert i in kill_at, f"ctr run {cid} failed with no kill: {err.decode()}"
                failed.append(f"{cid}: {err.decode().strip()[-300:]}")
            if i in kill_at:
                plugins.start()
            killed = frozenset(names[k] for k in kill_at if k <= i)
            checks.append(check(bed, plugins, killed))
    finally:
        for cid in names:
            ctr(bed, "tasks", "kill", "-s", "SIGKILL", cid, check=False)
            time.sleep(0.2)
            ctr(bed, "tasks", "rm", "-f", cid, check=False)
            ctr(bed, "containers", "rm", cid, check=False)
    # Deleted through the wrapper with a live plugin: all released.
    plugins.running()
    assert check(bed, plugins) == {"shared": 0, "unshared": 0, "adopted": 0}
    summary = {"starts": STARTS, "kills_at_s": kill_at, "failed": failed, "checks": checks}
    report("sigkill_runc_starts", summary)
    print(summary)
