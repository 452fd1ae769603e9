"""`nri-gpushare enable` / `disable` (the real CLI) on copies of stock
containerd configs, then the real containerd 1.7.24 and 2.1.9 started with
the result and the real plugin connecting to it.

Each config is first given the test bed's private paths (root, state,
sockets, CNI and NRI plugin dirs: `Containerd.private_config`); that copy is
what enable edits, what the second enable must leave byte for byte, and what
disable must give back byte for byte.  The plugin's own config names a
private NRI socket, so enable has the socket to set as well as `disable`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import prereqs
from tests.integration.plugin import PluginProcess
from tests.testbed.containerd import SID_BIN, TRIXIE_BIN, Containerd, missing_prerequisites

pytestmark = pytest.mark.containerd

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / ".venv" / "bin" / "nri-gpushare"
DATA = Path(__file__).parent / "data"

# name: (binary dir, config source, NRI on in the file before enable)
CONFIGS = {
    "1.7-stock": (TRIXIE_BIN, "containerd-1.7.24-default.toml", False),
    "1.7-generated": (TRIXIE_BIN, "generate", False),
    "1.7-debian-package": (TRIXIE_BIN, "debian-containerd-config.toml", False),
    "2.1-stock": (SID_BIN, "containerd-2.1.9-default.toml", True),
    "2.1-generated": (SID_BIN, "generate", True),
    "2.1-debian-package": (SID_BIN, "debian-containerd-config.toml", True),
    "2.1-operator-disabled": (SID_BIN, "operator-disabled", False),
}


def _require(bin_dir: Path) -> None:
    missing = missing_prerequisites(bin_dir)
    if not CLI.exists():
        missing.append(f"{CLI} (pip install -e . into .venv)")
    if missing:
        prereqs.missing("enable test prerequisites missing: " + "; ".join(missing))


def _source_text(bin_dir: Path, source: str) -> str:
    if source == "generate":  # what this binary writes today
        return subprocess.run(
            [str(bin_dir / "containerd"), "config", "default"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    if source == "operator-disabled":  # an operator turned 2.x's NRI off
        text = (DATA / "containerd-2.1.9-default.toml").read_text()
        assert text.count("    disable = false\n    socket_path") == 1
        return text.replace(
            "    disable = false\n    socket_path", "    disable = true\n    socket_path"
        )
    return (DATA / source).read_text()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def tmp_short() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gs-en-", dir="/tmp"))  # unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _bed(base: Path, bin_dir: Path, config: Path) -> Containerd:
    return Containerd(base, bin_dir=bin_dir, images=False, config_file=config)


def _backups(config: Path) -> list[Path]:
    return sorted(config.parent.glob(config.name + ".nri-gpushare-*.bak"))


def _nri_on(bed: Containerd) -> bool:
    """containerd created its NRI socket (it does so only with NRI on)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if bed.nri_socket.is_socket():
            return True
        if "created NRI interface" not in bed.log_text():
            return False
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("name", list(CONFIGS))
def test_enable_twice_then_disable(name: str, tmp_short: Path) -> None:
    bin_dir, source, nri_on_before = CONFIGS[name]
    _require(bin_dir)
    binary = str(bin_dir / "containerd")
    base = tmp_short / "bed"
    config = tmp_short / "etc" / "config.toml"
    config.parent.mkdir()
    bed = _bed(base, bin_dir, config)
    original = bed.private_config(_source_text(bin_dir, source)).encode()
    config.write_bytes(original)
    config.chmod(0o640)
    plugin = PluginProcess(bed.nri_socket, tmp_short / "plugin")
    args = ("--config", str(config), "--containerd", binary)

    first = cli("enable", *args, "--plugin-config", str(plugin.config_path))
    assert first.returncode == 0, first.stderr
    assert "NRI enabled for nri-gpushare" in first.stdout
    assert "systemctl restart containerd" in first.stdout
    enabled = config.read_bytes()
    assert enabled != original
    assert config.stat().st_mode & 0o777 == 0o640
    assert [b.read_bytes() for b in _backups(config)] == [original]

    assert str(bed.nri_socket) in enabled.decode()  # never the host's NRI socket
    try:
        bed.start()
        plugin.start()  # waits until containerd synchronized it
        assert plugin.status()["nri"]["connected"]
    finally:
        if plugin.proc is not None:
            plugin.stop()
        bed.stop()

    second = cli("enable", *args, "--plugin-config", str(plugin.config_path))
    assert second.returncode == 0, second.stderr
    assert "no change" in second.stdout
    assert config.read_bytes() == enabled
    assert len(_backups(config)) == 1

    off = cli("disable", *args)
    assert off.returncode == 0, off.stderr
    assert config.read_bytes() == original  # NRI's previous state, byte for byte
    assert len(_backups(config)) == 2
    again = cli("disable", *args)
    assert again.returncode == 0 and "no change" in again.stdout, again.stdout + again.stderr
    assert config.read_bytes() == original

    # containerd starts with what disable gave back, with NRI as it was (on
    # 2.x's default socket, moved to the private one for this start only).
    restored = tmp_short / "restored.toml"
    after = _bed(tmp_short / "bed2", bin_dir, restored)
    restored.write_text(after.private_config(original.decode(), nri_socket=True))
    assert str(after.nri_socket) in restored.read_text()  # never the host's socket
    try:
        after.start()
        assert _nri_on(after) is nri_on_before, after.log_tail()
    finally:
        after.stop()


