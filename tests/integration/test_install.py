"""The node installer on a clean Debian 12 root, as an operator runs it.

A fresh bookworm root (install_support: mmdebstrap, cached per day) gets this
source tree, then the README's command, `sh scripts/install-node.sh`, for
the qemu guest's kernel.  In that root:

- the files are where docs/install.md says, the unit passes
  `systemd-analyze verify`, a re-run keeps the operator's config, and a new
  version replaces the DKMS module and adds an interposer version while the
  old one stays;
- containerd 1.7.24 installed by hand (as an operator would), `nri-gpushare
  enable`, containerd and the daemon started as the unit says, and a CRI pod
  with a share: its container sees the injected environment, its interposer
  mount names the versioned file, and `gpushare-smi` shows the pod;
- the DKMS-built gpushare.ko loads in the guest's kernel (never in this
  machine's), /proc/gpushare/version says the installed version;
- `--uninstall` refuses while the module reports registrations (a stand-in
  /proc/gpushare) and removes nothing, then removes what install added.

Debian 13 (trixie, kernel 6.12, its own containerd): test_install_trixie.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.install_support import (
    LIBDIR,
    REPO,
    UNIT,
    VERSION,
    Root,
    check_prerequisites,
    clean_root,
    containerd_for_this_machine,
    copy_tree,
    enable_then_run_a_pod,
    install,
    log,
    module_loads_in_guest,
    phase,
    uninstall_refuses_then_removes,
    verify_unit,
)
from tests.testbed.containerd import TRIXIE_BIN

pytestmark = [pytest.mark.containerd, pytest.mark.guest]

NEXT_VERSION = VERSION + ".post1"
CONTAINERD = ("containerd", "containerd-shim-runc-v2", "ctr")


@pytest.fixture(scope="module")
def node() -> Iterator[Root]:
    """A clean root with the source tree, after the README's install command."""
    check_prerequisites(TRIXIE_BIN / b for b in CONTAINERD)
    with clean_root("bookworm", "6.1") as root:
        with phase("copy the source tree"):
            copy_tree(root.host("/src"))
        with phase(f"headers of {root.kernel} in the root's mirror?"):
            headers_from_host_if_gone(root, root.kernel)
        install(root)
        yield root


def headers_from_host_if_gone(root: Root, kernel: str) -> None:
    """The installer takes linux-headers-<kernel> from the mirror.  Once the
    mirror has moved on to a newer kernel ABI, the guest's (this machine's
    installed 6.1) is no longer there: then its packages come from this
    machine's apt cache (install-prereqs.sh installed them through apt),
    installed into the root before the installer runs, which then finds
    them there."""
    name = f"linux-headers-{kernel}"
    root.ok("apt-get -q update >/dev/null")
    policy = root.ok(["apt-cache", "policy", name])
    if re.search(r"Candidate: (?!\(none\))", policy):
        log(f"{name}: from the mirror")
        return
    wanted = [name]
    depends = subprocess.run(
        ["dpkg-query", "-W", "-f=${Depends}", name], capture_output=True, text=True
    ).stdout
    wanted += [d.split()[0] for d in depends.split(",") if d.split()[0].startswith("linux-")]
    debs = []
    for package in wanted:
        version = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True
        ).stdout.replace(":", "%3a")
        found = sorted(Path("/var/cache/apt/archives").glob(f"{package}_{version}_*.deb"))
        if not version or not found:
            pytest.fail(
                f"{name} is neither on the root's mirror nor in this machine's apt cache "
                f"({package} {version or 'not installed'}): run scripts/install-prereqs.sh"
            )
        debs.append(found[0])
    (root.host("/tmp/headers")).mkdir(parents=True)
    for deb in debs:
        shutil.copy(deb, root.host(f"/tmp/headers/{deb.name}"))
    names = [f"/tmp/headers/{d.name}" for d in debs]
    root.apt_install(*names)
    log(f"{name}: not on the mirror; installed from this machine's apt cache: {names}")


# -- the tests, in order ----------------------------------------------------------------


