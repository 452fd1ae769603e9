"""The editing behind `nri-gpushare enable` / `disable` (pure: text in, text
out), and the file handling, without containerd.

containerd's view of a file (`config dump`) is stood in for by `effective()`:
its defaults (NRI off in 1.7, on in 2.x) overlaid with the file's NRI table.
tests/integration/test_enable.py runs the same on the real binaries.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from nri_gpushare.ops.containerd_config import ConfigFile
from nri_gpushare.ops.containerd_nri import (
    ConfigEditError,
    NoTempFileError,
    NriSettings,
    effective_nri,
    go_duration,
    parse_go_duration,
)
from nri_gpushare.ops.containerd_plan import plan_disable, plan_enable
from nri_gpushare.ops.containerd_toml import MARK
from tests import prereqs

DATA = Path(__file__).resolve().parents[1] / "integration" / "data"
STOCK_17 = (DATA / "containerd-1.7.24-default.toml").read_text()
STOCK_21 = (DATA / "containerd-2.1.9-default.toml").read_text()
DEBIAN = (DATA / "debian-containerd-config.toml").read_text()
NRI = "io.containerd.nri.v1.nri"
HEADER = f'[plugins."{NRI}"]'
PLUGIN = NriSettings("/run/nri/gpushare-test.sock", 5.0, 2.0)
DEFAULTS = NriSettings()


def effective(text: str | None, version: int) -> dict[str, object]:
    """containerd's NRI settings for `text` (version 2: 1.7, 3: 2.x), no imports."""
    nri: dict[str, object] = {
        "disable": version == 2,
        "disable_connections": False,
        "socket_path": "/var/run/nri/nri.sock",
        "plugin_path": "/opt/nri/plugins",
        "plugin_config_path": "/etc/nri/conf.d",
        "plugin_registration_timeout": "5s",
        "plugin_request_timeout": "2s",
    }
    if text:
        nri.update(tomllib.loads(text).get("plugins", {}).get(NRI, {}))
    return nri


def enable(text: str | None, version: int, settings: NriSettings = PLUGIN) -> str | None:
    return plan_enable(text, effective(text, version), settings, version).new


def enabled_then_restored(text: str | None, version: int) -> tuple[str | None, str | None]:
    new = enable(text, version)
    assert new != text
    assert new is not None
    return new, plan_disable(new).new


def nri_table(text: str) -> dict[str, object]:
    table: dict[str, object] = tomllib.loads(text)["plugins"][NRI]
    return table


