"""OCI state and bundles: parsing what runtimes and images hand us, and
putting the daemon's plan into config.json."""

from __future__ import annotations

import copy
import json
import os
import stat

import pytest

from nri_gpushare.local.oci import (
    MAX_CONFIG,
    BundleInfo,
    OciError,
    PlanError,
    apply_plan,
    bundle_info,
    dump_config,
    gpu_minors,
    load_config,
    namespace_from_root,
    namespace_of,
    parse_env,
    parse_state,
    read_config,
    read_pid_file,
    write_config,
)
from tests.unit.fake_local_daemon import PLAN


def nvidia(path: str, minor: int, major: int = 195, kind: str = "c") -> dict:
    return {"path": path, "type": kind, "major": major, "minor": minor, "fileMode": 438}


CONFIG = {
    "ociVersion": "1.1.0",
    "process": {
        "args": ["sh"],
        "env": [
            "PATH=/usr/bin:/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "EMPTY=",
            "EQ=a=b",
            "NOEQUALS",
            "PATH=/override",
        ],
        "cwd": "/",
    },
    "root": {"path": "rootfs"},
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/etc/ld.so.preload/", "type": "bind", "source": "/x", "options": []},
    ],
    "annotations": {"gpushare.io/gpu-memory": "2Gi", "gpushare.io/stale": "x"},
    "linux": {
        "cgroupsPath": "/default/c1",
        "devices": [
            nvidia("/dev/nvidiactl", 255),
            nvidia("/dev/nvidia-modeset", 254),
            nvidia("/dev/nvidia-uvm", 0, major=508),
            nvidia("/dev/nvidia3", 3),
            nvidia("/dev/nvidia0", 0),
            nvidia("/dev/nvidia3", 3),
            nvidia("/dev/nvidia1", 1, kind="b"),
            nvidia("/dev/nvidia-caps/nvidia-cap1", 1, major=237),
            nvidia("/dev/nvidia7", 7, major=0),
            {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
        ],
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
    },
}


# -- OCI state -------------------------------------------------------------------


def test_parse_state():
    data = json.dumps(
        {
            "ociVersion": "1.0.2",
            "id": "c1",
            "status": "creating",
            "pid": 4242,
            "bundle": "/run/b",
            "annotations": {"a": "b"},
        }
    ).encode()
    s = parse_state(data)
    assert (s.oci_version, s.id, s.status, s.pid, s.bundle) == (
        "1.0.2",
        "c1",
        "creating",
        4242,
        "/run/b",
    )
    assert s.annotations == {"a": "b"}


def test_parse_state_optional_fields():
    s = parse_state(b'{"id":"c1","bundle":"/b"}')
    assert (s.pid, s.status, s.oci_version, s.annotations) == (0, "", "", {})