def test_install_puts_everything_in_place(node: Root) -> None:
    kernel = node.kernel
    for command, program in (
        ("nri-gpushare", "nri-gpushare"),
        ("gpushare-runc", "gpushare-front"),  # compiled; the Python one is its fallback
        ("gpushare-smi", "gpushare-smi"),
    ):
        link = node.host(f"/usr/local/bin/{command}")
        assert os.readlink(link) == f"/opt/nri-gpushare/venv/bin/{program}"
    assert os.access(node.host("/opt/nri-gpushare/venv/bin/gpushare-front"), os.X_OK)
    # Synchronize's native scanner came with the package, built here, and loads
    node.ok([
        "/opt/nri-gpushare/venv/bin/python", "-I", "-c",  # -I: the venv's, not /src's
        "import logging; logging.basicConfig(level=logging.INFO); "
        "from nri_gpushare.nri.wire import native; assert native.library() is not None",
    ])  # fmt: skip
    assert node.ok(["nri-gpushare", "load-module", "--help"])
    config = node.host("/etc/nri-gpushare/gpushare.yaml").read_text()
    assert re.search(r"^inventory: \[\]", config, re.M), "the installed inventory is empty"
    assert re.search(r"^kmod_load: true$", config, re.M)
    check = (
        "from nri_gpushare.config import load_config as load; "
        "c = load('/etc/nri-gpushare/gpushare.yaml'); assert c.inventory == () and c.kmod_load"
    )
    node.ok(["/opt/nri-gpushare/venv/bin/python", "-c", check])
    # The interposer: a versioned file behind the configured link.
    assert os.readlink(node.host(f"{LIBDIR}/libgpushare.so")) == f"{VERSION}/libgpushare.so"
    lib = node.host(f"{LIBDIR}/{VERSION}/libgpushare.so")
    assert lib.stat().st_mode & 0o777 == 0o644 and lib.read_bytes()[:4] == b"\x7fELF"
    # DKMS: the module for the guest's kernel, rebuilt for every new kernel.
    dkms_conf = node.host(f"/usr/src/gpushare-{VERSION}/dkms.conf").read_text()
    assert 'AUTOINSTALL="yes"' in dkms_conf and f'PACKAGE_VERSION="{VERSION}"' in dkms_conf
    status = node.ok(["dkms", "status", "gpushare"])
    assert f"gpushare/{VERSION}, {kernel}, x86_64: installed" in status
    assert node.host(f"/lib/modules/{kernel}/updates/dkms/gpushare.ko").is_file()
    assert node.host("/etc/kernel/postinst.d/dkms").is_file(), "dkms's kernel hook"
    assert node.host("/etc/modules-load.d/gpushare.conf").read_text().splitlines()[-1] == "gpushare"
    assert node.host(UNIT).read_text() == (REPO / "systemd/nri-gpushare.service").read_text()
    assert "systemd is not running here: skipped" in node.install_log


def test_nothing_installed_is_world_writable(node: Root) -> None:
    """Installed under umask 000, still: a world-writable venv or interposer
    directory would let any local user change the daemon's code or what
    every GPU container loads."""
    paths = [
        "/opt/nri-gpushare",
        LIBDIR,
        "/etc/nri-gpushare",
        f"/usr/src/gpushare-{VERSION}",
        "/usr/local/share/doc/nri-gpushare",
        UNIT,
        "/etc/modules-load.d/gpushare.conf",
    ]
    found = node.ok(["find", *paths, "!", "-type", "l", "-perm", "-o+w"])
    assert found == "", f"world-writable:\n{found}"
    assert node.host("/etc/nri-gpushare/gpushare.yaml").stat().st_mode & 0o777 == 0o644


def test_installed_unit_verifies(node: Root) -> None:
    verify_unit(node)