def outside_nri_table(text: str) -> list[str]:
    """The lines before the NRI table's header and from the next header on."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if NRI in line and line.lstrip()[0] == "[")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines)
    )
    return lines[:start] + lines[end:]


# -- durations -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(2, "2s"), (5.0, "5s"), (0.5, "500ms"), (1.5, "1500ms"), (0.1, "100ms"), (600, "600s")],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1m30s", 90), ("1.5s", 1.5), ("2h0m0s", 7200), ("0s", 0), ("0", 0), ("250us", 0.00025)],
)
def test_parse_go_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "soon", "5 s", "s", "1m30", "-"])
def test_parse_go_duration_refuses(text: str) -> None:
    assert parse_go_duration(text) is None


# -- enable --------------------------------------------------------------------


def test_stock_17_changes_only_lines_in_the_nri_table() -> None:
    new = enable(STOCK_17, 2)
    assert new is not None
    assert outside_nri_table(new) == outside_nri_table(STOCK_17)
    table = nri_table(new)
    assert table["disable"] is False
    assert table["socket_path"] == PLUGIN.socket_path
    changed = set(new.splitlines()) - set(STOCK_17.splitlines())
    assert changed == {
        '    disable = false  # nri-gpushare enable: {"set": "false", "was": "true"}',
        '    socket_path = "/run/nri/gpushare-test.sock"  # nri-gpushare enable: '
        '{"set": "\\"/run/nri/gpushare-test.sock\\"", "was": "\\"/var/run/nri/nri.sock\\""}',
    }


def test_stock_21_keeps_its_literal_quotes_and_leaves_nri_on_alone() -> None:
    new = enable(STOCK_21, 3)
    assert new is not None
    assert outside_nri_table(new) == outside_nri_table(STOCK_21)
    changed = set(new.splitlines()) - set(STOCK_21.splitlines())
    assert [line.split("  #")[0] for line in changed] == [
        "    socket_path = '/run/nri/gpushare-test.sock'"
    ]


def test_stock_21_needs_nothing_with_the_plugins_defaults() -> None:
    plan = plan_enable(STOCK_21, effective(STOCK_21, 3), DEFAULTS, 3)
    assert not plan.changed


def test_timeouts_are_written_as_go_durations() -> None:
    settings = NriSettings(PLUGIN.socket_path, 7.5, 0.25)
    new = enable(STOCK_17, 2, settings)
    assert new is not None
    table = nri_table(new)
    assert table["plugin_registration_timeout"] == "7500ms"
    assert table["plugin_request_timeout"] == "250ms"


def test_equal_durations_spelled_differently_are_no_change() -> None:
    text = STOCK_17.replace('plugin_request_timeout = "2s"', 'plugin_request_timeout = "2000ms"')
    text = text.replace("    disable = true\n", "    disable = false\n")
    plan = plan_enable(text, effective(text, 2), DEFAULTS, 2)
    assert not plan.changed


@pytest.mark.parametrize(
    ("name", "text", "version"),
    [
        ("stock 1.7", STOCK_17, 2),
        ("stock 2.1", STOCK_21, 3),
        ("debian", DEBIAN, 2),
        (
            "2.1 disabled",
            STOCK_21.replace("disable = false\n    socket", "disable = true\n    socket"),
            3,
        ),
        ("missing", None, 2),
        ("comments only", "# containerd config\n# all defaults\n", 2),
        ("empty", "", 3),
        ("no newline at end", "version = 2\n[grpc]\n  address = '/run/c.sock'", 2),
        ("crlf", 'version = 2\r\n\r\n[plugins."x"]\r\n  a = 1\r\n', 2),
        ("no plugins", "version = 3\n", 3),
    ],
)
def test_second_enable_is_no_change(name: str, text: str | None, version: int) -> None:
    new = enable(text, version)
    assert new is not None and new != text, name
    assert effective(new, version)["disable"] is False
    assert nri_table(new)["socket_path"] == PLUGIN.socket_path
    assert tomllib.loads(new)["version"] == version
    again = plan_enable(new, effective(new, version), PLUGIN, version)
    assert not again.changed
    assert again.new == new


def test_a_table_with_other_keys_and_comments_keeps_them() -> None:
    text = (
        "version = 2\n"
        "# NRI: kept off until the GPU nodes are ready\n"
        f"{HEADER}  # the header's own comment\n"
        "    # why the timeouts are long\n"
        "    disable = true  # off for now\n"
        '    plugin_registration_timeout = "30s"\n'
        "    future_key = 'kept'\n"
        "\n"
        "[grpc]\n"
        "  address = '/run/c.sock'\n"
    )
    new = enable(text, 2)
    assert new is not None
    assert "    # why the timeouts are long\n" in new
    assert "    future_key = 'kept'\n" in new
    assert f"{HEADER}  # the header's own comment\n" in new
    assert "# off for now" in new  # kept in the record, for disable
    # Added keys take the indentation of the table's keys, after its last key.
    assert '    plugin_registration_timeout = "5s"' in new
    assert '\n    socket_path = "/run/nri/gpushare-test.sock"  # ' + MARK in new
    assert new.index("socket_path") < new.index("[grpc]")
    assert plan_disable(new).new == text


@pytest.mark.parametrize(
    "text",
    [
        f'version = 2\n{HEADER}\n"disable" = true\n',
        f"version = 2\n{HEADER}\ndisable=true\n",
        f"version = 2\n{HEADER}\n\tdisable = true # tab\n",
        f"version = 2\n[plugins.'{NRI}']\n  disable = true\n",
        f'version = 2\n[ plugins . "{NRI}" ]\n  disable = true\n',
        f'version = 2\n{HEADER}\n  disable = true\n[grpc]\n  a = 1\n[plugins."x"]\n  b = 1\n',
        f'version = 2\n[plugins]\n  [plugins."a"]\n    x = 1\n  {HEADER}\n    disable = true\n',
        f'version = 2\nplugins."io.containerd.grpc.v1.cri".x = 1\n{HEADER}\n  disable = true\n',
    ],
    ids=[
        "quoted key",
        "no spaces",
        "tab",
        "literal header",
        "spaced header",
        "out of order",
        "nested",
        "dotted plugins",
    ],
)
def test_odd_but_valid_tables_round_trip(text: str) -> None:
    new, restored = enabled_then_restored(text, 2)
    assert nri_table(new)["disable"] is False
    assert restored == text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f'version = 2\n[plugins]\n  "{NRI}" = {{ disable = true }}\n', "inline table"),
        (f'version = 2\nplugins = {{ "{NRI}" = {{ disable = true }} }}\n', "inline table"),
        ('version = 2\nplugins = { "x" = { a = 1 } }\n', "inline table"),
        (f'version = 2\n[plugins]\n  "{NRI}".disable = true\n', "dotted keys"),
        (f'version = 2\nplugins."{NRI}".disable = true\n', "dotted keys"),
        (f'version = 2\n[plugins."{NRI}".sub]\n  a = 1\n', "dotted keys or sub-tables"),
        (f'version = 2\n[[plugins."{NRI}"]]\n  a = 1\n', "array of tables"),
        (
            f'version = 2\n[plugins."{NRI}"]\n  a = 1\n[plugins.x]\n[plugins."{NRI}".sub]\n',
            "split over several places",
        ),
        ("version = 2\n[plugins\n", "not valid TOML"),
        (
            f"version = 2\n{HEADER}\n  disable = true\n{HEADER}\n  disable = true\n",
            "not valid TOML",
        ),
        ("version = 1\n", "version 1 config"),
        ('disabled_plugins = ["cri"]\n', "version 1 config"),
        ("version = 4\n", "versions 2 and 3 only"),
        ("version = '2'\n", "versions 2 and 3 only"),
    ],
)
def test_refused_forms(text: str, says: str) -> None:
    with pytest.raises(ConfigEditError, match=says):
        plan_enable(text, effective(None, 2), PLUGIN, 2)


def test_version_1_advice_depends_on_the_binary() -> None:
    with pytest.raises(ConfigEditError, match="config migrate"):
        plan_enable("oom_score = 0\n", effective(None, 3), PLUGIN, 3)
    with pytest.raises(ConfigEditError, match="add `version = 2`"):
        plan_enable("oom_score = 0\n", effective(None, 2), PLUGIN, 2)


def test_a_setting_containerd_does_not_see_points_at_imports() -> None:
    text = (
        f"version = 2\nimports = ['/etc/containerd/conf.d/*.toml']\n{HEADER}\n  disable = false\n"
    )
    seen = effective(text, 2) | {"disable": True}  # an imported file turned it off
    with pytest.raises(ConfigEditError, match="imports"):
        plan_enable(text, seen, PLUGIN, 2)


def test_settings_containerd_does_not_know_are_not_written() -> None:
    seen = effective(STOCK_17, 2)
    del seen["disable_connections"]
    new = plan_enable(STOCK_17.replace("disable_connections = false", "x = 1"), seen, PLUGIN, 2).new
    assert new is not None and "disable_connections" not in new


def test_disable_connections_true_is_turned_off_and_back() -> None:
    text = STOCK_17.replace("disable_connections = false", "disable_connections = true")
    new, restored = enabled_then_restored(text, 2)
    assert nri_table(new)["disable_connections"] is False
    assert restored == text


@pytest.mark.parametrize(
    "socket",
    ['/run/it\'s "quoted"/nri.sock', "/run/back\\slash/nri.sock", "/run/ünï/nri.sock"],
)
@pytest.mark.parametrize("version", [2, 3])
def test_hostile_socket_paths_are_escaped(socket: str, version: int) -> None:
    text = STOCK_17 if version == 2 else STOCK_21
    settings = NriSettings(socket, 5.0, 2.0)
    new = enable(text, version, settings)
    assert new is not None
    assert nri_table(new)["socket_path"] == socket
    assert plan_disable(new).new == text


# -- disable -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (STOCK_17, 2),
        (STOCK_21, 3),
        (STOCK_21.replace("disable = false\n    socket", "disable = true\n    socket"), 3),
        (DEBIAN, 2),
        (DEBIAN, 3),
        ("# containerd config\n", 2),
        ("", 2),
        ("version = 2\n[grpc]\n  address = '/run/c.sock'", 2),
        ('version = 2\r\n\r\n[plugins."x"]\r\n  a = 1\r\n', 2),
    ],
)
def test_disable_gives_back_the_file_byte_for_byte(text: str, version: int) -> None:
    _new, restored = enabled_then_restored(text, version)
    assert restored == text
    assert not plan_disable(text).changed  # and a second disable changes nothing


def test_disable_of_a_created_file_removes_it() -> None:
    new, restored = enabled_then_restored(None, 2)
    assert new.startswith("version = 2\n")
    assert restored is None


def test_enable_again_with_new_settings_keeps_the_first_was() -> None:
    first = enable(STOCK_17, 2)
    settings = NriSettings("/run/other/nri.sock", 5.0, 3.0)
    second = plan_enable(first, effective(first, 2), settings, 2).new
    assert second is not None
    assert nri_table(second)["socket_path"] == "/run/other/nri.sock"
    assert nri_table(second)["plugin_request_timeout"] == "3s"
    assert plan_disable(second).new == STOCK_17


def test_disable_keeps_a_value_changed_since_and_says_so() -> None:
    text = STOCK_17.replace("    disable = true\n", "    disable = true  # off on purpose\n")
    new = enable(text, 2)
    assert new is not None
    edited = new.replace(
        'socket_path = "/run/nri/gpushare-test.sock"', 'socket_path = "/run/mine.sock"'
    )
    plan = plan_disable(edited)
    assert plan.new is not None
    table = nri_table(plan.new)
    assert table["socket_path"] == "/run/mine.sock"  # the operator's value stays
    assert table["disable"] is True  # the rest is put back
    assert "    disable = true  # off on purpose\n" in plan.new
    assert MARK not in plan.new
    assert any("kept socket_path" in note for note in plan.notes)
    assert not plan_disable(plan.new).changed


def test_disable_keeps_a_table_it_added_when_the_operator_added_to_it() -> None:
    new = enable(DEBIAN, 2)
    assert new is not None
    edited = new + "  plugin_path = '/opt/mine'\n"
    plan = plan_disable(edited)
    assert plan.new is not None
    assert nri_table(plan.new) == {"plugin_path": "/opt/mine"}
    assert MARK not in plan.new
    assert any("kept the" in note for note in plan.notes)


def test_disable_ignores_a_line_whose_record_is_not_json() -> None:
    text = f"version = 2\n{HEADER}\n  disable = false  # {MARK} not json\n"
    plan = plan_disable(text)
    assert not plan.changed


def test_disable_without_enable_is_no_change() -> None:
    for text in (STOCK_17, STOCK_21, DEBIAN, f'version = 2\nplugins."{NRI}".disable = true\n'):
        plan = plan_disable(text)
        assert not plan.changed and plan.notes


# -- the file ------------------------------------------------------------------


def test_symlinked_config_edits_the_target_and_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    target = real / "config.toml"
    target.write_text(STOCK_17)
    target.chmod(0o664)  # more than the umask lets a new file have
    link = tmp_path / "config.toml"
    link.symlink_to(target)
    file = ConfigFile(str(link))
    assert file.path == target
    text = file.read()
    new = enable(text, 2)
    assert new is not None
    backup = file.replace(file.temp(new))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == new
    assert target.stat().st_mode & 0o777 == 0o664
    assert backup is not None and backup.parent == real and backup.read_text() == STOCK_17
    assert backup.stat().st_mode & 0o777 == 0o664
    assert sorted(p.name for p in real.iterdir()) == sorted(["config.toml", backup.name])


def test_backups_never_overwrite_each_other(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("a\n")
    file = ConfigFile(str(config))
    file.read()
    first = file.backup()
    second = file.backup()
    assert first != second and first.read_text() == second.read_text() == "a\n"
    assert not first.name.endswith(".toml")  # no `imports = ["*.toml"]` picks it up


def test_temp_files_do_not_match_toml_globs(tmp_path: Path) -> None:
    file = ConfigFile(str(tmp_path / "config.toml"))
    temp = file.temp("x = 1\n")
    assert temp.parent == tmp_path and not temp.name.endswith(".toml")
    assert temp.read_text() == "x = 1\n"


def test_an_unwritable_directory_is_an_error_that_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(STOCK_17)
    file = ConfigFile(str(config))
    file.read()

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", refuse)  # root writes anywhere: refuse for it
    with pytest.raises(NoTempFileError, match="Permission denied"):
        file.temp("x = 1\n")
    assert config.read_text() == STOCK_17
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_a_file_changed_while_editing_is_not_overwritten(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(STOCK_17)
    file = ConfigFile(str(config))
    file.read()
    temp = file.temp("version = 2\n")
    config.write_text(STOCK_17 + "# an operator was here\n")
    with pytest.raises(ConfigEditError, match="changed while"):
        file.replace(temp)
    assert config.read_text().endswith("# an operator was here\n")


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigEditError, match="does not exist"):
        ConfigFile(str(tmp_path / "nope" / "config.toml")).read()


def test_a_byte_order_mark_is_named(tmp_path: Path) -> None:
    """containerd 1.7 reads past a BOM, 2.x refuses the file: say so, not 'Empty key'."""
    config = tmp_path / "config.toml"
    config.write_bytes(b"\xef\xbb\xbfversion = 2\n")
    with pytest.raises(ConfigEditError, match="byte order mark"):
        ConfigFile(str(config)).read()


def test_something_other_than_a_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A FIFO would block a read for ever."""
    config = tmp_path / "config.toml"
    os.mkfifo(config)
    with pytest.raises(ConfigEditError, match="not a regular file"):
        ConfigFile(str(config)).read()
    config.unlink()
    config.mkdir()
    with pytest.raises(ConfigEditError, match="not a regular file"):
        ConfigFile(str(config)).read()


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b"version = 2\n# \xff\n")
    with pytest.raises(ConfigEditError, match="UTF-8"):
        ConfigFile(str(config)).read()


