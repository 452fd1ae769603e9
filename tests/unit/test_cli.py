"""The command line: bad configuration is refused at start with file, key and reason."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nri_gpushare.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_refuses_unknown_key(tmp_path):
    config = tmp_path / "node.yaml"
    config.write_text("nri:\n  sockett: /run/nri.sock\n")
    result = run_cli("run", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: nri.sockett: unknown key" in result.stderr


def test_run_refuses_bad_value(tmp_path):
    config = tmp_path / "node.yaml"
    config.write_text("max_inst: 30\n")
    result = run_cli("run", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: max_inst: 30 is outside 1..25" in result.stderr


def test_run_without_gpus_says_so(tmp_path):
    config = tmp_path / "node.yaml"
    config.write_text("use_nvml: false\nkmod: off\n")
    result = run_cli("run", "--config", str(config))
    assert result.returncode == 2
    assert "no GPUs" in result.stderr and "inventory" in result.stderr


def test_installed_console_script_exists():
    from pathlib import Path

    script = Path(sys.executable).with_name("nri-gpushare")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "status" in result.stdout
