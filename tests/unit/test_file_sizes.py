"""Every source file of the product (the plugin, the kernel module, the
interposer, the compiled front, and their own tests) stays at 400 lines or
fewer: one concern per file (issue 27).  Generated bindings are left out."""

from __future__ import annotations

import subprocess
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
LIMIT = 400
FOLDERS = ("nri_gpushare", "libgpushare", "kmod", "front")
SOURCES = ("*.py", "*.c", "*.h")


def sources() -> list[Path]:
    """The tracked sources (build outputs, e.g. gpushare.mod.c, are not)."""
    listed = subprocess.run(
        ["git", "ls-files", "--", *(f"{d}/{p}" for d in FOLDERS for p in SOURCES)],
        cwd=TOP,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [TOP / name for name in listed if "generated" not in Path(name).parts]


def test_no_source_file_is_over_the_limit() -> None:
    files = sources()
    assert len(files) > 150  # the walk sees the tree
    long = {
        str(p.relative_to(TOP)): n for p in files if (n := len(p.read_bytes().splitlines())) > LIMIT
    }
    assert not long, f"over {LIMIT} lines: {long}"
