"""Inventory from NVML (a fake pynvml module) or the static config; host device lookup."""

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from nri_gpushare.host.devices import HostDevices, load_inventory
from nri_gpushare.share.model import DeviceNode, Gpu
from tests.fakes import GiB, make_gpus


class FakeNvml:
    """The few pynvml calls the inventory makes."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices, fail_init=False, as_bytes=False):
        self.devices = devices
        self.fail_init = fail_init
        self.as_bytes = as_bytes
        self.initialised = False
        self.shutdowns = 0

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.initialised = True

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        assert self.initialised
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def _text(self, s):
        return s.encode() if self.as_bytes else s

    def nvmlDeviceGetUUID(self, handle):
        return self._text(handle["uuid"])

    def nvmlDeviceGetName(self, handle):
        return self._text(handle["name"])

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=handle["total"], free=handle["total"], used=0)

    def nvmlDeviceGetMinorNumber(self, handle):
        return handle["minor"]


H100 = [
    {"uuid": "GPU-aaaa", "name": "NVIDIA H100 80GB HBM3", "total": 81559 << 20, "minor": 2},
    {"uuid": "GPU-bbbb", "name": "NVIDIA H100 80GB HBM3", "total": 81559 << 20, "minor": 0},
]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nvml_inventory(as_bytes):
    nvml = FakeNvml(H100, as_bytes=as_bytes)
    gpus = load_inventory(make_gpus(1), nvml_module=nvml)
    assert gpus == [
        Gpu(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559 << 20, 2),
        Gpu(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559 << 20, 0),
    ]
    assert nvml.shutdowns == 1


def test_nvml_missing_falls_back_to_static(caplog):
    caplog.set_level("INFO")
    static = make_gpus(2)
    assert load_inventory(static, nvml_module=FakeNvml(H100, fail_init=True)) == static
    assert "using the static inventory" in caplog.text


def test_nvml_without_gpus_falls_back_to_static():
    static = make_gpus(1)
    assert load_inventory(static, nvml_module=FakeNvml([])) == static


def test_error_while_asking_falls_back_and_shuts_down():
    nvml = FakeNvml([{"uuid": "GPU-x", "name": "x", "minor": 0}])  # no "total"
    assert load_inventory(make_gpus(1), nvml_module=nvml) == make_gpus(1)
    assert nvml.shutdowns == 1


def test_real_pynvml_without_driver_falls_back():
    # this machine has nvidia-ml-py but no NVIDIA driver
    static = make_gpus(3)
    assert load_inventory(static) == static


def test_static_inventory_sorted_and_checked():
    a, b = make_gpus(2)
    assert load_inventory([b, a], nvml_module=FakeNvml([], fail_init=True)) == [a, b]
    for bad in ([a, a], [a, Gpu(1, a.uuid, "x", GiB, 1)], [Gpu(0, "GPU-z", "x", 0, 0)]):
        with pytest.raises(ValueError):
            load_inventory(bad, nvml_module=FakeNvml([], fail_init=True))


# -- host device lookup -------------------------------------------------------------------


def fake_stat(nodes):
    """A stat() over {path: (kind, major, minor)}; kind 'c' char device, 'f' file."""

    def stat_(path):
        if path not in nodes:
            raise FileNotFoundError(path)
        kind, major, minor = nodes[path]
        mode = (stat.S_IFCHR if kind == "c" else stat.S_IFREG) | 0o666
        return SimpleNamespace(st_mode=mode, st_rdev=os.makedev(major, minor))

    return stat_


def test_host_devices_present():
    devices = HostDevices(
        stat=fake_stat(
            {
                "/dev/nvidiactl": ("c", 195, 255),
                "/dev/nvidia-uvm": ("c", 508, 0),
                "/dev/nvidia-uvm-tools": ("c", 508, 1),
                "/dev/nvidia3": ("c", 195, 3),
                "/dev/gpushare": ("c", 10, 122),
            }
        )
    )
    assert devices.common() == (
        DeviceNode("/dev/nvidiactl", "c", 195, 255),
        DeviceNode("/dev/nvidia-uvm", "c", 508, 0),
        DeviceNode("/dev/nvidia-uvm-tools", "c", 508, 1),
    )
    assert devices.gpu(3) == DeviceNode("/dev/nvidia3", "c", 195, 3)
    assert devices.control() == DeviceNode("/dev/gpushare", "c", 10, 122)


def test_host_devices_fallbacks_without_driver():
    devices = HostDevices(
        dev_dir="/host/dev",
        nvidia_major=200,
        nvidiactl_minor=250,
        stat=fake_stat({"/host/dev/nvidia0": ("f", 0, 0)}),
    )
    assert devices.common() == (DeviceNode("/dev/nvidiactl", "c", 200, 250),)
    assert devices.gpu(0) == DeviceNode("/dev/nvidia0", "c", 200, 0)  # a file is not a device
    assert devices.control() is None


def test_host_devices_real_dev_null():
    devices = HostDevices(control_name="null")
    assert devices.control() == DeviceNode("/dev/null", "c", 1, 3)


def _fake_proc(tmp_path, pid: int, cgroup: str):
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cgroup").write_text(cgroup)
    return tmp_path


def test_kill_container_kills_only_a_process_of_that_container(tmp_path):
    import subprocess

    from nri_gpushare.host.devices import kill_container

    proc = subprocess.Popen(["sleep", "60"])
    try:
        fake = _fake_proc(tmp_path, proc.pid, "0::/k8s.io/other\n")
        assert kill_container("abc123", proc.pid, fake).startswith("not killed")
        assert proc.poll() is None
        (fake / str(proc.pid) / "cgroup").write_text("0::/k8s.io/abc123\n")
        assert kill_container("abc123", proc.pid, fake) == f"killed (process {proc.pid})"
        assert proc.wait(10) == -9
        assert kill_container("abc123", proc.pid, fake) == "already gone"
    finally:
        proc.kill()
        proc.wait()
    assert kill_container("abc123", 0) == "not running: nothing to kill"


def test_kill_container_refuses_an_empty_id_and_an_unreadable_process(tmp_path):
    """An empty ID would match every cgroup; a process whose cgroup cannot be
    read (say /proc mounted hidepid) is not gone, so the kill is retried."""
    import subprocess

    from nri_gpushare.host.devices import kill_container

    proc = subprocess.Popen(["sleep", "60"])
    try:
        fake = _fake_proc(tmp_path, proc.pid, "0::/k8s.io/abc123\n")
        assert kill_container("", proc.pid, fake).startswith("not killed")
        (fake / str(proc.pid) / "cgroup").unlink()
        (fake / str(proc.pid) / "cgroup").mkdir()  # reading it fails, not with ENOENT
        assert kill_container("abc123", proc.pid, fake).startswith("not killed")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_cgroup_of_reads_the_unified_line_and_checks_it_names_the_container(tmp_path):
    from nri_gpushare.host.devices import cgroup_of

    def proc(text: str | None) -> Path:
        (tmp_path / "7").mkdir(exist_ok=True)
        if text is not None:
            (tmp_path / "7" / "cgroup").write_text(text)
        return tmp_path

    lines = "12:pids:/x\n0::/default/ctr-1\n"
    assert cgroup_of("ctr-1", 7, proc(lines)) == "/default/ctr-1"
    systemd = "0::/system.slice/cri-containerd-abc.scope\n"
    assert cgroup_of("abc", 7, proc(systemd)) == "/system.slice/cri-containerd-abc.scope"
    assert cgroup_of("ctr-1", 7, proc("0::/x.slice/ctr-1.scope\n")) == "/x.slice/ctr-1.scope"
    for text, why in [
        ("0::/default/other\n", "not the container's"),
        ("0::/default/ctr-1/sub\n", "not the container's"),  # moved below its cgroup
        ("0::/default/ctr-1/ctr-1\n", "not the container's"),  # ... into a child named alike
        ("0::/system.slice/docker-ctr-1.scope/ctr-1\n", "not the container's"),
        ("0::/default/xctr-1x\n", "not the container's"),  # another ID containing it
        ("0::/default/ctr-10\n", "not the container's"),
        ("0::/\n", "not the container's"),
        ("0::/default/ctr-1\n0::/x\n", "no single"),
        ("1:cpu:/default/ctr-1\n", "no single"),
        ("0::relative/ctr-1\n", "no single"),
        ("0::/default/ctr-1\x01\n", "not the container's"),
    ]:
        with pytest.raises(ValueError, match=why):
            cgroup_of("ctr-1", 7, proc(text))
    (tmp_path / "7" / "cgroup").unlink()
    with pytest.raises(ValueError, match="cannot be read"):
        cgroup_of("ctr-1", 7, tmp_path)
    with pytest.raises(ValueError, match="no process"):
        cgroup_of("ctr-1", 0, tmp_path)
