"""Fixtures for the interposer's tests: the library and its fake drivers,
built once per session, and a runner for client programs under LD_PRELOAD.

The client is NVIDIA's `cuda-bindings` (`from cuda.bindings import driver`),
which resolves every driver entry point through dlsym + cuGetProcAddress as
the CUDA runtime does, against the fake driver (host memory) and the fake
NVML built from tests/fake/.  Each client runs in its own process: the
preload and the fakes' configuration are per process.

This directory has no __init__.py on purpose: as a package it would be
named `tests` (its parent, libgpushare/, is no package) and clash with the
repository's own `tests` package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

LIBDIR = Path(__file__).resolve().parent.parent
ROOT = LIBDIR.parent
if str(ROOT) not in sys.path:  # `pytest` run without `python -m`
    sys.path.insert(0, str(ROOT))

from tests.prereqs import missing  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20

# The fake driver's device i (tests/fake/fake_cuda.c).
FAKE_UUIDS = [f"GPU-face0000-0000-0000-0000-{i:012x}" for i in range(8)]
FAKE_MEMORY = 8 * GiB  # each fake device's own memory in these tests

# Variables a client must not inherit from whoever runs the tests.
_SCRUBBED = ("LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
_SCRUBBED_PREFIXES = ("GPUSHARE_", "FAKECUDA_", "FAKENVML_")


@dataclass(frozen=True)
class Build:
    """What `make -C libgpushare BUILD=dir` produced."""

    dir: Path

    @property
    def lib(self) -> Path:
        return self.dir / "libgpushare.so"

    @property
    def nolookup(self) -> Path:
        """Built without the dlsym / cuGetProcAddress wrappers."""
        return self.dir / "libgpushare-nolookup.so"

    @property
    def fake_dir(self) -> Path:
        return self.dir / "fake"


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    """Build the library, the no-lookup variant and the fakes, once."""
    for tool in ("make", os.environ.get("CC", "cc")):
        if shutil.which(tool) is None:
            missing(f"{tool} is needed to build libgpushare")
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        missing("cuda-bindings (the test extras) is needed to test libgpushare")
    out = tmp_path_factory.mktemp("libgpushare-build")
    proc = subprocess.run(
        ["make", "-C", str(LIBDIR), f"BUILD={out}", "all", "nolookup", "fake"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"building libgpushare failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    b = Build(out)
    for p in (b.lib, b.nolookup, b.fake_dir / "libcuda.so.1", b.fake_dir / "libnvidia-ml.so.1"):
        assert p.is_file(), f"make did not produce {p}"
    yield b


# The start of every client program: helpers, then the test's body.
# `call(fn, *args)` -> (error name, what the call returned: one value, a
# tuple of several, or () for none); `ok(...)` returns the value and fails
# the client on an error.  Results go into R (JSON values), printed on the
# last line.
CLIENT_PRELUDE = r"""
import json, sys
from cuda.bindings import driver as d

R = {}

def call(fn, *args):
    res = fn(*args)
    err, rest = res[0], res[1:]
    return err.name, (rest[0] if len(rest) == 1 else rest)

def ok(fn, *args):
    err, vals = call(fn, *args)
    if err != "CUDA_SUCCESS":
        raise SystemExit(f"{fn.__name__}{args!r}: {err}")
    return vals

def device(ordinal):
    dev = d.CUdevice(ordinal)
    ctx = ok(d.cuDevicePrimaryCtxRetain, dev)
    ok(d.cuCtxSetCurrent, d.CUcontext(ctx))
    return dev

def mem_info():
    free, total = ok(d.cuMemGetInfo)
    return {"free": free, "total": total}

def loaded(name):
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if l.rstrip().endswith("/" + name)})

ok(d.cuInit, 0)
"""

CLIENT_EPILOGUE = r"""
R["libcuda"] = loaded("libcuda.so.1")
R["preloaded"] = loaded("libgpushare.so") + loaded("libgpushare-nolookup.so")
print("RESULT " + json.dumps(R))
"""


@dataclass(frozen=True)
class Client:
    build: Build

    def run(
        self,
        body: str,
        *,
        preload: str | None = "lib",
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run @body (Python using the prelude's helpers) in a new process.

        @preload: "lib" (libgpushare.so), "nolookup" (the variant without
        the lookup wrappers) or None.  @env is added to a clean environment
        holding two fake GPUs of FAKE_MEMORY bytes each.
        """
        full = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
        }
        full["LD_LIBRARY_PATH"] = str(self.build.fake_dir)
        full["FAKECUDA_DEVICES"] = "2"
        full["FAKECUDA_MEMORY"] = str(FAKE_MEMORY)
        if preload == "lib":
            full["LD_PRELOAD"] = str(self.build.lib)
        elif preload == "nolookup":
            full["LD_PRELOAD"] = str(self.build.nolookup)
        else:
            assert preload is None, preload
        full.update(env or {})
        code = CLIENT_PRELUDE + body + CLIENT_EPILOGUE
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=full,
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            pytest.fail(
                f"client failed (exit {proc.returncode}, preload {preload}):\n"
                f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}",
                pytrace=False,
            )
        result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
        # The client must have reached the fake driver, and only through
        # the library it was meant to.
        assert result["libcuda"] == [str(self.build.fake_dir / "libcuda.so.1")]
        want = {"lib": [str(self.build.lib)], "nolookup": [str(self.build.nolookup)], None: []}
        assert result["preloaded"] == want[preload]
        result["stderr"] = proc.stderr
        return result


@pytest.fixture
def client(build: Build) -> Client:
    return Client(build)