@pytest.mark.parametrize(
    "record",
    [
        '{"set": "[", "was": "true"}',
        '{"set": "false", "was": "true\\nevil = 1"}',
        '{"set": "false", "was": "true", "comment": "  # a\\nevil = 1"}',
        '{"set": "false\\n[evil]", "was": "true"}',
        '{"set": 0, "was": "true"}',
        '["false", "true"]',
        # Tampered: a "comment" that is no comment, or holds a bare CR (2.x refuses
        # the file, 1.7 reads on), or a "was" of another type than the key takes.
        '{"set": "false", "was": "true", "comment": " , evil = 1"}',
        '{"set": "false", "was": "true", "comment": "  # a\\r  socket_path = \\"/x\\""}',
        '{"set": "false", "was": "true", "comment": "  # \\u001b[2J"}',
        '{"set": "false", "was": "{evil = 1}"}',
        '{"set": "false", "was": "\'/tmp/evil.sock\'"}',
    ],
)
def test_disable_leaves_a_line_whose_record_enable_did_not_write(record: str) -> None:
    text = f"version = 2\n{HEADER}\n  disable = false  # {MARK} {record}\n"
    plan = plan_disable(text)
    assert not plan.changed
    assert plan.notes


def test_a_tampered_table_record_removes_nothing_but_its_padding() -> None:
    """The table record's "before" (what enable put before the table it
    added) names blank lines and a version line only: never the operator's."""
    text = (
        f'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  keep = 1\n'
        f'{HEADER}  # {MARK} {{"added": "table", "before": "  keep = 1\\n", "set": {{}}}}\n'
    )
    plan = plan_disable(text)
    assert plan.new is not None and "  keep = 1\n" in plan.new


