"""Self-test of the qemu guest harness (tests/guest/harness), run from the host.

Tests marked `guest` boot the guest's kernel under qemu (a few seconds each
under TCG): Debian's 6.1, or $GPUSHARE_GUEST_KERNEL's (e.g. 6.12 or 7.2 from
scripts/kernel-roots.sh); the others check the harness's pure parts without
booting.
"""

from __future__ import annotations

import lzma
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.guest.harness import (
    GuestCrashed,
    GuestResult,
    GuestUnavailable,
    Kernel,
    build_module,
    first_oops,
    guest_suite,
    in_guest,
    junit_counts,
    pytest_in_guest,
    pytest_support,
    require_guest,
    run_guest_suite,
    run_in_guest,
    vm,
)

pytestmark = pytest.mark.skipif(in_guest(), reason="host-side test: it boots the guest itself")

CLI = str(vm.REPO / "scripts" / "run-in-guest.sh")


@pytest.fixture
def kernel() -> Kernel:
    return require_guest()


def report(r: vm.GuestResult) -> None:
    print(f"[harness] status {r.status}, command after {r.boot_s:.1f} s, total {r.total_s:.1f} s")


@pytest.mark.guest
def test_true_exits_zero(kernel: Kernel) -> None:
    r = run_in_guest(["true"], cwd=vm.REPO)
    report(r)
    assert r.status == 0
    assert "gpushare-guest: exit status 0" in r.console
    assert r.serial_log.read_text() == r.console
    assert not r.kernel_warned


