"""The command line: bad configuration is refused at start with file, key and reason."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nri_gpushare.cli.main", *args],
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


def test_status_text_shows_guards_and_used_next_to_quota(capsys):
    from nri_gpushare.cli.main import _print_status

    share = {"index": 0, "uuid": "GPU-a", "memory": 2 << 30, "core": 30, "processes": 1}
    status = {
        "kmod": {"mode": "optional", "loaded": True, "problem": ""},
        "interposer": {
            "library": "/usr/lib/nri-gpushare/libgpushare.so",
            "container_path": "/usr/lib/gpushare/libgpushare.so",
            "preload": "ld.so.preload",
            "missing": "warn",
            "allow_managed": False,
            "problem": "does not exist",
        },
        "nvml_memory_limits": {"mode": "auto", "gpus": {"0": "", "1": "MIG mode"}},
        "gpus": [],
        "allocations": [
            {
                "container_id": "c1" * 8,
                "pod": "ns/train",
                "priority": "normal",
                "guards": ["interposer", "kernel-ledger", "nvml-limit"],
                "unguarded": {},
                "gpus": [{**share, "memory_used": 512 << 20, "memory_used_why": ""}],
            },
            {
                "container_id": "c2",
                "pod": "ns/free",
                "priority": "normal",
                "guards": ["none"],
                "unguarded": {"none": "isolation none: the share is accounted, not enforced"},
                "gpus": [{**share, "memory_used": None, "memory_used_why": "unknown: kmod: off"}],
            },
            {
                "container_id": "d3",
                "name": "web",
                "pod": "",
                "origin": "runc:default",
                "priority": "normal",
                "guards": ["interposer"],
                "unguarded": {},
                "gpus": [{**share, "memory_used": None, "memory_used_why": ""}],
            },
        ],
    }
    _print_status(status)
    out = capsys.readouterr().out
    assert "interposer: /usr/lib/nri-gpushare/libgpushare.so -> /usr/lib/gpushare/" in out
    assert "does not exist (interposer.missing: warn)" in out
    assert "driver memory limits (NVML): on GPU 0; not on GPU 1: MIG mode" in out
    assert "USED" in out and "GUARDS" in out
    assert "512Mi" in out and "interposer,kernel-ledger,nvml-limit" in out
    assert "c2: unguarded: isolation none" in out
    assert "c2: used unknown: kmod: off" in out
    assert "runc:default web" in out  # a container started by hand: how it asked, its name
