"""`nri-gpushare uninstall`: unload gpushare.ko, never under a registered container.

Each registered container pins the module, so the kernel itself refuses to
unload it while any is registered; this refuses first, naming them.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path

from nri_gpushare.kmod.client import KernelModuleClient, ModuleNotLoaded, Registration
from nri_gpushare.kmod.procfs import describe

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


def uninstall(
    client: KernelModuleClient,
    *,
    module: str = "gpushare",
    unload: Callable[[str], None] = delete_module,
    sysfs: str | os.PathLike[str] = "/sys/module",
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
            refs = module_refcount(module, sysfs)
            return EXIT_REFUSED, (
                f"refusing to unload {module}: no container is registered but it is still in"
                f" use (reference count {refs}); a process probably holds /dev/gpushare open"
                " (find it with `fuser -v /dev/gpushare`), or another module depends on it"
            )
        if e.errno == errno.EPERM:
            return EXIT_FAILED, f"unloading {module} needs root (CAP_SYS_MODULE)"
        return EXIT_FAILED, f"could not unload {module}: {os.strerror(e.errno or errno.EIO)}"
    return EXIT_OK, f"unloaded {module}"


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