@pytest.mark.guest
def test_cli_passes_exit_status_through(kernel: Kernel) -> None:
    p = subprocess.run([CLI, "--", "exit 3"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "status 3" in p.stderr


@pytest.mark.guest
def test_kernel_environment_cwd_and_module(kernel: Kernel, tmp_path: Path) -> None:
    dummy = next(kernel.modules.glob("kernel/drivers/net/dummy.ko*"))  # xz-compressed since 6.x
    value = "a 'b' \"c\" $HOME `x`"
    host_only = tmp_path / "only-in-the-host-root"
    host_only.write_text("host root\n")
    script = (
        'cat /proc/version; echo "cwd=$(pwd)"; printf "v=%s\\n" "$VALUE"; '
        'echo "py=$(command -v python)"; echo "autoload=$PYTEST_DISABLE_PLUGIN_AUTOLOAD"; '
        "test -d /sys/module/dummy && echo dummy=loaded; "
        'grep -q " /sys/fs/cgroup cgroup2 " /proc/mounts && echo cgroup2=mounted; '
        "python -c \"import sys; print('prefix=' + sys.prefix)\"; "
        # A process joining a mount namespace (nsenter -m, runc exec, CRI ExecSync)
        # must land in the overlay root, not in the initramfs underneath it.
        "unshare -m sleep 60 & pid=$!; "
        'while [ "$(readlink /proc/$pid/ns/mnt)" = "$(readlink /proc/self/ns/mnt)" ]; do '
        "sleep 0.1; done; "
        f'nsenter -t "$pid" -m cat {shlex.quote(str(host_only))} && echo setns=hostroot'
    )
    r = run_in_guest(["sh", "-c", script], cwd=tmp_path, env={"VALUE": value}, modules=[dummy])
    report(r)
    assert r.status == 0
    out = r.console.splitlines()
    assert any(line.startswith(f"Linux version {kernel.version} ") for line in out)
    assert f"cwd={tmp_path}" in out
    assert f"v={value}" in out
    assert f"py={vm.VENV_BIN}/python" in out
    assert "autoload=1" in out
    assert "dummy=loaded" in out
    assert "cgroup2=mounted" in out
    assert f"prefix={vm.REPO}/.venv" in out
    assert "setns=hostroot" in out


@pytest.mark.guest
def test_rwdir_writes_reach_the_host_and_nothing_else_does(kernel: Kernel, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_in_guest(
        "echo hello > out/file; id -u > out/uid; echo leak > leaked", cwd=tmp_path, rwdirs=[out]
    )
    assert r.status == 0
    assert (out / "file").read_text() == "hello\n"
    assert (out / "uid").read_text() == "0\n"
    assert not (tmp_path / "leaked").exists()  # the guest's / is a throwaway layer


@pytest.mark.guest
def test_pytest_runs_inside_the_guest(kernel: Kernel, tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(f"""\
        import os

        def test_in_guest_kernel():
            assert os.environ["GPUSHARE_IN_GUEST"] == "1"
            assert open("/proc/version").read().startswith("Linux version {kernel.version} ")

        def test_expected_to_fail():
            assert False, "this failure must reach the host"
    """)
    )
    junit = tmp_path / "out" / "junit.xml"
    r = pytest_in_guest(["-v", "test_inner.py"], junit=junit, cwd=tmp_path)
    report(r)
    assert r.status == 1  # pytest: some tests failed
    assert junit_counts(junit) == {"tests": 2, "failures": 1, "errors": 0, "skipped": 0}
    assert "test_inner.py::test_in_guest_kernel PASSED" in r.console
    assert "this failure must reach the host" in r.console


HELLO_C = """\
// SPDX-License-Identifier: GPL-2.0-only
#include <linux/module.h>
#include <linux/init.h>

static int __init hello_init(void)
{
\tpr_info("gs_hello: loaded\\n");
\treturn 0;
}
module_init(hello_init);
MODULE_LICENSE("GPL");
"""


@pytest.mark.guest
def test_a_module_built_for_the_kernel_loads_in_it(kernel: Kernel, tmp_path: Path) -> None:
    """build_module builds with the kernel's own toolchain (in its root, if it has one)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "Kbuild").write_text("obj-m := gs_hello.o\n")
    (src / "gs_hello.c").write_text(HELLO_C)
    ko = build_module(src, tmp_path / "hello", kernel)
    assert f"vermagic={kernel.version} ".encode() in ko.read_bytes()
    r = run_in_guest("test -d /sys/module/gs_hello && dmesg | grep 'gs_hello: loaded'", cwd="/",
                     modules=[ko])  # fmt: skip
    report(r)
    assert r.status == 0
    assert not r.kernel_warned


@pytest.mark.guest
def test_kernel_crash_is_a_failure(kernel: Kernel) -> None:
    with pytest.raises(GuestCrashed, match="panicked") as e:
        run_in_guest("echo c > /proc/sysrq-trigger; exit 0", cwd="/")
    assert "sysrq" in e.value.console


@pytest.mark.guest
def test_timeout_is_a_failure(kernel: Kernel) -> None:
    p = subprocess.run(
        [CLI, "--timeout", "3", "--", "sleep 600"], capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 124, p.stdout + p.stderr
    assert "did not finish within 3 s" in p.stderr


# --- no boot --------------------------------------------------------------


def test_missing_prerequisite_fails_unless_skipping_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vm, "QEMU", "qemu-system-missing")
    with pytest.raises(GuestUnavailable, match="qemu-system-missing"):
        vm.check_prereqs()
    monkeypatch.delenv("GPUSHARE_ALLOW_SKIP", raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception, match="qemu-system-missing"):
        require_guest()
    monkeypatch.setenv("GPUSHARE_ALLOW_SKIP", "1")
    with pytest.raises(pytest.skip.Exception, match="qemu-system-missing"):
        require_guest()
    monkeypatch.setenv("CI", "true")  # CI never skips
    with pytest.raises(pytest.fail.Exception, match="qemu-system-missing"):
        require_guest()


def fake_kernel_root(roots: Path, release: str, version: str, headers: bool = True) -> Path:
    root = roots / release / "root"
    (root / "boot").mkdir(parents=True)
    (root / "boot" / f"vmlinuz-{version}").write_bytes(b"")
    (root / "lib" / "modules" / version).mkdir(parents=True)
    (root / "lib" / "modules" / version / "modules.dep").write_text("")
    if headers:
        (root / "usr" / "src" / f"linux-headers-{version}").mkdir(parents=True)
        (root / "usr" / "src" / f"linux-headers-{version}" / "Makefile").write_text("")
    return root


def test_find_kernel_takes_a_version_or_a_release_from_the_kernel_roots(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(vm, "KERNEL_ROOTS", tmp_path)
    trixie = fake_kernel_root(tmp_path, "trixie", "6.12.117+deb13-amd64")
    fake_kernel_root(tmp_path, "sid", "7.2.13+deb14-amd64")
    fake_kernel_root(tmp_path, "forky", "7.3.1+deb14-amd64", headers=False)

    k = vm.find_kernel("6.12")
    assert (k.version, k.root) == ("6.12.117+deb13-amd64", trixie)
    assert k.image == trixie / "boot" / "vmlinuz-6.12.117+deb13-amd64"
    assert k.build == Path("/usr/src/linux-headers-6.12.117+deb13-amd64")  # in the root
    assert k.host_path(k.build) == trixie / "usr/src/linux-headers-6.12.117+deb13-amd64"
    assert vm.find_kernel("sid").version == "7.2.13+deb14-amd64"
    assert vm.find_kernel("7.2.13+deb14-amd64").version == "7.2.13+deb14-amd64"
    monkeypatch.setenv(vm.KERNEL_ENV, "trixie")
    assert vm.find_kernel().root == trixie
    for absent in ("6.13", "7.3", "forky"):  # forky's root has no headers
        with pytest.raises(GuestUnavailable, match="kernel-roots.sh"):
            vm.find_kernel(absent)


def test_a_version_is_matched_up_to_a_separator() -> None:
    assert vm._is_version("6.1.0-56-amd64", "6.1")
    assert not vm._is_version("6.12.117+deb13-amd64", "6.1")
    assert vm._is_version("6.12.117+deb13-amd64", "6.12.117")
    assert vm._is_version("7.2.13+deb14-amd64", "7.2")


def test_compressed_modules_go_into_the_initramfs_uncompressed(tmp_path: Path) -> None:
    elf = b"\x7fELF module"
    (tmp_path / "a.ko.xz").write_bytes(lzma.compress(elf, lzma.FORMAT_XZ))
    (tmp_path / "b.ko").write_bytes(elf)
    assert vm.module_bytes(tmp_path / "a.ko.xz") == elf
    assert vm.module_bytes(tmp_path / "b.ko") == elf
    (tmp_path / "c.ko.bz2").write_bytes(b"")
    with pytest.raises(GuestUnavailable, match="compressed"):
        vm.module_bytes(tmp_path / "c.ko.bz2")


def test_module_order_puts_dependencies_first(tmp_path: Path) -> None:
    dep = tmp_path / "modules.dep"
    dep.write_text(
        textwrap.dedent("""\
        kernel/fs/9p/9p.ko: kernel/fs/netfs/netfs.ko kernel/net/9p/9pnet.ko kernel/fs/fscache.ko
        kernel/fs/fscache.ko: kernel/fs/netfs/netfs.ko
        kernel/fs/netfs/netfs.ko:
        kernel/net/9p/9pnet.ko:
        kernel/net/9p/9pnet_virtio.ko: kernel/drivers/virtio_ring.ko kernel/net/9p/9pnet.ko
        kernel/drivers/virtio_ring.ko:
    """)
    )
    (tmp_path / "modules.builtin").write_text("kernel/fs/overlayfs/overlay.ko\n")
    order = vm.module_order(dep, ["9pnet_virtio", "9p", "overlay"])
    names = [Path(m).name for m in order]
    assert names == [
        "virtio_ring.ko",
        "9pnet.ko",
        "9pnet_virtio.ko",
        "netfs.ko",
        "fscache.ko",
        "9p.ko",
    ]
    with pytest.raises(GuestUnavailable, match="nosuch"):
        vm.module_order(dep, ["nosuch"])


def test_module_order_takes_compressed_modules_and_builtin_drivers(tmp_path: Path) -> None:
    """6.12 and 7.x: xz-compressed modules, virtio_pci built in, fscache part of netfs."""
    dep = tmp_path / "modules.dep"
    dep.write_text(
        textwrap.dedent("""\
        kernel/fs/netfs/netfs.ko.xz:
        kernel/net/9p/9pnet.ko.xz:
        kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz
        kernel/fs/9p/9p.ko.xz: kernel/fs/netfs/netfs.ko.xz kernel/net/9p/9pnet.ko.xz
        kernel/fs/overlayfs/overlay.ko.xz:
    """)
    )
    (tmp_path / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\n")
    order = vm.module_order(dep, vm.BASE_MODULES)
    assert [vm._mod_name(m) for m in order] == ["9pnet", "9pnet_virtio", "netfs", "9p", "overlay"]


def test_job_script_rejects_bad_environment_names() -> None:
    with pytest.raises(ValueError, match="bad environment variable"):
        vm.job_script("true", "/", {"A B": "x"}, [])


def test_qemu_argv_takes_cpus_and_kernel_arguments(tmp_path: Path) -> None:
    kernel = Kernel("6.1.0-0-amd64", tmp_path / "vmlinuz", tmp_path, tmp_path)
    argv = vm.qemu_argv(
        kernel, tmp_path / "initrd", "/tmp/job", [], 512, smp=2, kernel_args=["slub_debug=FZP"]
    )
    assert argv[argv.index("-smp") + 1] == "2"
    append = argv[argv.index("-append") + 1].split()
    assert append[-2:] == ["slub_debug=FZP", "gsjob=/tmp/job"]
    assert "oops=panic" in append
    for bad in ("", "a b", "gsjob=/x"):
        with pytest.raises(ValueError, match="kernel argument"):
            vm.qemu_argv(kernel, tmp_path / "initrd", "/tmp/job", [], 512, kernel_args=[bad])
    with pytest.raises(ValueError, match="CPU"):
        vm.qemu_argv(kernel, tmp_path / "initrd", "/tmp/job", [], 512, smp=0)


OOPS_CONSOLE = """\
[   14.476005] gpushare-test: bind race
[   14.476005] BUG: kernel NULL pointer dereference, address: 0000000000000068
[   14.477209] RIP: 0010:gs_exec+0x215/0x5b0 [gpushare]
[   14.477813] general protection fault, probably for non-canonical address 0x6b6b6b6b6b6b6b8e
[   14.477813] Kernel panic - not syncing: Fatal exception
"""


def test_first_oops_names_the_first_crash_line() -> None:
    assert first_oops(OOPS_CONSOLE) == (
        "BUG: kernel NULL pointer dereference, address: 0000000000000068"
    )
    assert first_oops("[ 1.0] general protection fault, probably for 0x6b6b\n") == (
        "general protection fault, probably for 0x6b6b"
    )
    assert first_oops("[ 1.0] all is well\n") is None


def test_guest_suite_discovers_the_in_guest_files() -> None:
    kmod = guest_suite("kmod_guest_")
    assert "tests/guest/kmod_guest_race_bind.py" in kmod
    assert "tests/guest/kmod_guest_race_unload.py" in kmod
    assert kmod == sorted(kmod) and all(p.endswith(".py") for p in kmod)
    assert guest_suite("e2e_guest_") == ["tests/guest/e2e_guest_nri.py"]


def test_a_guest_oops_fails_the_suite_with_the_console_tail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def crashed(*args: object, **kwargs: object) -> GuestResult:
        raise GuestCrashed("guest kernel panicked: ... (first oops: BUG: ...)", OOPS_CONSOLE)

    monkeypatch.setattr(pytest_support, "pytest_in_guest", crashed)
    with pytest.raises(pytest.fail.Exception) as e:
        run_guest_suite(["x.py"], junit=tmp_path / "j.xml", plugins=[], min_tests=1)
    assert "first oops: BUG" in str(e.value)
    assert "RIP: 0010:gs_exec" in str(e.value)  # the console's tail comes with it


def test_a_kernel_warning_fails_the_suite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    console = f"{vm.MARK}kernel warning (taint 512), kernel log follows\n{vm.MARK}exit status 0\n"

    def warned(*args: object, **kwargs: object) -> GuestResult:
        return GuestResult(0, console, 1.0, 2.0, tmp_path / "log")

    monkeypatch.setattr(pytest_support, "pytest_in_guest", warned)
    with pytest.raises(AssertionError, match="the guest kernel warned"):
        run_guest_suite(["x.py"], junit=tmp_path / "j.xml", plugins=[], min_tests=1)