def quota_env(*limits: int, uuids: list[str] | None = None, **extra: str) -> dict[str, str]:
    """GPUSHARE_* for quotas @limits on fake GPUs 0, 1, ... (or @uuids)."""
    ids = uuids if uuids is not None else FAKE_UUIDS[: len(limits)]
    env = {
        "GPUSHARE_GPU_UUIDS": ",".join(ids),
        "GPUSHARE_MEMORY_LIMIT": ",".join(str(n) for n in limits),
    }
    env.update(extra)
    return env


# ---- the compute tests: loads on the fake driver's simulated GPU ----


@dataclass(frozen=True)
class Compute:
    """Runs tests/compute_load.c on a simulated GPU shared by its processes.

    Module mode: each simulated container is a FAKEGS_CONTAINER of the
    /dev/gpushare stand-in, whose schedule (the real core) is shared through
    FAKEGS_SCHED and set live through FAKEGS_CTL (tests/fake/fake_gsdev.c).
    """

    build: Build
    gsdev: Path
    load: Path
    tmp: Path

    @property
    def hostile(self) -> Path:
        """tests/hostile_sched.c: a tenant driving GPUSHARE_IOC_SCHED itself."""
        return self.build.dir / "tests" / "hostile_sched"

    @property
    def ctl_path(self) -> Path:
        return self.tmp / "ctl"

    def ctl(self, *lines: str) -> None:
        """Replace the stand-in's settings (applied at its next SCHED call)."""
        tmp = self.tmp / "ctl.new"
        tmp.write_text("".join(f"{ln}\n" for ln in lines))
        tmp.rename(self.ctl_path)

    def container(self, name: str, weight: int = 0, highprio: int = 0) -> dict[str, str]:
        """The environment of a process of simulated container @name (GPU 0)."""
        return {
            "LD_PRELOAD": f"{self.gsdev} {self.build.lib}",
            "FAKEGS_CONTAINER": name,
            "FAKEGS_QUOTAS": f"0:{FAKE_MEMORY}:{weight}:{highprio}",
            "FAKEGS_STATE": str(self.tmp / f"ledger-{name}"),
            "FAKEGS_SCHED": str(self.tmp / "sched"),
            "FAKEGS_CTL": str(self.ctl_path),
            "GPUSHARE_GPU_UUIDS": FAKE_UUIDS[0],
        }

    def standalone(self, core_limit: str | None, *, preload: str = "lib") -> dict[str, str]:
        """A process in standalone mode (no /dev/gpushare)."""
        lib = {"lib": self.build.lib, "nolookup": self.build.nolookup, "none": None}[preload]
        env = {"LD_PRELOAD": str(lib) if lib else ""}
        if core_limit is not None:
            env["GPUSHARE_CORE_LIMIT"] = core_limit
        return env

    def start(
        self,
        env: dict[str, str],
        path: str = "kernel",
        *,
        kernel_us: int = 100,
        seconds: float = 2.0,
        device: int = 0,
        lookup: str = "direct",
        t0: int | None = None,
        trace_ms: int | None = None,
        program: Path | None = None,
    ) -> subprocess.Popen[str]:
        """Start one load; @t0 (time.monotonic_ns()) makes several overlap.
        @program: another workload taking compute_load's first arguments
        (default compute_load)."""
        full = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
        }
        full["LD_LIBRARY_PATH"] = str(self.build.fake_dir)
        full["FAKECUDA_DEVICES"] = "2"
        full["FAKECUDA_GPU_STATE"] = str(self.tmp / "gpu")
        if t0 is not None:
            full["COMPUTE_LOAD_T0"] = str(t0)
        if trace_ms is not None:
            full["COMPUTE_LOAD_TRACE_MS"] = str(trace_ms)
        full.update(env)
        argv = [str(program or self.load), path, str(kernel_us), str(seconds), str(device), lookup]
        if program is not None:
            argv = argv[:4]
        return subprocess.Popen(
            argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    @staticmethod
    def result(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
        """A load's RESULT line, with its share of the GPU over its run."""
        out, err = proc.communicate(timeout=timeout)
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            pytest.fail(
                f"compute_load {proc.args!r} failed (exit {proc.returncode}):\n"
                f"--- stdout\n{out}\n--- stderr\n{err}",
                pytrace=False,
            )
        r: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
        r["share"] = r["gpu_ns"] / r["wall_ns"]
        r["stderr"] = err
        return r

    def run(self, *loads: dict[str, Any], lead_s: float = 0.3) -> list[dict[str, Any]]:
        """Run loads (start()'s keyword arguments, env included) together:
        they begin launching at the same moment, @lead_s from now."""
        t0 = time.monotonic_ns() + int(lead_s * 1e9)
        procs = [self.start(**{"t0": t0, **load}) for load in loads]
        return [self.result(p) for p in procs]


@pytest.fixture(scope="session")
def compute_bins(build: Build) -> tuple[Path, Path]:
    """The stand-in and the workload (and tests/hostile_sched.c, a hostile
    tenant: Compute.hostile), built into the session's build."""
    gsdev = build.fake_dir / "fake_gsdev.so"
    load = build.dir / "tests" / "compute_load"
    hostile = build.dir / "tests" / "hostile_sched"
    proc = subprocess.run(
        ["make", "-C", str(LIBDIR), f"BUILD={build.dir}", str(gsdev), str(load), str(hostile)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the compute tests failed:\n{proc.stdout}\n{proc.stderr}")
    return gsdev, load


@pytest.fixture
def compute(build: Build, compute_bins: tuple[Path, Path], tmp_path: Path) -> Compute:
    """A fresh simulated GPU and schedule for one test."""
    return Compute(build, compute_bins[0], compute_bins[1], tmp_path)
