"""gpushare-smi where the kernel module cannot say (standalone): the memory
and GPU time NVML reports per process, put with each container by its
cgroup (nri_gpushare/host/nvml_usage.py), fill the unknown cells, marked
`*`; the module's own figures are never replaced; no NVML changes nothing."""

from pathlib import Path
from types import SimpleNamespace

from nri_gpushare.cli import smi_table, smi_view
from nri_gpushare.host.nvml_usage import NvmlUse, nvml_use, utilisation
from tests.unit.test_metrics import status

GiB = 1 << 30
A = "a" * 64
B = "b" * 64


def test_utilisation_is_each_pids_part_of_the_samples_span():
    # periods of 100 ms ending at 1.1, 1.2, 1.3 s: pid 1 used 30 % of each,
    # pid 2 60 % of two of them
    samples = [(1, 1_100_000, 30), (1, 1_200_000, 30), (1, 1_300_000, 30)]
    samples += [(2, 1_200_000, 60), (2, 1_300_000, 60)]
    used, span = utilisation(samples)
    assert span == 0.3 and used == {1: 30.0, 2: 40.0}
    assert utilisation([(1, 5, 50)]) == ({}, 0.0)  # one period: no span to speak of


class FakeNvml:
    """pynvml's calls the reader makes, on fixed figures."""

    NVML_ERROR_NOT_FOUND = 6

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    def __init__(self, procs, samples, fail_init=False):
        self.procs, self.samples, self.fail_init, self.shut = procs, samples, fail_init, False

    def nvmlInit(self):
        if self.fail_init:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.procs]

    def nvmlDeviceGetProcessUtilization(self, handle, since):
        if not self.samples:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=p, timeStamp=t, smUtil=u) for p, t, u in self.samples]


def fake_proc(tmp_path: Path, cgroups: dict[int, str]) -> Path:
    for pid, path in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::{path}\n")
    return tmp_path


def test_processes_go_to_their_container_by_cgroup(tmp_path):
    proc = fake_proc(tmp_path, {10: f"/k8s.io/{A}", 11: f"/k8s.io/{A}", 12: f"/k8s.io/{B}"})
    samples = [(10, t, 20) for t in (100_000, 200_000)] + [(12, 200_000, 50)]
    nvml = FakeNvml([(10, GiB), (11, GiB // 2), (12, 0), (99, GiB)], samples)
    got = nvml_use([(0, "GPU-0", A), (0, "GPU-0", B)], nvml, proc)
    assert got[0, A] == NvmlUse(GiB + GiB // 2, (10, 11), 20.0, 0.2)
    assert got[0, B] == NvmlUse(0, (12,), 25.0, 0.2)
    assert nvml.shut


def test_an_idle_gpu_is_zero_and_no_nvml_is_nothing(tmp_path):
    proc = fake_proc(tmp_path, {10: f"/k8s.io/{A}"})
    got = nvml_use([(0, "GPU-0", A)], FakeNvml([(10, 5)], []), proc)
    assert got[0, A] == NvmlUse(5, (10,), 0.0, None)
    assert nvml_use([(0, "GPU-0", A)], FakeNvml([], [], fail_init=True), proc) == {}
    assert nvml_use([], FakeNvml([], [])) == {}


def test_smi_fills_only_what_the_module_leaves_unknown_and_marks_it():
    doc = status()
    runc = doc["allocations"][2]  # kmod: off: nothing known
    share = runc["gpus"][0]
    known = doc["allocations"][0]  # the module's figures
    nvml = {
        (share["index"], runc["container_id"]): NvmlUse(GiB, (7,), 42.5, 1.5),
        (0, known["container_id"]): NvmlUse(1, (1,), 1.0, 1.5),
    }
    assert (share["index"], share["uuid"], runc["container_id"]) in smi_view.unknown_shares(doc)
    view = smi_view.view(doc, now=0, nvml=nvml)
    a, _, c = view["containers"]
    [s] = c["gpus"]
    assert (s["memory_used"], s["pids"], s["core_used"]) == (GiB, [7], 42.5)
    assert (s["memory_used_source"], s["core_used_source"]) == ("nvml", "nvml")
    assert (s["memory_used_why"], s["core_used_why"]) == (None, None)
    [k] = a["gpus"]
    assert (k["memory_used"], k["pids"], k["memory_used_source"]) == (3 * GiB, [10, 11], "kmod")
    text = smi_table.render(view, local_time="then")
    row = next(line for line in text.splitlines() if "(runc:default)" in line)
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert (cells[4], cells[6], cells[8]) == ("1Gi*", "42.5%*", "7")
    assert "*: from NVML" in text
    plain = smi_table.render(smi_view.view(doc, now=0), local_time="then")
    assert "*" not in plain