def test_a_full_disk_leaves_no_partial_backup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(STOCK_17)
    file = ConfigFile(str(config))
    file.read()
    temp = file.temp("version = 2\n")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", full)
    with pytest.raises(ConfigEditError, match="No space left"):
        file.replace(temp)
    temp.unlink()
    assert config.read_text() == STOCK_17
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_the_plugins_defaults_and_the_hand_snippet_agree_with_enable() -> None:
    from nri_gpushare.config import Config

    config = Config()
    assert NriSettings() == NriSettings(
        config.socket, config.registration_timeout, config.request_timeout
    )
    snippet = Path(__file__).resolve().parents[2] / "config" / "containerd-nri.toml"
    table = tomllib.loads(snippet.read_text())["plugins"][NRI]
    assert {key: table[key] for key in NriSettings().wanted()} == NriSettings().wanted()


@pytest.mark.parametrize(
    "text",
    [
        f"version = 2\r\n{HEADER}\r\n  disable = true\r\n\r\n[grpc]\r\n  a = 1\r\n",
        "version = 2\r\n[grpc]\r\n  a = 1\r\n",
        "# all defaults\r\n",
    ],
)
def test_crlf_files_keep_crlf(text: str) -> None:
    new, restored = enabled_then_restored(text, 2)
    assert "\n" not in new.replace("\r\n", "")
    assert restored == text


