"""systemd/nri-gpushare.service: `systemd-analyze verify` finds nothing to say
about it in a root laid out as scripts/install-node.sh lays it out, and it
points at what the installer produces."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from tests.prereqs import missing

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "nri-gpushare.service"
INSTALLER = REPO / "scripts" / "install-node.sh"


def unit_settings(text: str) -> dict[str, list[str]]:
    """Key -> values, in order (a key may repeat)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def installer_paths() -> dict[str, str]:
    """The installer's path constants (NAME=value lines at the top level)."""
    values: dict[str, str] = {}
    for name, value in re.findall(r"^([A-Z_]+)=(\S+)$", INSTALLER.read_text(), re.M):
        for known, resolved in values.items():
            value = value.replace(f"${known}", resolved)
        values[name] = value
    return values


def fake_root(root: Path, unit_text: str) -> None:
    """The installer's layout: the unit, its program (a stub) and its doc, with
    the machine's own system units (the targets it depends on)."""
    paths = installer_paths()
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    unit = root / paths["UNIT"].lstrip("/")
    unit.parent.mkdir(parents=True)
    unit.write_text(unit_text)
    program = root / paths["VENV"].lstrip("/") / "bin" / "nri-gpushare"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    doc = root / paths["DOC"].lstrip("/") / "install.md"
    doc.parent.mkdir(parents=True)
    doc.write_text("docs\n")


def verify(root: Path) -> str:
    """systemd-analyze verify's whole output about the installed unit."""
    if shutil.which("systemd-analyze") is None:
        missing("systemd-analyze is not installed (apt-get install systemd)")
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "nri-gpushare.service"],
        capture_output=True,
        text=True,
    )
    return (done.stdout + done.stderr).strip() + ("" if done.returncode == 0 else " [failed]")


def test_verify_says_nothing(tmp_path: Path) -> None:
    fake_root(tmp_path, UNIT.read_text())
    assert verify(tmp_path) == ""


def test_verify_catches_an_unknown_key_and_a_missing_program(tmp_path: Path) -> None:
    """The check above can fail: a warning alone (exit status 0) counts."""
    fake_root(tmp_path, UNIT.read_text().replace("[Service]\n", "[Service]\nRestartSteps=3\n"))
    assert "Unknown key 'RestartSteps'" in verify(tmp_path)
    other = tmp_path / "other"
    fake_root(other, UNIT.read_text().replace("venv/bin/nri-gpushare run", "venv/bin/x run"))
    assert "is not executable" in verify(other)


def test_unit_runs_what_the_installer_installs() -> None:
    paths = installer_paths()
    settings = unit_settings(UNIT.read_text())
    program = f"{paths['VENV']}/bin/nri-gpushare"
    config = paths["CONFIG"]
    assert [shlex.split(v) for v in settings["ExecStart"]] == [[program, "run", "--config", config]]
    assert [shlex.split(v.lstrip("-")) for v in settings["ExecStartPre"]] == [
        [program, "load-module", "--config", config]
    ]
    assert settings["Documentation"] == [f"file:{paths['DOC']}/install.md"]
    assert "containerd.service" in settings["After"][0].split()
    assert settings["Restart"] == ["on-failure"]
    # The journal gets the output: no log file, no redirection elsewhere.
    assert "StandardOutput" not in settings and "StandardError" not in settings


def test_a_config_error_in_exec_start_pre_is_not_restarted_for_ever(tmp_path: Path) -> None:
    """RestartPreventExitStatus= is matched against the main process's status
    only (systemd's service_shall_restart reads main_exec_status): an
    ExecStartPre that fails with it is restarted every RestartSec for ever.
    So an ExecStartPre that can exit with such a status must be '-' (its
    failure ignored): the daemon then reads the same config and exits 2 as
    the main process, which stops the restarts."""
    import sys

    settings = unit_settings(UNIT.read_text())
    prevent = {int(s) for v in settings["RestartPreventExitStatus"] for s in v.split()}
    bad = tmp_path / "bad.yaml"
    bad.write_text("kmod: maybe\n")
    for line in settings["ExecStartPre"]:
        argv = shlex.split(line.lstrip("-@:+!"))
        assert argv[1] == "load-module"
        done = subprocess.run(
            [sys.executable, "-m", "nri_gpushare.cli.main", *argv[1:-1], str(bad)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        if done.returncode in prevent:
            assert line.startswith("-"), f"ExecStartPre exits {done.returncode}: {line}"
    done = subprocess.run(
        [sys.executable, "-m", "nri_gpushare.cli.main", "run", "--config", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode in prevent, done.stderr
