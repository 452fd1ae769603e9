"""`nri-gpushare uninstall`: unload gpushare.ko, never under a registered container.

Each registered container pins the module, so the kernel itself refuses to
unload it while any is registered; this refuses first, naming them.  An open
/dev/gpushare pins it too (only root and processes of registered containers
can open it); when that is what keeps it loaded, the refusal names the
processes that hold it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from nri_gpushare.kmod.abi import DEV_NAME, DEV_PATH
from nri_gpushare.kmod.procfs import describe
from nri_gpushare.share.kernel import KernelModuleClient, ModuleNotLoaded, Registration

EXIT_OK = 0
EXIT_REFUSED = 1  # containers are registered, or the module is otherwise in use
EXIT_FAILED = 2  # anything else (not root, ...)


def delete_module(name: str) -> None:
    """Unload kernel module `name` now, like rmmod; OSError carries the kernel's errno
    (EAGAIN/EBUSY while it is in use, ENOENT when not loaded, EPERM without privilege)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.delete_module(name.encode(), os.O_NONBLOCK) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name)


def module_refcount(name: str, sysfs: str | os.PathLike[str] = "/sys/module") -> int | None:
    """The module's reference count, or None when it is not loaded."""
    try:
        return int(Path(sysfs, name, "refcnt").read_text())
    except (OSError, ValueError):
        return None


MISC_MAJOR = 10


def device_number(proc: str | os.PathLike[str] = "/proc", dev: str = DEV_PATH) -> int | None:
    """/dev/gpushare's device number: its misc minor from /proc/misc, else
    the node's; None when neither is there."""
    try:
        for line in Path(proc, "misc").read_text().splitlines():
            minor, _, name = line.strip().partition(" ")
            if name == DEV_NAME and minor.isdigit():
                return os.makedev(MISC_MAJOR, int(minor))
    except OSError:
        pass
    try:
        return os.stat(dev).st_rdev
    except OSError:
        return None


def holders(rdev: int, proc: str | os.PathLike[str] = "/proc") -> list[tuple[int, str]]:
    """(pid, command name) of every process with an open file on character
    device `rdev`, by the /proc/<pid>/fd links (root sees them all)."""
    found = []
    for entry in Path(proc).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue  # gone, or not ours to look at
        for fd in fds:
            try:
                st = os.stat(fd)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == rdev:
                try:
                    comm = (entry / "comm").read_text().strip()
                except OSError:
                    comm = "?"
                found.append((int(entry.name), comm))
                break
    return sorted(found)


def uninstall(
    client: KernelModuleClient,
    *,
    module: str = "gpushare",
    unload: Callable[[str], None] = delete_module,
    sysfs: str | os.PathLike[str] = "/sys/module",
    proc: str | os.PathLike[str] = "/proc",
) -> tuple[int, str]:
    """Unload `module` unless containers are registered: (exit code, message for a person).

    Exit codes: EXIT_OK (unloaded, or was not loaded), EXIT_REFUSED (containers
    registered or the module still in use; the message lists them), EXIT_FAILED.
    """
    if not Path(sysfs, module).is_dir() and not client.loaded():
        return EXIT_OK, f"{module} is not loaded; nothing to uninstall"
    if regs := _registered(client):
        return EXIT_REFUSED, _refusal(module, regs)
    try:
        unload(module)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return EXIT_OK, f"{module} is not loaded; nothing to uninstall"
        if e.errno in (errno.EAGAIN, errno.EBUSY):
            if regs := _registered(client):
                return EXIT_REFUSED, _refusal(module, regs)
            return EXIT_REFUSED, _busy(module, module_refcount(module, sysfs), proc)
        if e.errno == errno.EPERM:
            return EXIT_FAILED, f"unloading {module} needs root (CAP_SYS_MODULE)"
        return EXIT_FAILED, f"could not unload {module}: {os.strerror(e.errno or errno.EIO)}"
    return EXIT_OK, f"unloaded {module}"


def _busy(module: str, refs: int | None, proc: str | os.PathLike[str]) -> str:
    head = (
        f"refusing to unload {module}: no container is registered but it is still in use"
        f" (reference count {refs})"
    )
    rdev = device_number(proc)
    held = holders(rdev, proc) if rdev is not None else []
    if held:
        names = ", ".join(f"PID {pid} ({comm})" for pid, comm in held)
        return (
            f"{head}; {DEV_PATH} is held open by {names}: stop them (or let them close it),"
            " then run `nri-gpushare uninstall` again"
        )
    return (
        f"{head}; no process holds {DEV_PATH} open now: an inst_ctl command may be"
        " running, another module may depend on it, or a descriptor of it may be in"
        " flight in a unix socket (sent, not yet received); try again"
    )


def _registered(client: KernelModuleClient) -> list[Registration]:
    try:
        return client.registrations()
    except ModuleNotLoaded:
        return []


def _refusal(module: str, regs: list[Registration]) -> str:
    n = len(regs)
    lines = [
        f"refusing to unload {module}: {n} container{'s' if n != 1 else ''}"
        f" {'are' if n != 1 else 'is'} still registered:"
    ]
    lines += [f"  {r.container_id}  ({describe(r)})" for r in regs]
    lines.append(
        "Stop or remove these containers first (each releases its registration),"
        " then run `nri-gpushare uninstall` again."
    )
    return "\n".join(lines)
