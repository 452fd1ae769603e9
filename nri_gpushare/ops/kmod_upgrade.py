"""`nri-gpushare kmod-upgrade`: replace the loaded gpushare.ko by another version
without unregistering any container (kmod/README.md, "Upgrading the module").

The module hands its state over through /proc/gpushare/upgrade: `export`
freezes its registry and lets rmmod go with containers registered (refused
while any /dev/gpushare file is open: a live ledger cannot move to another
module); reading the file then gives the final state; the new version is
loaded with `await_import=1` (frozen, empty) and takes the state in one
all-or-nothing write.  The steps, each of which a rerun resumes:

1. export the old module (refused, nothing changed, while files are open),
2. read its state and save it to `<state-dir>/kmod-upgrade.state` (temp file,
   fsync, rename, fsync of the directory) before anything is unloaded,
3. rmmod the old module, load the new one waiting for the state,
4. import the saved state and verify it: registrations, settings, GPU time,
   bindings and the reference count as saved.

A failure after step 2 rolls back as well as it can (the module `modprobe
gpushare` gives, with the same state) and always leaves the state file and a
message saying what to do.  A rerun after an interruption (kill -9, a crash)
carries on from the module's state (`exported`, not loaded, `importing`)
with the saved file.  A state saved before a reboot is stale (its containers
and cgroups are gone) and is never imported.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from nri_gpushare.names import PROC_ROOT
from nri_gpushare.ops.kmod_upgrade_state import FALLBACK, MODULE, STATE_FILE, UpgradeError
from nri_gpushare.ops.kmod_upgrade_steps import Upgrade


class Host(Protocol):
    """What the upgrade needs of the machine (a fake stands in for it in unit tests)."""

    def read_state(self) -> str | None:
        """/proc/gpushare/upgrade's text; None when the module is not loaded."""

    def write_state(self, text: str) -> None:
        """One write(2) to /proc/gpushare/upgrade (OSError with the kernel's errno)."""

    def unload(self) -> None:
        """rmmod gpushare (OSError)."""

    def load(self, module: Path | None) -> None:
        """Load `module` (modprobe's gpushare when None) with await_import=1 (OSError)."""

    def refcount(self) -> int | None:
        """The module's reference count; None when not loaded."""

    def holders(self) -> list[tuple[int, str]]:
        """(pid, command) of the processes that hold /dev/gpushare open."""

    def boot_id(self) -> str: ...


class SystemHost:
    """The real machine: procfs, sysfs, finit_module(2) and modprobe."""

    def __init__(self, kmod_root: str | os.PathLike[str] = PROC_ROOT) -> None:
        self.root = Path(kmod_root)

    def read_state(self) -> str | None:
        try:
            return (self.root / "upgrade").read_text()
        except FileNotFoundError:
            if self.root.exists():
                raise UpgradeError(
                    f"{self.root} has no upgrade file: the loaded gpushare predates"
                    f" hot upgrades. {FALLBACK}"
                ) from None
            return None

    def write_state(self, text: str) -> None:
        fd = os.open(self.root / "upgrade", os.O_WRONLY)
        try:
            data = text.encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.EIO, "short write")
        finally:
            os.close(fd)

    def unload(self) -> None:
        from nri_gpushare.ops.kmod_admin import delete_module

        delete_module(MODULE)

    def load(self, module: Path | None) -> None:
        if module is None:
            done = subprocess.run(
                ["modprobe", MODULE, "await_import=1"], capture_output=True, text=True
            )
            if done.returncode:
                raise OSError(errno.EIO, (done.stderr or done.stdout).strip() or "modprobe failed")
            return
        number = {"x86_64": 313, "aarch64": 273}[os.uname().machine]
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(module, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.syscall(number, fd, b"await_import=1", 0) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(module))
        finally:
            os.close(fd)

    def refcount(self) -> int | None:
        from nri_gpushare.ops.kmod_admin import module_refcount

        return module_refcount(MODULE)

    def holders(self) -> list[tuple[int, str]]:
        from nri_gpushare.ops.kmod_admin import device_number, holders

        rdev = device_number()
        return holders(rdev) if rdev is not None else []

    def boot_id(self) -> str:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "kmod-upgrade",
        help="replace the loaded gpushare.ko by another version, keeping every registration",
    )
    parser.add_argument(
        "--module", type=Path, help="the new gpushare.ko (default: what modprobe gpushare loads)"
    )
    parser.add_argument("--kmod-root", default=PROC_ROOT)
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/nri-gpushare"))
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    upgrade = Upgrade(
        SystemHost(args.kmod_root),
        args.state_dir / STATE_FILE,
        module=args.module,
        log=lambda line: print(f"nri-gpushare kmod-upgrade: {line}"),
    )
    code, message = upgrade.run()
    print(message, file=sys.stderr if code else sys.stdout)
    return code
