"""The node installer on a clean Debian 13 (trixie) root, end to end.

A fresh trixie root (install_support: mmdebstrap, cached per day) is a node
as its operator has it: trixie's 6.12 kernel (the very version the qemu
guest boots, from the same mirror) and trixie's containerd 1.7.24, both
installed with apt, containerd with Debian's own config.toml and unit.  Then
the README's command, `sh scripts/install-node.sh`, and:

- DKMS built the module for 6.12 (with trixie's gcc-14), the daemon runs on
  trixie's Python, the unit passes `systemd-analyze verify`;
- `nri-gpushare enable` turns NRI on in Debian's config.toml, containerd
  started as Debian's unit says, and a CRI pod gets its share through the
  plugin;
- the DKMS-built module loads in the guest booting that 6.12 kernel and
  reports the installed version;
- uninstall leaves nothing of the installer's behind.

The Debian 12 suite (test_install.py) checks the rest: upgrades, pruning,
permissions.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.install_support import (
    REPO,
    UNIT,
    VERSION,
    Root,
    check_prerequisites,
    clean_root,
    containerd_for_this_machine,
    copy_tree,
    dkms_module,
    enable_then_run_a_pod,
    install,
    module_loads_in_guest,
    phase,
    uninstall_refuses_then_removes,
    unit_command,
    verify_unit,
)

pytestmark = [pytest.mark.containerd, pytest.mark.guest]

CONTAINERD_UNIT = "/usr/lib/systemd/system/containerd.service"


@pytest.fixture(scope="module")
def node() -> Iterator[Root]:
    """A trixie node with its kernel and containerd, after the README's
    install command."""
    check_prerequisites()
    with phase("the guest's 6.12 kernel (scripts/kernel-roots.sh trixie, made once)"):
        # Idempotent; waits for a concurrent maker (the kernel matrix's).
        made = subprocess.run(
            ["bash", str(REPO / "scripts/kernel-roots.sh"), "trixie"],
            capture_output=True,
            text=True,
        )
    if made.returncode != 0:
        pytest.fail(f"scripts/kernel-roots.sh trixie failed:\n{made.stdout}{made.stderr[-4000:]}")
    with clean_root("trixie", "6.12") as root:
        kernel = root.kernel
        with phase(f"the node's own kernel {kernel} and containerd (apt)"):
            root.ok("apt-get -q update >/dev/null")
            for package in (f"linux-image-{kernel}", f"linux-headers-{kernel}"):
                policy = root.ok(["apt-cache", "policy", package])
                if not re.search(r"Candidate: (?!\(none\))", policy):
                    pytest.fail(
                        f"the trixie mirror no longer has {package}, of the guest's kernel: "
                        "scripts/kernel-roots.sh --refresh trixie takes its current one"
                    )
            # The node's initramfs is never booted (the guest boots its own),
            # so its build, a minute and a half of CPU beside the other
            # lanes, is skipped: update-initramfs is diverted to true.
            root.ok(
                "dpkg-divert --local --rename --add /usr/sbin/update-initramfs"
                " && ln -s /bin/true /usr/sbin/update-initramfs"
            )
            root.apt_install(f"linux-image-{kernel}", "containerd")
        root.before = root.files()  # what the installer found
        with phase("copy the source tree"):
            copy_tree(root.host("/src"))
        install(root)
        yield root


def test_install_builds_the_module_for_612(node: Root) -> None:
    for command, target in (
        ("nri-gpushare", "nri-gpushare"),
        ("gpushare-runc", "gpushare-front"),  # compiled; the Python one is its fallback
        ("gpushare-smi", "gpushare-smi"),
    ):
        link = node.host(f"/usr/local/bin/{command}")
        assert os.readlink(link) == f"/opt/nri-gpushare/venv/bin/{target}"
    assert os.access(node.host("/opt/nri-gpushare/venv/bin/gpushare-front"), os.X_OK)
    # Synchronize's native scanner came with the package, built here, and loads
    node.ok([
        "/opt/nri-gpushare/venv/bin/python", "-I", "-c",  # -I: the venv's, not /src's
        "import logging; logging.basicConfig(level=logging.INFO); "
        "from nri_gpushare.nri.wire import native; assert native.library() is not None",
    ])  # fmt: skip
    python = node.ok(["/opt/nri-gpushare/venv/bin/python", "-c", "import sys; print(sys.version)"])
    assert python.startswith("3.13."), python
    status = node.ok(["dkms", "status", "gpushare"])
    assert f"gpushare/{VERSION}, {node.kernel}, x86_64: installed" in status, status
    ko = "/" + str(dkms_module(node).relative_to(node.path))
    vermagic = node.ok(["modinfo", "-F", "vermagic", ko])
    assert vermagic.startswith(node.kernel + " "), vermagic
    assert node.host("/etc/modules-load.d/gpushare.conf").read_text().splitlines()[-1] == "gpushare"
    assert node.host(UNIT).read_text() == (REPO / "systemd/nri-gpushare.service").read_text()


def test_installed_unit_verifies(node: Root) -> None:
    verify_unit(node)


def test_enable_in_debians_containerd_then_a_pod_gets_its_share(node: Root) -> None:
    """Debian's containerd as its package has it: /etc/containerd/config.toml
    (version 2, NRI not mentioned) and containerd.service's ExecStart."""
    assert " 1.7." in node.ok(["containerd", "--version"])
    containerd_for_this_machine(node)
    containerd = unit_command(node, "ExecStart", CONTAINERD_UNIT)
    enable_then_run_a_pod(node, containerd, node.host("/usr/bin/ctr"), VERSION)


def test_dkms_module_loads_in_the_612_guest(node: Root, tmp_path: Path) -> None:
    module_loads_in_guest(node, VERSION, tmp_path)


def test_uninstall_is_clean(node: Root) -> None:
    uninstall_refuses_then_removes(node, VERSION)