@pytest.mark.parametrize(
    "data, says",
    [
        (b"", "not JSON"),
        (b"\xff", "not JSON"),
        (b"[]", "not a JSON object but an array"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"bundle":"/b"}', "id: missing"),
        (b'{"id":7,"bundle":"/b"}', "id: a number, expected a string"),
        (b'{"id":"c1"}', "bundle"),
        (b'{"id":"c1","bundle":"relative"}', "not an absolute path"),
        (b'{"id":"c1","bundle":"/a\\u0000b"}', "not an absolute path"),
        (b'{"id":"c1","bundle":"/b","pid":"1"}', "pid: a string, expected an integer"),
        (b'{"id":"c1","bundle":"/b","pid":true}', "pid: a boolean"),
        (b'{"id":"c1","bundle":"/b","pid":-1}', "not a process ID"),
        (b'{"id":"c1","bundle":"/b","pid":NaN}', "not JSON"),
        (b'{"id":"c1","bundle":"/b","annotations":[]}', "annotations: an array"),
        (b'{"id":"c1","bundle":"/b","annotations":{"a":1}}', "'a' is a number"),
        (b" " * (5 << 20), "more than"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_parse_state_refuses(data, says):
    with pytest.raises(OciError, match=says):
        parse_state(data)


# -- config.json -------------------------------------------------------------------


def test_bundle_info():
    info = bundle_info(CONFIG)
    assert info == BundleInfo(
        env={
            "PATH": "/override",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "EMPTY": "",
            "EQ": "a=b",
        },
        annotations={"gpushare.io/gpu-memory": "2Gi", "gpushare.io/stale": "x"},
        cgroups_path="/default/c1",
        gpu_minors=(3, 0),
    )


def test_bundle_info_of_an_empty_config():
    assert bundle_info({}) == BundleInfo({}, {}, "", ())
    assert bundle_info({"process": None, "linux": None, "annotations": None}) == BundleInfo(
        {}, {}, "", ()
    )


@pytest.mark.parametrize(
    "config, says",
    [
        ({"process": []}, "process: an array, expected an object"),
        ({"process": {"env": "A=B"}}, "process.env: a string, expected an array"),
        ({"process": {"env": {"A": "B"}}}, "process.env: an object, expected an array"),
        ({"process": {"env": ["A=B", 5]}}, r"process.env\[1\]: a number"),
        ({"process": {"env": [None]}}, r"process.env\[0\]: null"),
        ({"annotations": ["a"]}, "annotations: an array"),
        ({"annotations": {"a": {"b": 1}}}, "'a' is an object"),
        ({"linux": "x"}, "linux: a string"),
        ({"linux": {"cgroupsPath": 5}}, "linux.cgroupsPath: a number"),
        ({"linux": {"devices": {}}}, "linux.devices: an object"),
        ({"linux": {"devices": ["/dev/nvidia0"]}}, r"linux.devices\[0\]: a string"),
        (
            {"linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195}]}},
            "minor None is not a device minor",
        ),
        (
            {"linux": {"devices": [nvidia("/dev/nvidia0", True)]}},  # type: ignore[arg-type]
            "minor True",
        ),
    ],
    ids=lambda v: repr(v)[:50],
)
def test_bundle_info_refuses_wrong_types(config, says):
    with pytest.raises(OciError, match=says):
        bundle_info(config)


def test_gpu_minors_needs_char_major_195_and_a_numeric_path():
    devices = [
        nvidia("/dev/nvidia12", 12),
        nvidia("/dev/nvidia", 0),
        nvidia("/dev/nvidia1a", 1),
        nvidia("/dev/nvidia\u0661", 1),
        nvidia("dev/nvidia2", 2),
        nvidia("/dev/nvidia2/", 2),
        {"path": "/dev/nvidia4", "type": "c", "major": "195", "minor": 4},
        {"path": 5, "type": "c", "major": 195, "minor": 5},
        nvidia("/dev/nvidia6", 6, kind="u"),
    ]
    assert gpu_minors(devices) == (12,)


def test_huge_env_is_read_whole():
    env = [f"V{i}={'x' * 100}" for i in range(20_000)]
    assert len(parse_env(env)) == 20_000


def test_load_config_refuses():
    with pytest.raises(OciError, match="not JSON"):
        load_config(b"{not json")
    with pytest.raises(OciError, match="not a JSON object but a string"):
        load_config(b'"config"')
    with pytest.raises(OciError, match="not JSON"):
        load_config(b'{"x": Infinity}')
    with pytest.raises(OciError, match="nested too deeply"):
        load_config(b'{"a":' * 100_000)


def test_read_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert read_config(str(tmp_path)) == CONFIG


def test_read_config_refuses(tmp_path):
    with pytest.raises(OciError, match="config.json: cannot open: No such file"):
        read_config(str(tmp_path))
    os.mkfifo(tmp_path / "config.json")  # would block a plain open()
    with pytest.raises(OciError, match="not a regular file"):
        read_config(str(tmp_path))
    os.unlink(tmp_path / "config.json")
    os.mkdir(tmp_path / "config.json")
    with pytest.raises(OciError, match="not a regular file"):
        read_config(str(tmp_path))
    os.rmdir(tmp_path / "config.json")
    with open(tmp_path / "config.json", "wb") as f:
        f.truncate(MAX_CONFIG + 1)
    with pytest.raises(OciError, match="more than"):
        read_config(str(tmp_path))


def test_read_config_follows_a_symlink_as_runc_does(tmp_path):
    (tmp_path / "elsewhere.json").write_text('{"process": {"env": ["A=1"]}}')
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").symlink_to(tmp_path / "elsewhere.json")
    assert bundle_info(read_config(str(bundle))).env == {"A": "1"}


# -- namespaces --------------------------------------------------------------------


@pytest.mark.parametrize(
    "bundle, cid, root, ns",
    [
        ("/run/containerd/io.containerd.runtime.v2.task/default/c1", "c1", "", "default"),
        ("/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1/", "c1", "", "k8s.io"),
        ("/run/containerd/io.containerd.runtime.v2.task/moby/abc", "abc", "/x/other", "moby"),
        ("/run/containerd/io.containerd.runtime.v2.task/default/c2", "c1", "", ""),
        ("/run/containerd/io.containerd.runtime.v2.task/default/c2", "c1", "/r/ns", ""),
        ("/run/containerd/io.containerd.runtime.v2.task/bad..ns/c1", "c1", "", ""),
        ("/run/containerd/io.containerd.runtime.v2.task/c1", "c1", "", ""),
        ("/var/lib/containers/storage/overlay-containers/c1/userdata", "c1", "", ""),
        ("", "c1", "/run/containerd/runc/default", ""),  # only the bundle says
        ("", "c1", "/run/runc", ""),  # CRI-O's / runc's own root is no namespace
        ("/bundle", "c1", "relative/ns", ""),
    ],
)
def test_namespace_of(bundle, cid, root, ns):
    assert namespace_of(bundle, cid, root) == ns


@pytest.mark.parametrize(
    ("root", "ns"),
    [
        ("/run/containerd/runc/default", "default"),
        ("/var/run/docker/runtime-runc/moby", "moby"),
        ("/run/containerd/runc/k8s.io/", "k8s.io"),
        ("/run/containerd/runc/-bad", ""),
        ("/", ""),
        ("", ""),
    ],
)
def test_namespace_from_root(root, ns):
    assert namespace_from_root(root) == ns


# -- plans ---------------------------------------------------------------------------


def test_apply_plan():
    before = copy.deepcopy(CONFIG)
    out = apply_plan(CONFIG, PLAN)
    assert CONFIG == before  # not changed in place

    devices = out["linux"]["devices"]
    paths = [d["path"] for d in devices]
    assert paths.count("/dev/nvidiactl") == 1 and paths[-2:] == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert devices[-1] == {
        "path": "/dev/nvidia1",
        "type": "c",
        "major": 195,
        "minor": 1,
        "fileMode": 0o666,
        "uid": 0,
        "gid": 0,
    }
    assert "/dev/fuse" in paths and "/dev/nvidia0" in paths  # others kept
    rules = out["linux"]["resources"]["devices"]
    assert rules == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"},
    ]

    env = out["process"]["env"]
    assert env == [
        "PATH=/usr/bin:/bin",
        "EMPTY=",
        "EQ=a=b",
        "NOEQUALS",
        "PATH=/override",
        "NVIDIA_VISIBLE_DEVICES=GPU-b",
        "GPUSHARE_MEMORY_LIMIT=2147483648",
    ]
    assert out["process"]["args"] == ["sh"]

    assert out["mounts"] == [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/etc/ld.so.preload",
            "type": "bind",
            "source": "/var/lib/nri-gpushare/ld.so.preload",
            "options": ["rbind", "ro"],
        },
    ]
    assert out["annotations"] == {
        "gpushare.io/gpu-memory": "2Gi",
        "gpushare.io/assigned": "gpu1:2Gi",
    }
    assert bundle_info(out).gpu_minors == (3, 0, 1)


def test_apply_plan_twice_is_the_same():
    once = apply_plan(CONFIG, PLAN)
    assert apply_plan(once, PLAN) == once


def test_apply_plan_to_a_bare_config():
    out = apply_plan({"ociVersion": "1.0.2"}, PLAN)
    assert out["linux"]["resources"]["devices"][0]["allow"] is True
    assert out["process"]["env"][0] == "NVIDIA_VISIBLE_DEVICES=GPU-b"
    assert len(out["mounts"]) == 1 and out["annotations"] == {"gpushare.io/assigned": "gpu1:2Gi"}


def test_apply_an_empty_plan_changes_nothing():
    assert apply_plan(CONFIG, {}) == CONFIG
    assert apply_plan({"process": "odd"}, {"devices": []}) == {"process": "odd"}


@pytest.mark.parametrize(
    "plan, says",
    [
        ([], "plan: an array"),
        ({"devices": {}}, "plan devices: an object"),
        ({"devices": ["/dev/nvidia0"]}, r"plan devices\[0\]: a string"),
        ({"devices": [{"path": "dev/x", "major": 1, "minor": 1}]}, "not an absolute path"),
        ({"devices": [{"path": "/d", "major": -1, "minor": 1}]}, "major"),
        ({"devices": [{"path": "/d", "major": 1, "minor": 1 << 32}]}, "minor"),
        ({"devices": [{"path": "/d", "major": 1, "minor": 1, "mode": "666"}]}, "mode"),
        ({"devices": [{"path": "/d", "type": "p", "major": 1, "minor": 1}]}, "type"),
        ({"env": ["A=B"]}, "plan env"),
        ({"env": {"A": 1}}, "plan env"),
        ({"env": {"A=B": "C"}}, "not a variable"),
        ({"env": {"": "C"}}, "not a variable"),
        ({"mounts": [{"destination": "rel"}]}, "destination"),
        ({"mounts": [{"destination": "/a", "options": "ro"}]}, "options"),
        ({"mounts": [{"destination": "/a", "source": 5}]}, "source"),
        ({"annotations": {"a": None}}, "plan annotations"),
        ({"remove_annotations": "a"}, "remove_annotations"),
        ({"remove_annotations": [1]}, "remove_annotations"),
    ],
    ids=lambda v: repr(v)[:50],
)
def test_apply_plan_refuses_a_bad_plan(plan, says):
    with pytest.raises(PlanError, match=says):
        apply_plan(CONFIG, plan)


@pytest.mark.parametrize(
    "config, says",
    [
        ({"linux": []}, "linux: an array"),
        ({"linux": {"devices": "x"}}, "linux.devices: a string"),
        ({"linux": {"resources": 5}}, "linux.resources: a number"),
        ({"linux": {"resources": {"devices": {}}}}, "linux.resources.devices: an object"),
        ({"process": "sh"}, "process: a string"),
        ({"process": {"env": "A=1"}}, "process.env: a string"),
        ({"process": {"env": [1]}}, r"process.env\[0\]"),
        ({"mounts": {}}, "mounts: an object"),
        ({"mounts": [{"source": "/x"}]}, "mounts.0.: not an object with a destination"),
        ({"annotations": ["a"]}, "annotations: an array"),
    ],
    ids=lambda v: repr(v)[:50],
)
def test_apply_plan_refuses_a_bad_config(config, says):
    with pytest.raises(OciError, match=says):
        apply_plan(config, PLAN)


# -- writing ---------------------------------------------------------------------------


def test_write_config_keeps_the_mode_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    path.chmod(0o640)
    write_config(str(tmp_path), CONFIG)
    assert json.loads(path.read_bytes()) == CONFIG
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["config.json"]


def test_write_config_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"keep": "me"}')
    outside.chmod(0o600)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").symlink_to(outside)
    write_config(str(bundle), {"new": 1})
    assert outside.read_text() == '{"keep": "me"}'
    assert not (bundle / "config.json").is_symlink()
    assert json.loads((bundle / "config.json").read_text()) == {"new": 1}
    assert stat.S_IMODE((bundle / "config.json").stat().st_mode) == 0o600


def test_write_config_failure_leaves_the_old_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"old": 1}')
    with pytest.raises(OciError, match="cannot be written back"):
        write_config(str(tmp_path), {"bad": float("nan")})
    with pytest.raises(OciError, match="cannot be written back"):
        write_config(str(tmp_path), {"bad": object()})
    assert path.read_text() == '{"old": 1}'
    assert sorted(os.listdir(tmp_path)) == ["config.json"]


def test_dump_config_is_ascii_and_keeps_big_integers():
    data = dump_config({"a": "\u00e9\ud800", "n": 18446744073709551615, "f": 0.5})
    assert data.isascii()
    assert json.loads(data) == {"a": "\u00e9\ud800", "n": 18446744073709551615, "f": 0.5}


def test_read_pid_file(tmp_path):
    path = tmp_path / "pid"
    path.write_text("4242")
    assert read_pid_file(str(path)) == 4242
    path.write_text("4242\n")
    assert read_pid_file(str(path)) == 4242
    for bad in ("", "x", "0", "-5", "99999999999"):
        path.write_text(bad)
        with pytest.raises(OciError):
            read_pid_file(str(path))
    with pytest.raises(OciError, match="cannot open"):
        read_pid_file(str(tmp_path / "missing"))
