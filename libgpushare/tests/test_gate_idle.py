"""The compute gate's slices end on time (src/gate*.c): a process
that launches briefly then idles is charged its work, not its idle time; a
drain does not wait without limit for work that waits for a later launch;
a container deleted and registered again is gated again.

The probe (below, built here) links the fake driver; module mode goes
through the /dev/gpushare stand-in (tests/fake/fake_gsdev.c), and the
ENOENT test puts a shim before it that plays the module's side of a
container deleted and registered again: from FROM_NS, SCHED on every
descriptor opened before TO_NS answers ENOENT (the old registration), and
/dev/gpushare does not open until TO_NS (no registration).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import LIBDIR, Compute

PROBE = r"""
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include <gpushare.h>
#include "cuda_abi.h"
CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
			unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
uint64_t fakecuda_busy_ns(void);
static uint64_t now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static void nap(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };
	nanosleep(&ts, NULL);
}
static void launch(unsigned int us)
{
	if (cuLaunchKernel((CUfunction)1, us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)) {
		fprintf(stderr, "launch failed\n");
		exit(1);
	}
}
static uint64_t gputime(void)
{
	struct gpushare_sched q;
	int fd = open("/dev/gpushare", O_RDWR);
	memset(&q, 0, sizeof(q));
	q.size = sizeof(q);
	q.op = GPUSHARE_SCHED_INFO;
	if (fd < 0 || ioctl(fd, GPUSHARE_IOC_SCHED, &q))
		return 0;
	close(fd);
	return q.gputime_ns;
}
int main(int argc, char **argv)
{
	CUcontext c;
	const char *t0s = getenv("PROBE_T0");
	if (argc < 2)
		return 2;
	cuInit(0);
	cuDevicePrimaryCtxRetain(&c, 0);
	cuCtxSetCurrent(c);
	uint64_t t0 = t0s ? strtoull(t0s, NULL, 10) : now();
	while (now() < t0)
		nap(1000000);
	if (!strcmp(argv[1], "idle")) {	/* 1 ms of work every 200 ms */
		int n = atoi(argv[2]);
		for (int i = 0; i < n; i++) {
			launch(1000);
			cuStreamSynchronize(NULL);
			nap(200000000);
		}
		printf("RESULT {\"work_ns\": %llu, \"gputime_ns\": %llu}\n",
			(unsigned long long)fakecuda_busy_ns(), (unsigned long long)gputime());
	} else if (!strcmp(argv[1], "drain")) {	/* 2 s of work, then a launch */
		launch(1);
		launch(2000000);
		nap(20000000);
		uint64_t t = now();
		launch(1);
		uint64_t wait = now() - t;
		cuCtxSynchronize();
		printf("RESULT {\"wait_ns\": %llu}\n", (unsigned long long)wait);
	} else {	/* "loop": 1 ms kernels for SECONDS, busy ns per 100 ms */
		double secs = atof(argv[2]);
		uint64_t end = t0 + (uint64_t)(secs * 1e9), next = t0 + 100000000, last = 0;
		printf("RESULT {\"trace\": [");
		const char *sep = "";
		while (now() < end) {
			launch(1000);
			cuStreamSynchronize(NULL);
			if (now() >= next) {
				uint64_t b = fakecuda_busy_ns();
				printf("%s%llu", sep, (unsigned long long)(b - last));
				sep = ", ";
				last = b;
				next += 100000000;
			}
		}
		printf("]}\n");
	}
	return 0;
}
"""

SHIM = r"""
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include <gpushare.h>
#define API __attribute__((visibility("default")))
static uint64_t from = UINT64_MAX, to = UINT64_MAX;
static char fresh[4096];
static uint64_t now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
__attribute__((constructor)) static void init(void)
{
	const char *f = getenv("SHIM_FROM_NS"), *t = getenv("SHIM_TO_NS");
	if (f && t) {
		from = strtoull(f, NULL, 10);
		to = strtoull(t, NULL, 10);
	}
}
API int open(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	int (*real)(const char *, int, ...) =
		(int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
	if (strcmp(path, "/dev/gpushare"))
		return real(path, flags, mode);
	uint64_t t = now();
	if (t >= from && t < to)
		return errno = ENOENT, -1;
	int fd = real(path, flags, mode);
	if (fd >= 0 && fd < 4096)
		fresh[fd] = t >= to;
	return fd;
}
API int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	return open(path, flags, mode);
}
API int dup3(int old, int new, int flags)
{
	int (*real)(int, int, int) = (int (*)(int, int, int))dlsym(RTLD_NEXT, "dup3");
	int r = real(old, new, flags);
	if (r >= 0 && r < 4096 && old >= 0 && old < 4096)
		fresh[r] = fresh[old];
	return r;
}
API int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	int (*real)(int, unsigned long, ...) =
		(int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	if (req == GPUSHARE_IOC_SCHED && fd >= 0 && fd < 4096 && !fresh[fd] && now() >= from)
		return errno = ENOENT, -1;
	return real(fd, req, arg);
}
"""

UAPI = LIBDIR.parent / "kmod" / "include" / "uapi"


@pytest.fixture(scope="session")
def probe(compute_bins: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe and the shim, built next to the session's build."""
    d = tmp_path_factory.mktemp("gate-idle")
    fake = compute_bins[0].parent
    cc = os.environ.get("CC", "cc")
    (d / "probe.c").write_text(PROBE)
    (d / "shim.c").write_text(SHIM)
    flags = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", f"-I{UAPI}"]
    for argv in (
        [
            cc,
            *flags,
            f"-I{LIBDIR / 'src'}",
            "-o",
            str(d / "probe"),
            str(d / "probe.c"),
            f"-L{fake}",
            "-lcuda",
        ],
        [cc, *flags, "-shared", "-fPIC", "-o", str(d / "shim.so"), str(d / "shim.c"), "-ldl"],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode:
            pytest.fail(f"building {argv[-1]} failed:\n{proc.stderr}")
    return d


def _run(compute: Compute, probe: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    full = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUSHARE_", "FAKECUDA_", "FAKEGS_", "LD_"))
    }
    full.update(
        LD_LIBRARY_PATH=str(compute.build.fake_dir),
        FAKECUDA_DEVICES="2",
        FAKECUDA_GPU_STATE=str(compute.tmp / "gpu"),
    )
    full.update(env)
    return subprocess.Popen(
        [str(probe / "probe"), *args],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=60)
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"probe failed ({p.returncode}):\n{out}\n{err}"
    r: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    r["stderr"] = err
    return r


def test_an_idle_process_is_charged_its_work_not_its_idle_time(
    compute: Compute, probe: Path
) -> None:
    # Fixed 50 % each: a busy container, and one that launches 1 ms of work
    # every 200 ms.  Its slices end when its grants do (the releaser), so
    # it is charged about a slice per burst, not the 200 ms between them.
    compute.ctl("policy 0 3")
    bursts = 14
    t0 = time.monotonic_ns() + 300_000_000
    busy = compute.start(compute.container("busy", 50), seconds=3, t0=t0)
    idle = _run(
        compute, probe, {**compute.container("idle", 50), "PROBE_T0": str(t0)}, "idle", str(bursts)
    )
    b, i = compute.result(busy), _result(idle)
    msg = (
        f"busy {100 * b['share']:.1f} %; idle: work {i['work_ns'] / 1e6:.0f} ms, "
        f"charged {i['gputime_ns'] / 1e6:.0f} ms over {bursts} bursts"
    )
    print(msg)
    assert i["work_ns"] == bursts * 1_000_000, msg
    # A slice (10 ms) and its grace per burst at most, not 200 ms.
    assert i["gputime_ns"] <= bursts * 15_000_000, msg
    assert abs(100 * b["share"] - 50) <= 5, msg


def test_a_drain_does_not_wait_for_work_without_limit(compute: Compute, probe: Path) -> None:
    # 2 s of work queued; the next launch after the grant drains for at
    # most a slice, gives the slice back, and goes on.
    compute.ctl("policy 0 3")
    r = _result(_run(compute, probe, compute.container("long", 50), "drain"))
    msg = f"the launch after 2 s of queued work waited {r['wait_ns'] / 1e6:.1f} ms"
    print(msg)
    assert r["wait_ns"] < 500_000_000, msg


def test_a_container_registered_again_is_gated_again(compute: Compute, probe: Path) -> None:
    # 50 % fixed; deleted at 1.0 s (ENOENT: launches pass), registered
    # again at 1.5 s: gated again within about a second.
    compute.ctl("policy 0 3")
    t0 = time.monotonic_ns() + 300_000_000
    env = {
        **compute.container("again", 50),
        "PROBE_T0": str(t0),
        "SHIM_FROM_NS": str(t0 + 1_000_000_000),
        "SHIM_TO_NS": str(t0 + 1_500_000_000),
    }
    env["LD_PRELOAD"] = f"{probe / 'shim.so'} {env['LD_PRELOAD']}"
    r = _result(_run(compute, probe, env, "loop", "4"))
    tr = r["trace"]

    def share(a: float, b: float) -> float:
        w = tr[round(a * 10) : round(b * 10)]
        return 100 * sum(w) / (len(w) * 100e6)

    before, gone, again = share(0.2, 1.0), share(1.1, 1.5), share(2.8, 3.9)
    msg = f"before {before:.0f} %, deleted {gone:.0f} %, registered again {again:.0f} %"
    print(msg, r["stderr"])
    assert abs(before - 50) <= 8, msg
    assert gone >= 80, msg
    assert abs(again - 50) <= 8, msg
    assert "scheduled again" in r["stderr"], msg
