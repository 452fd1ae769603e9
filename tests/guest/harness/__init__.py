"""Run commands, and pytest, inside a real Debian 6.1 kernel under qemu (see vm.py)."""

from .pytest_support import in_guest, junit_counts, pytest_in_guest, require_guest
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
    guest_env,
    run_in_guest,
)

__all__ = [
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
    "run_in_guest",
]
