"""The CDI spec (nri_gpushare.ops.cdi): its exact shape, the hooks, the interposer,
the device nodes, and `nri-gpushare cdi generate` (files, formats, errors)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import yaml

from nri_gpushare.local.client import DEFAULT_SOCKET
from nri_gpushare.ops import cdi, cdi_spec
from nri_gpushare.share.model import Allocation, Gpu, GpuShare, InterposerPolicy
from nri_gpushare.share.plan import injection_plan
from tests.fakes import FakeDevices

GiB = 1 << 30
UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
# index and minor differ on purpose: a spec that mixed them up would show it.
GPU_A = Gpu(0, UUID_A, "NVIDIA H100", 80 * GiB, 1)
GPU_B = Gpu(1, UUID_B, "NVIDIA H100", 80 * GiB, 0)
HOOK = "/usr/bin/nri-gpushare"
LIB = "/usr/lib/nri-gpushare/libgpushare.so"
IN_CONTAINER = "/usr/lib/gpushare/libgpushare.so"
PRELOAD_FILE = "/var/lib/nri-gpushare/ld.so.preload"
RO = ["rbind", "ro", "nosuid", "nodev"]
INTERPOSER = InterposerPolicy(library=LIB, container_path=IN_CONTAINER, preload_file=PRELOAD_FILE)


def node(path, major, minor):
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666}


def gpu_edits(*pairs):
    uuids = ",".join(uuid for uuid, _ in pairs)
    return {
        "env": [f"NVIDIA_VISIBLE_DEVICES={uuids}", f"GPUSHARE_GPU_UUIDS={uuids}"],
        "deviceNodes": [node(f"/dev/nvidia{minor}", 195, minor) for _, minor in pairs],
    }


def hooks(*extra):
    return [
        {
            "hookName": "createRuntime",
            "path": HOOK,
            "args": ["nri-gpushare", "hook", "create-runtime", *extra],
            "timeout": 15,
        },
        {
            "hookName": "poststop",
            "path": HOOK,
            "args": ["nri-gpushare", "hook", "poststop", *extra],
            "timeout": 15,
        },
    ]


def spec_of(gpus=(GPU_B, GPU_A), devices=None, interposer=INTERPOSER, **kw):
    return cdi_spec.build_spec(
        list(gpus), devices or FakeDevices(uvm=True, control=True), interposer, HOOK, **kw
    )


# -- the spec --------------------------------------------------------------------------


def test_two_gpu_spec_whole():
    assert spec_of() == {
        "cdiVersion": "0.5.0",
        "kind": "gpushare.io/gpu",
        "devices": [
            {"name": "0", "containerEdits": gpu_edits((UUID_A, 1))},
            {"name": "1", "containerEdits": gpu_edits((UUID_B, 0))},
            {"name": UUID_A, "containerEdits": gpu_edits((UUID_A, 1))},
            {"name": UUID_B, "containerEdits": gpu_edits((UUID_B, 0))},
            {"name": "all", "containerEdits": gpu_edits((UUID_A, 1), (UUID_B, 0))},
        ],
        "containerEdits": {
            "deviceNodes": [
                node("/dev/nvidiactl", 195, 255),
                node("/dev/nvidia-uvm", 510, 0),
                node("/dev/nvidia-uvm-tools", 510, 1),
                node("/dev/gpushare", 240, 0),
            ],
            "mounts": [
                {"hostPath": LIB, "containerPath": IN_CONTAINER, "type": "bind", "options": RO},
                {
                    "hostPath": PRELOAD_FILE,
                    "containerPath": "/etc/ld.so.preload",
                    "type": "bind",
                    "options": RO,
                },
            ],
            "hooks": hooks(),
        },
    }


def test_device_names_are_valid_cdi_names():
    names = cdi_spec.device_names(spec_of())
    assert names == ["0", "1", UUID_A, UUID_B, "all"]
    assert all(cdi_spec.valid_device_name(n) for n in names)
    for bad in ("", "-0", "0-", "GPU-a/b", "a b", "_x", "x."):
        assert not cdi_spec.valid_device_name(bad), bad
    for good in ("0", "15", "a", "GPU-a_b.c:d", "MIG-1"):
        assert cdi_spec.valid_device_name(good), good


def test_a_uuid_that_is_no_cdi_name_is_refused():
    odd = Gpu(0, "GPU-abc-", "x", GiB, 0)
    with pytest.raises(cdi.CdiError, match=r"GPU 0: UUID 'GPU-abc-' is not a valid CDI"):
        spec_of([odd])


def test_each_gpu_device_has_only_its_own_node_and_uuid():
    gpus = [
        Gpu(i, f"GPU-{i}0000000-0000-0000-0000-000000000000", "x", GiB, 7 - i) for i in (2, 0, 1)
    ]
    spec = spec_of(gpus)
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    for g in gpus:
        for name in (str(g.index), g.uuid):
            edits = by_name[name]
            assert edits["deviceNodes"] == [node(f"/dev/nvidia{g.minor}", 195, g.minor)]
            assert edits["env"] == [
                f"NVIDIA_VISIBLE_DEVICES={g.uuid}",
                f"GPUSHARE_GPU_UUIDS={g.uuid}",
            ]
    ordered = sorted(gpus, key=lambda g: g.index)
    uuids = ",".join(g.uuid for g in ordered)
    assert by_name["all"]["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={uuids}",
        f"GPUSHARE_GPU_UUIDS={uuids}",
    ]
    assert [n["minor"] for n in by_name["all"]["deviceNodes"]] == [7, 6, 5]
    # what every GPU container needs is spec-level only, never per device
    for edits in by_name.values():
        assert set(edits) == {"env", "deviceNodes"}


def test_hooks_are_spec_level_with_the_default_socket():
    spec = spec_of(api_socket=DEFAULT_SOCKET)
    assert spec["containerEdits"]["hooks"] == hooks()
    assert not any("hooks" in d["containerEdits"] for d in spec["devices"])


def test_hooks_carry_a_custom_socket():
    spec = spec_of(api_socket="/run/other/api.sock")
    assert spec["containerEdits"]["hooks"] == hooks("--socket", "/run/other/api.sock")


def test_hook_path_must_be_absolute():
    with pytest.raises(cdi.CdiError, match="not absolute"):
        cdi_spec.build_spec([GPU_A], FakeDevices(), None, "nri-gpushare")


def test_no_gpus_no_spec():
    with pytest.raises(cdi.CdiError, match="no GPUs"):
        spec_of([])


def test_duplicate_gpus_refused():
    with pytest.raises(cdi.CdiError, match="duplicate index"):
        spec_of([GPU_A, Gpu(0, UUID_B, "x", GiB, 5)])


def test_without_interposer_no_mounts_and_no_env():
    common = spec_of(interposer=None)["containerEdits"]
    assert set(common) == {"deviceNodes", "hooks"}


def test_interposer_env_mode_and_managed_memory():
    policy = InterposerPolicy(
        library=LIB, container_path=IN_CONTAINER, preload="env", allow_managed=True
    )
    common = spec_of(interposer=policy)["containerEdits"]
    assert common["env"] == [f"LD_PRELOAD={IN_CONTAINER}", "GPUSHARE_ALLOW_MANAGED=1"]
    assert common["mounts"] == [
        {"hostPath": LIB, "containerPath": IN_CONTAINER, "type": "bind", "options": RO}
    ]


def test_ld_so_preload_mode_needs_the_preload_file():
    with pytest.raises(ValueError, match="preload file"):
        spec_of(interposer=InterposerPolicy())


def test_interposer_mounts_are_the_nri_paths():
    """The CDI path and the NRI path inject the same interposer."""
    alloc = Allocation("c1", "c", "", (GpuShare(0, UUID_A, GiB, 0),), interposer=True)
    plan = injection_plan(alloc, {0: GPU_A}, FakeDevices(), True, INTERPOSER, {})
    common = spec_of()["containerEdits"]
    assert common["mounts"] == [
        {
            "hostPath": m.source,
            "containerPath": m.destination,
            "type": m.type,
            "options": list(m.options),
        }
        for m in plan.mounts
    ]


def test_control_device_and_uvm_only_when_present():
    bare = spec_of(devices=FakeDevices(uvm=False, control=False))["containerEdits"]
    assert bare["deviceNodes"] == [node("/dev/nvidiactl", 195, 255)]
    with_control = spec_of(devices=FakeDevices(uvm=False, control=True))["containerEdits"]
    assert with_control["deviceNodes"] == [
        node("/dev/nvidiactl", 195, 255),
        node("/dev/gpushare", 240, 0),
    ]


def test_minimum_version_rules():
    base = {"kind": "gpushare.io/gpu", "devices": [{"name": "a", "containerEdits": {}}]}
    assert cdi_spec.minimum_version(base) == "0.3.0"
    mount = {"mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]}
    assert cdi_spec.minimum_version({**base, "containerEdits": mount}) == "0.4.0"
    digit = {**base, "devices": [{"name": "0", "containerEdits": {}}]}
    assert cdi_spec.minimum_version(digit) == "0.5.0"
    host_path = {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]}
    assert cdi_spec.minimum_version({**base, "containerEdits": host_path}) == "0.5.0"
    assert cdi_spec.minimum_version({**base, "annotations": {"a": "b"}}) == "0.6.0"
    assert cdi_spec.minimum_version({**base, "kind": "gpushare.io/g.pu"}) == "0.6.0"
    # ours: device names begin with a digit (and mounts have a type)
    assert spec_of()["cdiVersion"] == cdi_spec.minimum_version(spec_of()) == "0.5.0"
    assert spec_of(interposer=None)["cdiVersion"] == "0.5.0"


def test_default_hook_path():
    assert cdi.default_hook_path(which=lambda _: "/opt/bin/nri-gpushare") == "/opt/bin/nri-gpushare"


def test_default_hook_path_falls_back_to_the_running_program(tmp_path):
    program = tmp_path / "nri-gpushare"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(program)
    assert cdi.default_hook_path(which=lambda _: None, argv0=str(link)) == str(program)
    module = tmp_path / "cli.py"  # `python -m nri_gpushare.cli`: no program to name
    module.write_text("")
    assert cdi.default_hook_path(which=lambda _: None, argv0=str(module)) is None


def test_default_hook_path_is_the_front_installed_next_to_nri_gpushare(tmp_path):
    """scripts/install-node.sh links /usr/local/bin/nri-gpushare into the venv,
    where the compiled hooks (gpushare-front) are too."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    program = bin_dir / "nri-gpushare"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    link = tmp_path / "nri-gpushare"
    link.symlink_to(program)
    front = bin_dir / "gpushare-front"
    front.write_text("")
    assert cdi.default_hook_path(which=lambda _: str(link)) == str(link)  # not executable
    front.chmod(0o755)
    assert cdi.default_hook_path(which=lambda _: str(link)) == str(front)


