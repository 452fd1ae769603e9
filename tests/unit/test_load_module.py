"""`nri-gpushare load-module` (the unit's ExecStartPre) with a stand-in modprobe."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_gpushare.cli.main import main


def _modprobe(tmp_path: Path, status: int) -> tuple[str, Path]:
    """A stand-in modprobe that records its arguments and exits with `status`."""
    log = tmp_path / "modprobe.log"
    program = tmp_path / "modprobe"
    program.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\necho "modprobe: FATAL: Module gpushare not found" >&2\n'
        f"exit {status}\n"
    )
    program.chmod(0o755)
    return str(program), log


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gpushare.yaml"
    path.write_text(text)
    return str(path)


def test_loads_the_module_when_kmod_load_is_true(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    modprobe, log = _modprobe(tmp_path, 0)
    config = _config(tmp_path, "kmod_load: true\n")
    assert main(["load-module", "--config", config, "--modprobe", modprobe]) == 0
    assert log.read_text() == "gpushare\n"
    assert "loaded gpushare" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "why"),
    [("kmod_load: false\n", "kmod_load is false"), ("kmod_load: true\nkmod: off\n", "kmod: off")],
)
def test_does_nothing_unless_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, why: str
) -> None:
    modprobe, log = _modprobe(tmp_path, 0)
    assert main(["load-module", "--config", _config(tmp_path, text), "--modprobe", modprobe]) == 0
    assert not log.exists()
    assert why in capsys.readouterr().out


def test_defaults_do_not_load(tmp_path: Path) -> None:
    modprobe, log = _modprobe(tmp_path, 0)
    assert main(["load-module", "--modprobe", modprobe]) == 0
    assert not log.exists()


def test_failure_fails_when_required(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    modprobe, log = _modprobe(tmp_path, 1)
    config = _config(tmp_path, "kmod_load: true\nkmod: required\n")
    assert main(["load-module", "--config", config, "--modprobe", modprobe]) == 1
    err = capsys.readouterr().err
    assert "Module gpushare not found" in err and "kmod: required" in err
    assert log.read_text() == "gpushare\n"


def test_failure_is_logged_when_optional(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    modprobe, _ = _modprobe(tmp_path, 1)
    config = _config(tmp_path, "kmod_load: true\nkmod: optional\n")
    assert main(["load-module", "--config", config, "--modprobe", modprobe]) == 0
    err = capsys.readouterr().err
    assert "Module gpushare not found" in err and "kmod: optional" in err


def test_missing_modprobe_fails_when_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, "kmod_load: true\nkmod: required\n")
    missing = str(tmp_path / "no-such-modprobe")
    assert main(["load-module", "--config", config, "--modprobe", missing]) == 1
    assert "cannot run" in capsys.readouterr().err


def test_bad_config_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "kmod_load: maybe\n")
    assert main(["load-module", "--config", config]) == 2
    assert "kmod_load" in capsys.readouterr().err


def test_an_unfinished_module_upgrade_is_left_to_kmod_upgrade(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain load would come up empty under a saved upgrade state: the daemon
    would register anew and the upgrade's import would be refused."""
    modprobe, log = _modprobe(tmp_path, 0)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "kmod-upgrade.state").write_text("gpushare-upgrade 1 0.1.0 exported\n")
    config = _config(tmp_path, f"kmod_load: true\nkmod: required\nstate_dir: {state_dir}\n")
    assert main(["load-module", "--config", config, "--modprobe", modprobe]) == 0
    assert not log.exists()
    assert "nri-gpushare kmod-upgrade" in capsys.readouterr().err
    (state_dir / "kmod-upgrade.state").rename(state_dir / "kmod-upgrade.state.imported-1")
    assert main(["load-module", "--config", config, "--modprobe", modprobe]) == 0
    assert log.read_text() == "gpushare\n"