def test_stock_2x_with_the_plugin_defaults_needs_no_change(tmp_short: Path) -> None:
    """containerd 2.x has NRI on by default with the socket and timeouts the
    plugin uses by default: enable leaves its stock config alone."""
    _require(SID_BIN)
    config = tmp_short / "config.toml"
    shutil.copyfile(DATA / "containerd-2.1.9-default.toml", config)
    plugin_config = tmp_short / "gpushare.yaml"
    plugin_config.write_text("nri: {}\n")
    done = cli(
        "enable",
        "--config",
        str(config),
        "--containerd",
        str(SID_BIN / "containerd"),
        "--plugin-config",
        str(plugin_config),
    )
    assert done.returncode == 0, done.stderr
    assert "no change" in done.stdout
    assert config.read_bytes() == (DATA / "containerd-2.1.9-default.toml").read_bytes()
    assert _backups(config) == []


def test_missing_config_is_created_and_disable_removes_it(tmp_short: Path) -> None:
    _require(TRIXIE_BIN)
    config = tmp_short / "config.toml"
    args = ("--config", str(config), "--containerd", str(TRIXIE_BIN / "containerd"))
    plugin_config = tmp_short / "gpushare.yaml"
    plugin_config.write_text("nri: {}\n")
    done = cli("enable", *args, "--plugin-config", str(plugin_config))
    assert done.returncode == 0, done.stderr
    text = config.read_text()
    assert text.startswith("version = 2\n") and "disable = false" in text
    assert config.stat().st_mode & 0o777 == 0o644
    off = cli("disable", *args)
    assert off.returncode == 0, off.stderr
    assert not config.exists()
    assert len(_backups(config)) == 1


def test_dry_run_prints_the_diff_and_changes_nothing(tmp_short: Path) -> None:
    _require(TRIXIE_BIN)
    config = tmp_short / "config.toml"
    shutil.copyfile(DATA / "containerd-1.7.24-default.toml", config)
    before = config.read_bytes()
    done = cli(
        "enable",
        "--dry-run",
        "--config",
        str(config),
        "--containerd",
        str(TRIXIE_BIN / "containerd"),
    )
    assert done.returncode == 0, done.stderr
    assert "-    disable = true\n" in done.stdout
    assert "+    disable = false  # nri-gpushare enable:" in done.stdout
    assert "nothing was changed" in done.stdout
    assert config.read_bytes() == before
    assert sorted(p.name for p in tmp_short.iterdir()) == ["config.toml"]  # no temp, no backup