def test_owner_is_kept_on_the_new_file_and_the_backup(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        prereqs.missing("root privileges (to give a file another owner)")
    config = tmp_path / "config.toml"
    config.write_text(STOCK_17)
    os.chown(config, 4321, 4322)
    file = ConfigFile(str(config))
    new = enable(file.read(), 2)
    assert new is not None
    backup = file.replace(file.temp(new))
    assert backup is not None
    for path in (config, backup):
        assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4322), path


def test_a_containerd_without_nri_is_named() -> None:
    dump = {"version": 2, "plugins": {"io.containerd.grpc.v1.cri": {}}}  # containerd 1.6
    with pytest.raises(ConfigEditError, match="NRI came with containerd 1.7"):
        effective_nri(dump, "config.toml")


def test_nri_in_disabled_plugins_is_refused() -> None:
    dump = {"disabled_plugins": [NRI], "plugins": {NRI: {"disable": False}}}
    with pytest.raises(ConfigEditError, match="disabled_plugins"):
        effective_nri(dump, "config.toml")
    assert effective_nri({"plugins": {NRI: {"disable": True}}}, "x") == {"disable": True}


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    """'cannot read it' says which file."""
    config = tmp_path / "config.toml"
    config.write_bytes(b"\xff\n")
    with pytest.raises(ConfigEditError, match=f"^{config}: not UTF-8"):
        ConfigFile(str(config)).read()
