"""libgpushare.so where it is loaded without being asked: into every
program of a container (/etc/ld.so.preload), whatever the image's C
library, and under a tenant who controls the environment."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import Build

# The oldest glibc a container image may reasonably have (RHEL/CentOS 7).
OLDEST_GLIBC = (2, 17)


def _glibc_versions(lib: str) -> set[tuple[int, ...]]:
    if shutil.which("objdump") is None:
        pytest.skip("objdump is needed")
    out = subprocess.run(
        ["objdump", "-T", lib], capture_output=True, text=True, check=True
    ).stdout
    return {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)", out)}


def _needed(lib: str) -> list[str]:
    out = subprocess.run(["objdump", "-p", lib], capture_output=True, text=True, check=True).stdout
    return re.findall(r"NEEDED\s+(\S+)", out)


def test_library_loads_under_an_older_glibc_than_the_build_hosts(build: Build) -> None:
    # A symbol version newer than the image's glibc makes the loader refuse
    # every program of the container ("version `GLIBC_2.34' not found").
    versions = _glibc_versions(str(build.lib))
    assert versions and max(versions) <= OLDEST_GLIBC, sorted(versions)
    # Where dlopen and pthread_once live before glibc 2.34.
    needed = _needed(str(build.lib))
    assert "libdl.so.2" in needed and "libpthread.so.0" in needed, needed