# -- nri-gpushare cdi generate ---------------------------------------------------------


@pytest.fixture
def node_config(tmp_path):
    """A config file with a static 2-GPU inventory and a state dir in tmp."""
    state = tmp_path / "state"
    state.mkdir()

    def write(extra="", inventory=True, library=None, nvml=False):
        lines = [f"use_nvml: {'true' if nvml else 'false'}", f"state_dir: {state}"]
        if inventory:
            lines += [
                "inventory:",
                f"  - {{index: 1, uuid: {UUID_B}, memory: 80Gi, minor: 0}}",
                f"  - {{index: 0, uuid: {UUID_A}, memory: 80Gi, minor: 1}}",
            ]
        if library is not None:
            lines += ["interposer:", f"  library: {library}"]
        path = tmp_path / "node.yaml"
        path.write_text("\n".join(lines) + "\n" + extra)
        return str(path)

    write.state = state
    return write


def generate(*args, devices=None, nvml=None):
    argv = ["generate", "--hook-path", HOOK, *args]
    return cdi.main(argv, devices=devices or FakeDevices(uvm=True, control=True), nvml=nvml)


def test_generate_writes_json_atomically_mode_0644(node_config, tmp_path, capsys):
    out = tmp_path / "cdi" / "sub" / "gpushare.io-gpu.json"
    old_umask = os.umask(0o077)
    try:
        assert generate("--config", node_config(), "--output", str(out)) == 0
        # a second run replaces the file: a new inode, the old one untouched
        (tmp_path / "old").hardlink_to(out)
        assert generate("--config", node_config(), "--output", str(out)) == 0
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert out.stat().st_ino != (tmp_path / "old").stat().st_ino
    assert (tmp_path / "old").read_text() == out.read_text()
    for directory in (tmp_path / "cdi", tmp_path / "cdi" / "sub"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert os.listdir(out.parent) == [out.name]  # no temporary file left
    spec = json.loads(out.read_text())
    assert spec == cdi_spec.build_spec(
        [GPU_A, GPU_B], FakeDevices(uvm=True, control=True), None, HOOK, DEFAULT_SOCKET
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"wrote {out}: 2 GPUs, devices 0, 1, {UUID_A}, {UUID_B}, all"


def test_a_failed_write_keeps_the_old_spec(node_config, tmp_path, monkeypatch, capsys):
    out = tmp_path / "spec.json"
    out.write_text("old\n")

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    assert generate("--config", node_config(), "--output", str(out)) == 2
    assert out.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["node.yaml", "spec.json", "state"]  # no temp file
    assert error_line(capsys.readouterr().err) == (
        f"nri-gpushare: cannot write {out}: No space left on device"
    )


@pytest.mark.parametrize(
    ("name", "args", "fmt"),
    [
        ("spec.yaml", (), "yaml"),
        ("spec.yml", (), "yaml"),
        ("spec.json", (), "json"),
        ("spec.json", ("--format", "yaml"), "yaml"),
        ("spec.yaml", ("--format", "json"), "json"),
    ],
)
def test_format_from_suffix_or_flag(node_config, tmp_path, name, args, fmt):
    out = tmp_path / name
    assert generate("--config", node_config(), "--output", str(out), *args) == 0
    text = out.read_text()
    expected = cdi_spec.build_spec(
        [GPU_A, GPU_B], FakeDevices(uvm=True, control=True), None, HOOK, DEFAULT_SOCKET
    )
    if fmt == "json":
        assert json.loads(text) == expected
    else:
        assert text.startswith("cdiVersion: 0.5.0\nkind: gpushare.io/gpu\n")
        assert yaml.safe_load(text) == expected
        assert "- name: '0'\n" in text  # a string, not the number 0


def test_stdout(node_config, tmp_path, capsys):
    assert generate("--config", node_config(), "--output", "-") == 0
    captured = capsys.readouterr()
    spec = json.loads(captured.out)  # the spec and nothing else
    assert cdi_spec.device_names(spec) == ["0", "1", UUID_A, UUID_B, "all"]
    assert "wrote" not in captured.err


def test_custom_api_socket_reaches_the_hooks(node_config, capsys):
    config = node_config("api_socket: /run/x/api.sock\n")
    assert generate("--config", config, "--output", "-") == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["containerEdits"]["hooks"] == hooks("--socket", "/run/x/api.sock")


def test_interposer_mounted_when_the_library_is_on_the_node(node_config, tmp_path, capsys):
    library = tmp_path / "libgpushare.so"
    library.write_bytes(b"\x7fELF")
    library.chmod(0o644)
    config = node_config(library=library)
    (node_config.state / "ld.so.preload").write_text(IN_CONTAINER + "\n")
    assert generate("--config", config, "--output", "-") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["containerEdits"]["mounts"] == [
        {"hostPath": str(library), "containerPath": IN_CONTAINER, "type": "bind", "options": RO},
        {
            "hostPath": f"{node_config.state}/ld.so.preload",
            "containerPath": "/etc/ld.so.preload",
            "type": "bind",
            "options": RO,
        },
    ]
    assert "interposer" not in captured.err and "ld.so.preload" not in captured.err


def test_preload_file_not_written_yet_is_a_warning(node_config, tmp_path, capsys):
    library = tmp_path / "libgpushare.so"
    library.write_bytes(b"\x7fELF")
    library.chmod(0o644)
    assert generate("--config", node_config(library=library), "--output", "-") == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["containerEdits"]["mounts"]) == 2
    assert f"warning: {node_config.state}/ld.so.preload does not exist yet" in captured.err


def test_no_interposer_mounts_without_the_library(node_config, tmp_path, capsys):
    missing = tmp_path / "nowhere" / "libgpushare.so"
    assert generate("--config", node_config(library=missing), "--output", "-") == 0
    captured = capsys.readouterr()
    common = json.loads(captured.out)["containerEdits"]
    assert "mounts" not in common and "env" not in common
    assert f"warning: interposer {missing} does not exist: the spec has no interposer" in (
        captured.err
    )


def test_missing_nodes_are_warnings(node_config, capsys):
    bare = FakeDevices(uvm=False, control=False)
    assert generate("--config", node_config(), "--output", "-", devices=bare) == 0
    err = capsys.readouterr().err
    assert "/dev/nvidia-uvm is not on this node" in err
    assert "(/dev/gpushare) is not on this node" in err
    assert generate("--config", node_config("kmod: off\n"), "--output", "-", devices=bare) == 0
    err = capsys.readouterr().err
    assert "/dev/gpushare" not in err  # no module wanted: nothing to say


class FakeNvml:
    """pynvml's calls the inventory makes, for one H100."""

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Memory", (), {"total": 80 * GiB})()

    def nvmlDeviceGetMinorNumber(self, handle):
        return handle["minor"]

    def __init__(self, devices):
        self.devices = devices


def test_nvml_inventory_beats_the_static_one(node_config, capsys):
    config = node_config(nvml=True)
    nvml = FakeNvml([{"uuid": "GPU-cccccccc-0000-0000-0000-000000000000", "minor": 3}])
    assert generate("--config", config, "--output", "-", nvml=nvml) == 0
    spec = json.loads(capsys.readouterr().out)
    assert cdi_spec.device_names(spec) == ["0", "GPU-cccccccc-0000-0000-0000-000000000000", "all"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [node("/dev/nvidia3", 195, 3)]


def error_line(err):
    """The error, said last; only warnings before it; no traceback."""
    assert "Traceback" not in err
    *before, last = err.splitlines()
    assert all(line.startswith("nri-gpushare: warning: ") for line in before), before
    return last


def only_line(err):
    lines = err.splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in err
    return lines[0]


def test_no_gpus_from_config(node_config, capsys):
    assert generate("--config", node_config(inventory=False), "--output", "-") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert only_line(captured.err) == (
        "nri-gpushare: no GPUs: use_nvml is false and the config has no `inventory:`"
    )


def test_no_gpus_from_nvml(node_config, capsys):
    config = node_config(inventory=False, nvml=True)
    assert generate("--config", config, "--output", "-", nvml=FakeNvml([])) == 2
    assert only_line(capsys.readouterr().err) == (
        "nri-gpushare: no GPUs: NVML found none and the config has no `inventory:`"
    )


def test_bad_config_path(tmp_path, capsys):
    missing = tmp_path / "absent.yaml"
    assert generate("--config", str(missing), "--output", "-") == 2
    assert only_line(capsys.readouterr().err) == (
        f"nri-gpushare: {missing}: cannot read: No such file or directory"
    )


def test_bad_config_value(node_config, capsys):
    assert generate("--config", node_config("api_socket: relative.sock\n"), "--output", "-") == 2
    assert "api_socket: 'relative.sock' must be an absolute path" in only_line(
        capsys.readouterr().err
    )


def test_unwritable_output(node_config, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "cdi" / "spec.json"  # its "directory" is a regular file (even root fails)
    assert generate("--config", node_config(), "--output", str(out)) == 2
    assert error_line(capsys.readouterr().err) == (
        f"nri-gpushare: cannot write {out}: {blocker} is not a directory"
    )


def test_relative_hook_path(node_config, capsys):
    argv = ["generate", "--config", node_config(), "--hook-path", "bin/nri-gpushare"]
    assert cdi.main(argv, devices=FakeDevices()) == 2
    assert only_line(capsys.readouterr().err) == (
        "nri-gpushare: --hook-path 'bin/nri-gpushare' must be an absolute path"
    )


def test_no_program_for_the_hooks(node_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cdi.shutil, "which", lambda _: None)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "cli.py")])
    argv = ["generate", "--config", node_config(), "--output", "-"]
    assert cdi.main(argv, devices=FakeDevices()) == 2
    assert only_line(capsys.readouterr().err) == (
        "nri-gpushare: cannot find the nri-gpushare program on PATH: pass --hook-path"
    )


def test_usage_errors_return_2(capsys):
    assert cdi.main([]) == 2
    assert cdi.main(["generate", "--format", "toml"]) == 2
    assert "invalid choice: 'toml'" in capsys.readouterr().err
    assert cdi.main(["generate", "--help"]) == 0


def test_through_the_cli_errors_are_one_line(tmp_path):
    """`nri-gpushare cdi generate` as a process: exit 2, one line, no traceback."""
    missing = tmp_path / "absent.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nri_gpushare.cli.main",
            "cdi",
            "generate",
            "--config",
            str(missing),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert only_line(result.stderr) == (
        f"nri-gpushare: {missing}: cannot read: No such file or directory"
    )
    assert result.stdout == ""
