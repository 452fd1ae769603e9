"""The Docker test bed: Debian's dockerd on the private containerd (trixie's
26.1 on containerd 1.7, sid's 28.5 on 2.x)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.testbed.containerd import Containerd
from tests.testbed.docker import MOBY_NAMESPACE, Dockerd, missing_prerequisites
from tests.testbed.fixtures import require_docker
from tests.testbed.images import BUSYBOX_IMAGE

pytestmark = pytest.mark.containerd

RUN = ("run", "--rm", "--network", "none")


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _ctr(containerd: Containerd, *args: str) -> str:
    cmd = [str(containerd.ctr), "-a", str(containerd.grpc_address), "-n", MOBY_NAMESPACE, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def test_missing_prerequisites_are_named(tmp_path: Path) -> None:
    missing = missing_prerequisites(tmp_path)
    assert [Path(m.split()[0]).name for m in missing] == ["dockerd", "docker", "docker-init"]
    assert missing_prerequisites() == []


def test_docker_comes_from_the_containerds_release(
    containerd: Containerd, dockerd: Dockerd
) -> None:
    versions = dockerd.docker("version", "--format", "{{.Client.Version}} {{.Server.Version}}")
    major = "28." if containerd.major >= 2 else "26."
    assert [v[:3] for v in versions.stdout.split()] == [major, major], versions.stdout


def test_env_reaches_container(dockerd: Dockerd) -> None:
    done = dockerd.docker(*RUN, "-e", "FOO=bar", BUSYBOX_IMAGE, "sh", "-c", "echo $FOO")
    assert done.stdout == "bar\n"
    assert dockerd.storage_driver in ("overlay2", "vfs")
    assert f"storage-driver={dockerd.storage_driver}" in dockerd.log_text()


def test_containers_live_in_moby_namespace(containerd: Containerd, dockerd: Dockerd) -> None:
    cid = dockerd.docker(
        "run", "-d", "--network", "none", BUSYBOX_IMAGE, "sleep", "300"
    ).stdout.strip()
    assert cid in _ctr(containerd, "containers", "ls", "-q").split()
    assert cid in _ctr(containerd, "tasks", "ls")
    state = subprocess.run(
        [containerd.runc, "--root", str(dockerd.runc_root), "state", cid],
        check=True,
        capture_output=True,
        text=True,
    )
    assert json.loads(state.stdout)["bundle"] == str(dockerd.bundle(cid))
    dockerd.docker("rm", "--force", cid)
    assert cid not in _ctr(containerd, "containers", "ls", "-q").split()


def test_added_runtime_is_used(make_dockerd: Callable[..., Dockerd], tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    probe = _script(tmp_path / "probe", f'echo "$@" >> {log}\nexec runc "$@"\n')
    bed = make_dockerd(runtimes={"probe": probe})

    def creates() -> list[list[str]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.split() for line in lines if " create " in line]

    bed.docker(*RUN, BUSYBOX_IMAGE, "true")
    assert creates() == [], "the default runtime went through the probe"

    done = bed.docker(*RUN, "--runtime", "probe", BUSYBOX_IMAGE, "echo", "probed")
    assert done.stdout == "probed\n"
    assert len(creates()) == 1, creates()
    argv = creates()[0]
    assert argv[argv.index("--root") + 1] == str(bed.runc_root)
    bundle = Path(argv[argv.index("--bundle") + 1])
    assert bundle == bed.bundle(argv[-1])
    assert bundle.parent.name == MOBY_NAMESPACE


def test_runtime_must_exist(make_dockerd: Callable[..., Dockerd]) -> None:
    bed = make_dockerd(images=False)
    done = bed.docker(*RUN, "--runtime", "absent", BUSYBOX_IMAGE, "true", check=False)
    assert done.returncode != 0
    assert "unknown or invalid runtime name: absent" in done.stderr


def test_cdi_device_edits_reach_container(
    make_dockerd: Callable[..., Dockerd], tmp_path: Path
) -> None:
    marker = tmp_path / "hook-ran"
    hook = _script(tmp_path / "hook", 'exec /bin/cat > "$1"\n')
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "gpushare.io/gpu",
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "env": ["GPUSHARE_TEST=1"],
                    "hooks": [
                        {
                            "hookName": "createRuntime",
                            "path": str(hook),
                            "args": ["hook", str(marker)],
                        }
                    ],
                },
            }
        ],
    }
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "gpushare.json").write_text(json.dumps(spec))
    bed = make_dockerd(cdi_spec_dirs=[spec_dir])
    show = ("sh", "-c", "echo GPUSHARE_TEST=$GPUSHARE_TEST")

    assert bed.docker(*RUN, BUSYBOX_IMAGE, *show).stdout == "GPUSHARE_TEST=\n"
    assert not marker.exists()

    done = bed.docker(*RUN, "--device", "gpushare.io/gpu=0", BUSYBOX_IMAGE, *show)
    assert done.stdout == "GPUSHARE_TEST=1\n"
    state = json.loads(marker.read_text())  # the OCI state runc gives the hook
    assert state["status"] == "creating"
    assert Path(state["bundle"]).parent.name == MOBY_NAMESPACE

    absent = bed.docker(*RUN, "--device", "gpushare.io/gpu=9", BUSYBOX_IMAGE, "true", check=False)
    assert absent.returncode != 0
    assert "gpushare.io/gpu=9" in absent.stderr


def test_stop_leaves_nothing_behind(containerd: Containerd) -> None:
    require_docker()
    bed = Dockerd(containerd).start()
    pid = bed.proc.pid if bed.proc else 0
    cid = bed.docker("run", "-d", "--network", "none", BUSYBOX_IMAGE, "sleep", "300").stdout
    cid = cid.strip()
    bed.stop()
    assert not Path(f"/proc/{pid}").exists()
    assert not bed.base.exists()
    with open("/proc/self/mountinfo") as f:
        assert not [line for line in f if str(bed.base) in line]
    assert cid not in _ctr(containerd, "containers", "ls", "-q")
    shims = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"containerd-shim" in argv[0] and cid.encode() in argv:
            shims.append(proc.name)
    assert shims == []
    assert os.path.exists(containerd.grpc_address)