@pytest.mark.parametrize(
    ("bin_dir", "text", "says"),
    [
        (TRIXIE_BIN, "version = 2\n[plugins\n", "cannot parse"),
        (TRIXIE_BIN, "version = 3\n", "version `3` is not supported"),
        (
            TRIXIE_BIN,
            'version = 2\n[plugins."io.containerd.nri.v1.nri"]\n'
            '  plugin_request_timeout = "soon"\n',
            "cannot parse",
        ),
        (SID_BIN, 'disabled_plugins = ["cri"]\n', "config migrate"),
        (TRIXIE_BIN, 'disabled_plugins = ["cri"]\n', "version = 2"),
        (
            SID_BIN,
            'version = 3\ndisabled_plugins = ["io.containerd.nri.v1.nri"]\n',
            "disabled_plugins",
        ),
    ],
    ids=["broken", "v3-on-1.7", "bad-duration", "v1-on-2.x", "v1-on-1.7", "nri-disabled-plugin"],
)
def test_refusals_change_nothing(bin_dir: Path, text: str, says: str, tmp_short: Path) -> None:
    _require(bin_dir)
    config = tmp_short / "config.toml"
    config.write_text(text)
    plugin_config = tmp_short / "gpushare.yaml"  # a timeout no default has: a change is due
    plugin_config.write_text("nri: {request_timeout: 3}\n")
    binary = str(bin_dir / "containerd")
    done = cli(
        "enable",
        "--config",
        str(config),
        "--containerd",
        binary,
        "--plugin-config",
        str(plugin_config),
    )
    assert done.returncode == 1
    assert says in done.stderr and "Nothing was changed." in done.stderr, done.stderr
    assert config.read_text() == text
    assert sorted(p.name for p in tmp_short.iterdir()) == ["config.toml", "gpushare.yaml"]


def test_an_import_that_overrides_nri_is_refused(tmp_short: Path) -> None:
    """containerd merges `imports` over the main file: editing the main file
    would not turn NRI on, and enable says where the setting comes from."""
    _require(TRIXIE_BIN)
    config = tmp_short / "config.toml"
    config.write_text('version = 2\nimports = ["conf.d/*.toml"]\n')
    (tmp_short / "conf.d").mkdir()
    (tmp_short / "conf.d" / "nri.toml").write_text(
        'version = 2\n[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n'
    )
    done = cli("enable", "--config", str(config), "--containerd", str(TRIXIE_BIN / "containerd"))
    assert done.returncode == 1
    assert "imports" in done.stderr and "nri.toml" in done.stderr, done.stderr
    assert config.read_text() == 'version = 2\nimports = ["conf.d/*.toml"]\n'
    assert sorted(p.name for p in tmp_short.iterdir()) == ["conf.d", "config.toml"]


def test_missing_containerd_binary_is_named(tmp_short: Path) -> None:
    config = tmp_short / "config.toml"
    done = cli("enable", "--config", str(config), "--containerd", str(tmp_short / "nope"))
    assert done.returncode == 1
    assert "--containerd" in done.stderr and "not found" in done.stderr
    assert not config.exists()


def test_a_symlinked_config_is_edited_where_it_points(tmp_short: Path) -> None:
    _require(TRIXIE_BIN)
    (tmp_short / "managed").mkdir()
    target = tmp_short / "managed" / "containerd.toml"
    shutil.copyfile(DATA / "containerd-1.7.24-default.toml", target)
    link = tmp_short / "config.toml"
    link.symlink_to(target)
    args = ("--config", str(link), "--containerd", str(TRIXIE_BIN / "containerd"))
    done = cli("enable", *args)
    assert done.returncode == 0, done.stderr
    assert f"{link} is a link to {target}" in done.stdout
    assert link.is_symlink() and link.resolve() == target
    assert "disable = false  # nri-gpushare enable" in target.read_text()
    assert len(_backups(target)) == 1
    assert cli("disable", *args).returncode == 0
    assert target.read_bytes() == (DATA / "containerd-1.7.24-default.toml").read_bytes()


def test_a_symlinked_configs_imports_resolve_beside_the_link(tmp_short: Path) -> None:
    """containerd resolves relative `imports` beside the path it is given
    (the link), not beside the link's target: enable must read and check
    the file as containerd will, or it reports NRI on while an import in the
    link's directory turns it off."""
    _require(TRIXIE_BIN)
    (tmp_short / "managed").mkdir()
    target = tmp_short / "managed" / "containerd.toml"
    target.write_text('version = 2\nimports = ["conf.d/*.toml"]\n')
    link = tmp_short / "config.toml"
    link.symlink_to(target)
    (tmp_short / "conf.d").mkdir()
    (tmp_short / "conf.d" / "nri.toml").write_text(
        'version = 2\n[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n'
    )
    done = cli("enable", "--config", str(link), "--containerd", str(TRIXIE_BIN / "containerd"))
    assert done.returncode == 1, done.stdout
    assert "imports" in done.stderr and "nri.toml" in done.stderr, done.stderr
    assert target.read_text() == 'version = 2\nimports = ["conf.d/*.toml"]\n'
    assert sorted(p.name for p in tmp_short.iterdir()) == ["conf.d", "config.toml", "managed"]
    assert [p.name for p in (tmp_short / "managed").iterdir()] == ["containerd.toml"]
