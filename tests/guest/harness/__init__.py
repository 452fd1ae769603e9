"""Run commands, and pytest, inside a real Debian kernel under qemu (see vm.py):
bookworm's 6.1, or another with $GPUSHARE_GUEST_KERNEL (e.g. 6.12, 7.2)."""

from . import pytest_support, vm
from .pytest_support import (
    build_kmod_query,
    build_module,
    c_compiler,
    guest_suite,
    in_guest,
    junit_counts,
    kmod_source,
    pytest_in_guest,
    require_guest,
    run_guest_suite,
)
from .vm import (
    IN_GUEST_ENV,
    GuestCrashed,
    GuestError,
    GuestResult,
    GuestTimeout,
    GuestUnavailable,
    Kernel,
    check_prereqs,
    find_kernel,
    first_oops,
    guest_env,
    run_in_guest,
)

__all__ = [
    "build_kmod_query",
    "build_module",
    "c_compiler",
    "first_oops",
    "guest_suite",
    "kmod_source",
    "run_guest_suite",
    "IN_GUEST_ENV",
    "GuestCrashed",
    "GuestError",
    "GuestResult",
    "GuestTimeout",
    "GuestUnavailable",
    "Kernel",
    "check_prereqs",
    "find_kernel",
    "guest_env",
    "in_guest",
    "junit_counts",
    "pytest_in_guest",
    "require_guest",
    "pytest_support",
    "run_in_guest",
    "vm",
]