def test_rerun_keeps_the_config_and_upgrades(node: Root) -> None:
    config = node.host("/etc/nri-gpushare/gpushare.yaml")
    config.write_text(config.read_text() + "# the operator's own line\n")
    ko = node.host(f"/lib/modules/{node.kernel}/updates/dkms/gpushare.ko")
    built = ko.stat().st_ino
    with phase("install again, same version"):
        again = node.ok(["sh", "scripts/install-node.sh", "--kernel", node.kernel])
    assert config.read_text().endswith("# the operator's own line\n")
    # The same sources: the module DKMS built stays, never removed to be rebuilt.
    assert "built and installed for" in again and ko.stat().st_ino == built, again
    with phase("copy a newer version of the tree"):
        copy_tree(node.host("/src-next"), NEXT_VERSION)
    with phase(f"install {NEXT_VERSION} over {VERSION}"):
        node.ok(["sh", "/src-next/scripts/install-node.sh", "--kernel", node.kernel])
    status = node.ok(["dkms", "status", "gpushare"])
    assert VERSION + "," not in status and f"gpushare/{NEXT_VERSION}, " in status, status
    assert not node.host(f"/usr/src/gpushare-{VERSION}").exists()
    assert os.readlink(node.host(f"{LIBDIR}/libgpushare.so")) == f"{NEXT_VERSION}/libgpushare.so"
    # The old version stays for containers that have it mounted.
    assert node.host(f"{LIBDIR}/{VERSION}/libgpushare.so").is_file()
    assert config.read_text().endswith("# the operator's own line\n")
    show = "import importlib.metadata as m; print(m.version('nri-gpushare'))"
    version = node.ok(["/opt/nri-gpushare/venv/bin/python", "-c", show])
    assert version.strip() == NEXT_VERSION


def test_prune_keeps_versions_a_container_has_mounted(node: Root) -> None:
    """An old interposer version goes only once no container has it mounted
    (here: a process in its own mount namespace with the file bind-mounted,
    as a container has it)."""
    old = f"{LIBDIR}/{VERSION}/libgpushare.so"
    holder = node.start(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"touch /tmp/lib && mount --bind {old} /tmp/lib && touch /tmp/held && exec sleep 600"],
        "holder.log",
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not node.host("/tmp/held").exists():
        assert time.monotonic() < deadline and holder.poll() is None, node.log_tail("holder.log")
        time.sleep(0.05)
    kept = node.ok(["sh", "scripts/install-node.sh", "--prune"])
    assert f"keeping interposer {VERSION}: a container has it mounted" in kept
    assert node.host(old).is_file()
    holder.kill()
    holder.wait()
    node.kill_processes()  # the sleep
    # A CDI spec generated before the upgrade still names it: containers
    # created from that spec would mount it.
    spec = node.host("/etc/cdi/gpushare.io-gpu.json")
    made_dir = not spec.parent.exists()
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(f'{{"mounts": [{{"hostPath": "{old}"}}]}}\n')
    kept = node.ok(["sh", "scripts/install-node.sh", "--prune"])
    assert f"keeping interposer {VERSION}: /etc/cdi/gpushare.io-gpu.json names it" in kept, kept
    assert node.host(old).is_file()
    spec.unlink()
    if made_dir:
        spec.parent.rmdir()
    pruned = node.ok(["sh", "scripts/install-node.sh", "--prune"])
    assert f"removed interposer {VERSION}" in pruned
    assert not node.host(f"{LIBDIR}/{VERSION}").exists()
    # The current version is never pruned.
    assert node.host(f"{LIBDIR}/{NEXT_VERSION}/libgpushare.so").is_file()


def test_enable_then_a_pod_gets_its_share(node: Root) -> None:
    """containerd 1.7.24 as an operator installs it by hand: the test bed's
    binaries in /usr/local/bin, Debian's runc, `containerd config default`."""
    for binary in CONTAINERD:
        shutil.copy2(TRIXIE_BIN / binary, node.host(f"/usr/local/bin/{binary}"))
    with phase("apt-get install runc (in the root)"):
        node.apt_install("runc")
    node.host("/etc/containerd").mkdir(exist_ok=True)
    default = node.ok(["containerd", "config", "default"])
    node.host("/etc/containerd/config.toml").write_text(default)
    containerd_for_this_machine(node)
    enable_then_run_a_pod(node, ["containerd"], TRIXIE_BIN / "ctr", NEXT_VERSION)


def test_dkms_module_loads_in_the_guest(node: Root, tmp_path: Path) -> None:
    module_loads_in_guest(node, NEXT_VERSION, tmp_path)


def test_uninstall_refuses_while_registered_then_removes(node: Root) -> None:
    uninstall_refuses_then_removes(node, NEXT_VERSION)
