"""The layering in pyproject.toml ([tool.importlinter]) holds, and the check
that enforces it fails on an import that runs up a layer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_layers_hold() -> None:
    result = lint(TOP)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copy(TOP / "pyproject.toml", tmp_path)
    shutil.copytree(
        TOP / "nri_gpushare",
        tmp_path / "nri_gpushare",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return tmp_path


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    root = copy_of_the_package(tmp_path)
    assert lint(root).returncode == 0  # the copy is checked, and holds as it is
    model = root / "nri_gpushare" / "share" / "model.py"
    model.write_text(model.read_text() + "\nimport nri_gpushare.daemon.main  # noqa\n")
    result = lint(root)
    assert result.returncode != 0
    assert "nri_gpushare.share.model -> nri_gpushare.daemon.main" in result.stdout


def test_a_third_party_import_in_the_wrapper_breaks_its_contract(tmp_path: Path) -> None:
    root = copy_of_the_package(tmp_path)
    wrapper = root / "nri_gpushare" / "local" / "runc_wrapper.py"
    wrapper.write_text(wrapper.read_text() + "\nimport yaml  # noqa\n")
    result = lint(root)
    assert result.returncode != 0
    assert "import the standard library only BROKEN" in " ".join(result.stdout.split())
