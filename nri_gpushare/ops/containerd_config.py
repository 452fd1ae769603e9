"""`nri-gpushare enable` / `disable`: turn containerd's NRI on in its
`config.toml` with the plugin's own socket and timeouts, and put back what
was there before.

What to change is decided from containerd's own view of the file (`containerd
--config FILE config dump`): only settings whose effective value differs from
what the plugin needs are written, so a stock containerd 2.x (NRI on by
default) is left alone and a second run changes nothing.  Each line enable
writes carries a trailing comment, kept by tomlkit, with the value it set and
the one it replaced (`# nri-gpushare enable: {"set": "false", "was": "true"}`);
disable puts back exactly those, and leaves alone a line whose value was
changed since.  The record lives in the file it describes, so it cannot go
stale apart from it: a regenerated config.toml loses both.

The editing is pure (`plan_enable`, `plan_disable`: text in, text out); the
rest asks containerd and replaces the file (backup, temp file, fsync, rename).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tomlkit.items import Item, Table
    from tomlkit.toml_document import TOMLDocument

NRI_PLUGIN = "io.containerd.nri.v1.nri"
NRI_HEADER = f'[plugins."{NRI_PLUGIN}"]'
MARK = "nri-gpushare enable:"
DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_PLUGIN_CONFIG = "/etc/nri-gpushare/gpushare.yaml"
RESTART_HINT = "restart containerd to apply it: systemctl restart containerd"
DURATION_KEYS = ("plugin_registration_timeout", "plugin_request_timeout")


class ConfigEditError(Exception):
    """Refused or failed; the message says why and what to do.  Nothing changed."""


class NoTempFileError(ConfigEditError):
    """No temporary file can be written beside the config (its directory)."""


# -- Go durations (containerd writes and reads time.Duration as "5s") ------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def go_duration(seconds: float) -> str:
    """A Go duration string containerd reads: 2 -> "2s", 0.5 -> "500ms"."""
    nanos = round(seconds * 1e9)
    if nanos % 1_000_000_000 == 0:
        return f"{nanos // 1_000_000_000}s"
    if nanos % 1_000_000 == 0:
        return f"{nanos // 1_000_000}ms"
    return f"{nanos}ns"


def parse_go_duration(text: str) -> float | None:
    """Seconds from "1m30s", "1.5s", "500ms", "0s"; None if it is not one."""
    if text in ("0", "+0", "-0"):
        return 0.0
    body = text.lstrip("+")
    parts = _DURATION_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _same(key: str, a: object, b: object) -> bool:
    """Equal as containerd sees them (durations by length, not by spelling)."""
    if key in DURATION_KEYS and isinstance(a, str) and isinstance(b, str):
        da, db = parse_go_duration(a), parse_go_duration(b)
        if da is not None and db is not None:
            return abs(da - db) < 1e-9
    return type(a) is type(b) and a == b


# -- what the plugin needs -------------------------------------------------


@dataclass(frozen=True)
class NriSettings:
    """The NRI settings the plugin's own config implies (nri.socket and the timeouts)."""

    socket_path: str = "/var/run/nri/nri.sock"
    registration_timeout: float = 5.0
    request_timeout: float = 2.0

    def wanted(self) -> dict[str, bool | str]:
        """containerd's NRI keys and the values the plugin needs, in writing order."""
        return {
            "disable": False,
            "disable_connections": False,  # external plugins (us) may connect
            "socket_path": self.socket_path,
            "plugin_registration_timeout": go_duration(self.registration_timeout),
            "plugin_request_timeout": go_duration(self.request_timeout),
        }


def settings_from_plugin_config(path: str | None) -> tuple[NriSettings, str]:
    """The settings from the plugin's YAML; (settings, where they came from).

    The default path may be absent (the plugin's defaults apply, as for
    `nri-gpushare run` without --config); a path given explicitly must exist.
    """
    from nri_gpushare.config import Config, ConfigError, load_config

    explicit = path is not None
    path = path or DEFAULT_PLUGIN_CONFIG
    if not explicit and not os.path.exists(path):
        config, source = Config(), f"the plugin's defaults ({path} does not exist)"
    else:
        try:
            config = load_config(path)
        except ConfigError as exc:
            raise ConfigEditError(f"plugin config: {exc}") from None
        source = path
    if not os.path.isabs(config.socket):
        raise ConfigEditError(f"{source}: nri.socket {config.socket!r} must be an absolute path")
    settings = NriSettings(config.socket, config.registration_timeout, config.request_timeout)
    return settings, source


# -- the pure editing --------------------------------------------------------


@dataclass
class Plan:
    """What an edit does: the new text (None: remove the file) and what it says."""

    old: str | None
    new: str | None
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.new != self.old


def _parse(text: str) -> TOMLDocument:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigEditError(f"not valid TOML: {exc}") from None


def _nri_table(doc: TOMLDocument) -> Table | None:
    """The `[plugins."io.containerd.nri.v1.nri"]` table; None if absent.

    Refuses the forms a comment cannot be kept in or a key not added to
    safely: inline tables, dotted keys, an array of tables.
    """
    from tomlkit.container import OutOfOrderTableProxy
    from tomlkit.items import AoT, InlineTable, Table

    plugins = doc.get("plugins")
    if plugins is None:
        return None
    if isinstance(plugins, InlineTable):
        raise ConfigEditError(
            "`plugins` is an inline table (plugins = { ... }); enable edits a "
            f'{NRI_HEADER} table: write plugins as [plugins."..."] tables and run it again'
        )
    if not isinstance(plugins, Table | OutOfOrderTableProxy):
        raise ConfigEditError("`plugins` is not a table")
    nri = plugins.get(NRI_PLUGIN)
    if nri is None:
        return None
    if isinstance(nri, Table) and not nri.is_super_table():
        return nri
    form = "an inline table" if isinstance(nri, InlineTable) else "dotted keys or sub-tables"
    if isinstance(nri, AoT):
        form = "an array of tables"
    elif not isinstance(nri, Table | InlineTable):
        form = "a table split over several places (its sub-table after another table)"
    raise ConfigEditError(
        f"the NRI settings are written as {form}; enable edits a {NRI_HEADER} table: "
        "move them into one (header on its own line, one key per line) and run it again"
    )


def _toml_text(value: bool | str, literal: bool) -> str:
    """`value` as a TOML value; a string in literal quotes when asked and possible."""
    import tomlkit

    if isinstance(value, bool):
        return "true" if value else "false"
    if literal and "'" not in value and not any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"'{value}'"
    return tomlkit.string(value).as_string()


def _item(text: str) -> Item:
    """The tomlkit item a TOML value text parses to."""
    return _key_item(_parse(f"v = {text}\n"), "v")


def _plain(text: str) -> object:
    """The Python value of a TOML value text; ConfigEditError if it is not one value."""
    try:
        parsed = tomllib.loads(f"v = {text}\n")
    except tomllib.TOMLDecodeError:
        parsed = {}
    if list(parsed) != ["v"] or "\n" in text.strip():
        raise ConfigEditError(f"{text!r} is not one TOML value")
    return parsed["v"]


def _key_item(table: Table | TOMLDocument, key: str) -> Item:
    from tomlkit.items import Item

    item = table.item(key)
    if not isinstance(item, Item):  # an out-of-order table: never a key
        raise ConfigEditError(f"{key} in the NRI table is split over several places")
    return item


def _record(item: Item) -> dict[str, Any] | None:
    """enable's record on a line ({"set": ..., "was": ..., "comment": ...}), or None."""
    comment = item.trivia.comment.lstrip("#").strip()
    if not comment.startswith(MARK):
        return None
    try:
        record = json.loads(comment[len(MARK) :])
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    return record


def _recorded(text: object) -> object:
    """The value a record's "set" names; None when the record is not one enable wrote."""
    try:
        return _plain(text) if isinstance(text, str) else None
    except ConfigEditError:
        return None


def _disable_may_write(key: str, set_text: object, was: object, comment: object) -> bool:
    """Whether a line's record is one enable could have written: a key enable
    sets, "set" and "was" one value each of the type that key takes, and
    "comment" a comment.  Anything else (a record edited by hand, or by
    someone who could edit the file) is left alone."""
    if key not in NriSettings().wanted():
        return False
    value = _recorded(set_text)
    if not isinstance(value, bool | str):
        return False
    if was is not None and type(_recorded(was)) is not type(value):
        return False
    return isinstance(comment, str) and (not comment or _is_comment(comment))


def _is_comment(text: str) -> bool:
    """Blanks, '#', then printable characters (or tabs) only: one TOML comment."""
    stripped = text.lstrip(" \t")
    return stripped.startswith("#") and all(c == "\t" or c.isprintable() for c in stripped)


_ADDED_PAD = re.compile(r"(\r?\n){0,2}(version = [23](\r?\n){2})?")
"""What enable puts before a table it adds: line ends, a version line."""


def _set_comment(item: Item, comment: str) -> None:
    """Replace the trailing comment (`comment` is whitespace + '# ...', or "")."""
    stripped = comment.lstrip()
    item.trivia.comment_ws = comment[: len(comment) - len(stripped)] if stripped else ""
    item.trivia.comment = stripped


def _mark(record: dict[str, Any]) -> str:
    return f"  # {MARK} " + json.dumps(record, ensure_ascii=True)


def _literal_strings(table: Table) -> bool:
    """Write strings as the table's neighbours are written (v3 stock: 'literal')."""
    from tomlkit.items import String, StringType

    for key in table:
        item = _key_item(table, key)
        if isinstance(item, String):
            return bool(item.type in (StringType.SLL, StringType.MLL))
    return False


def _config_version(doc: TOMLDocument, binary_version: int) -> int:
    version = doc.get("version")
    if version in (2, 3):
        return int(version)
    if version is None and all(key is None for key, _ in doc.body):
        return 0  # no keys at all: the same in every version
    if version is None or version == 1:
        if binary_version >= 3:
            how = (
                "convert it once with `containerd --config FILE config migrate > NEW`, "
                "check NEW, move it in place"
            )
        else:
            how = (
                "add `version = 2` at the top and give plugins their full names ([plugins.cri] "
                'becomes [plugins."io.containerd.grpc.v1.cri"], ...), or start from '
                "`containerd config default`"
            )
        raise ConfigEditError(
            "this is a version 1 config (no `version = 2` or `3`), where plugin names differ; "
            f"enable edits version 2 and 3 configs only: {how}, and run enable again"
        )
    raise ConfigEditError(f"version = {version!r}: enable knows config versions 2 and 3 only")


def plan_enable(
    text: str | None,
    effective: Mapping[str, object],
    settings: NriSettings,
    binary_version: int,
) -> Plan:
    """The edit that makes containerd's NRI settings what the plugin needs.

    `text` is the config file (None: it does not exist); `effective` is
    containerd's NRI section as `config dump` shows it for that file;
    `binary_version` is the config version the containerd binary writes (2 for
    1.7, 3 for 2.x).  Only settings whose effective value differs are written.
    """
    wanted = settings.wanted()
    differ = {
        key: value
        for key, value in wanted.items()
        if key in effective and not _same(key, effective[key], value)
    }
    plan = Plan(text, text)
    if not differ:
        return plan
    if text is None:
        base, pad, added = "", f"version = {binary_version}\n\n", "file"
        version, eol = binary_version, "\n"
    else:
        doc = _parse(text)
        version = _config_version(doc, binary_version)
        table = _nri_table(doc)
        if table is not None:
            return _edit_table(plan, doc, table, differ, effective)
        base, added, eol = text, "table", _line_end(text)
        pad = eol if text and not text.endswith("\n") else ""
        pad += eol if text.strip() else ""
        if version == 0:
            version = binary_version
            pad += f"version = {binary_version}{eol}{eol}"
            plan.changes.append(f"added version = {binary_version} (the file had no keys)")
    values = {key: _toml_text(value, literal=False) for key, value in differ.items()}
    lines = [NRI_HEADER + _mark({"added": added, "before": pad, "set": values})]
    for key, value_text in values.items():
        lines.append(f"  {key} = {value_text}")
        plan.changes.append(f"{key} = {value_text} (was containerd's default)")
    plan.new = base + pad + eol.join(lines) + eol
    plan.changes.insert(0, f"added the {NRI_HEADER} table")
    _nri_table(_parse(plan.new))  # still one plain table
    return plan


def _edit_table(
    plan: Plan,
    doc: TOMLDocument,
    table: Table,
    differ: Mapping[str, bool | str],
    effective: Mapping[str, object],
) -> Plan:
    literal = _literal_strings(table)
    indent = _key_indent(table)
    for key, value in differ.items():
        value_text = _toml_text(value, literal)
        if key in table:
            current = _key_item(table, key)
            if _same(key, current.unwrap(), value):
                raise ConfigEditError(
                    f"{key} is already {current.as_string()} in this file, but containerd "
                    f"reads {json.dumps(effective[key])}: a file in `imports` sets it; "
                    "change it there (or remove it there) and run enable again"
                )
            old = _record(current)
            if old is not None and _same(key, current.unwrap(), _recorded(old.get("set"))):
                record = {"set": value_text, "was": old.get("was")}
                if old.get("comment"):
                    record["comment"] = old["comment"]
            else:
                record = {"set": value_text, "was": current.as_string()}
                if current.trivia.comment and old is None:
                    record["comment"] = current.trivia.comment_ws + current.trivia.comment
                elif old is not None and old.get("comment"):
                    record["comment"] = old["comment"]
            table[key] = _item(value_text)
            plan.changes.append(f"{key} = {value_text} (was {current.as_string()})")
        else:
            table.add(key, _item(value_text))
            _key_item(table, key).trivia.indent = indent
            _key_item(table, key).trivia.trail = _line_end(doc.as_string())
            record = {"set": value_text, "was": None}
            plan.changes.append(
                f"{key} = {value_text} (added; containerd read {json.dumps(effective[key])})"
            )
        _set_comment(_key_item(table, key), _mark(record))
    plan.new = doc.as_string()
    return plan


def _line_end(text: str) -> str:
    """The file's line ending: CRLF if its lines end so, else LF."""
    return "\r\n" if "\r\n" in text else "\n"


def _key_indent(table: Table) -> str:
    """The indentation of the table's keys (its last one's), else the header's + 2."""
    from tomlkit.items import Comment, Whitespace

    indent = None
    for _key, item in table.value.body:
        if _key is not None and not isinstance(item, Comment | Whitespace):
            indent = item.trivia.indent
    if indent is not None:
        return indent
    return table.trivia.indent + "  "


def plan_disable(text: str) -> Plan:
    """The edit that puts back what enable's records say was there before."""
    plan = Plan(text, text)
    doc = _parse(text)
    try:
        table = _nri_table(doc)
    except ConfigEditError:
        table = None  # enable never writes those forms: nothing of ours there
    if table is None:
        plan.notes.append(f"no {NRI_HEADER} table: nothing enable changed")
        return plan
    for key in list(table):
        item = _key_item(table, key)
        record = _record(item)
        if record is None:
            continue
        set_text, was = record.get("set"), record.get("was")
        comment = record.get("comment") or ""
        if not _disable_may_write(key, set_text, was, comment):
            plan.notes.append(f"left {key}: its nri-gpushare comment is not one enable wrote")
            continue
        assert isinstance(set_text, str) and isinstance(comment, str)
        current = item.as_string()
        if not _same(key, item.unwrap(), _recorded(set_text)):
            _set_comment(item, comment)
            plan.notes.append(
                f"kept {key} = {current}: changed since enable set {set_text} "
                f"(before enable: {was if was is not None else 'absent'}); "
                "only enable's comment was removed"
            )
            continue
        if was is None:
            del table[key]
            plan.changes.append(f"removed {key} = {current} (enable added it)")
        else:
            table[key] = _item(was)
            _set_comment(_key_item(table, key), comment)
            plan.changes.append(f"{key} = {was} (enable had set {current})")
    header = _record(table)
    if header is not None:
        _remove_added_keys(plan, table, header.get("set"))
        _remove_added_table(plan, doc, table, header)
    plan.new = doc.as_string()
    if header is not None and header.get("added") in ("file", "table"):
        plan.new = _strip_pad(plan, doc, header)
    if not plan.changes and not plan.notes:
        plan.notes.append("no line enable changed")
    return plan


def _remove_added_keys(plan: Plan, table: Table, added: object) -> None:
    """The keys of a table enable added, where they still hold what it set."""
    if not isinstance(added, dict):
        return
    for key, set_text in added.items():
        if key not in table or not _disable_may_write(key, set_text, None, ""):
            continue
        current = _key_item(table, key).as_string()
        if _same(key, _key_item(table, key).unwrap(), _recorded(set_text)):
            del table[key]
            plan.changes.append(f"removed {key} = {current} (enable added it)")
        else:
            plan.notes.append(f"kept {key} = {current}: changed since enable set {set_text}")


def _remove_added_table(
    plan: Plan, doc: TOMLDocument, table: Table, header: dict[str, Any]
) -> None:
    from tomlkit.items import Null, Table, Whitespace

    if any(not isinstance(item, Whitespace | Null) for _key, item in table.value.body):
        table.trivia.comment = table.trivia.comment_ws = ""
        header["added"] = None
        plan.notes.append(f"kept the {NRI_HEADER} table enable added: it has other lines now")
        return
    del doc["plugins"][NRI_PLUGIN]
    plugins = doc["plugins"]
    if not plugins and isinstance(plugins, Table) and plugins.is_super_table():
        del doc["plugins"]
    plan.changes.append(f"removed the {NRI_HEADER} table (enable added it)")


def _strip_pad(plan: Plan, doc: TOMLDocument, header: dict[str, Any]) -> str | None:
    """Take off what enable put before the table it added; None: remove the file."""
    text = doc.as_string()
    pad = header.get("before")
    if isinstance(pad, str) and pad and _ADDED_PAD.fullmatch(pad) and text.endswith(pad):
        text = text[: len(text) - len(pad)]
    if header.get("added") == "file" and text == "":
        plan.changes.append("removed the file (enable created it)")
        return None
    return text


# -- containerd ----------------------------------------------------------------


@dataclass(frozen=True)
class ContainerdBinary:
    path: str
    version: str  # "1.7.24~ds1"
    major: int

    @property
    def config_version(self) -> int:
        """The config version this containerd writes: 2 (1.x) or 3 (2.x)."""
        return 2 if self.major < 2 else 3

    @classmethod
    def find(cls, name: str) -> ContainerdBinary:
        path = shutil.which(name)
        if path is None:
            where = "on PATH" if os.sep not in name else "there"
            raise ConfigEditError(
                f"containerd binary {name!r} not found {where}: enable asks containerd to "
                "parse the result; pass --containerd /path/to/containerd"
            )
        out = _run([path, "--version"], f"{path} --version")
        match = re.search(r"\sv?(\d+)\.(\d+)\S*", out)
        if match is None:
            raise ConfigEditError(f"{path} --version: cannot read a version in {out.strip()!r}")
        return cls(path, match.group(0).strip(), int(match.group(1)))

    def dump(self, config: Path, label: str = "") -> dict[str, Any]:
        """containerd's effective config for `config` (imports merged, defaults filled in)."""
        out = _run(
            [self.path, "--config", str(config), "config", "dump"],
            f"containerd {self.version} cannot parse {label or config}",
        )
        try:
            return tomllib.loads(out)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigEditError(f"cannot read `containerd config dump`: {exc}") from None


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigEditError(f"{what}: {exc}") from None
    if done.returncode != 0:
        err = "\n".join(line for line in done.stderr.strip().splitlines()[-5:])
        raise ConfigEditError(f"{what}:\n{err or f'exit status {done.returncode}'}")
    return done.stdout


def effective_nri(dump: Mapping[str, Any], where: str) -> dict[str, Any]:
    disabled = dump.get("disabled_plugins") or []
    if NRI_PLUGIN in disabled:
        raise ConfigEditError(
            f"{where}: disabled_plugins lists {NRI_PLUGIN!r}: remove it from there "
            "(that turns the NRI plugin off whatever its own table says) and run enable again"
        )
    section = (dump.get("plugins") or {}).get(NRI_PLUGIN)
    if not isinstance(section, dict):
        raise ConfigEditError(
            f"{where}: containerd shows no {NRI_PLUGIN} plugin settings: NRI came with "
            "containerd 1.7; install containerd 1.7 or later (or pass --containerd with it)"
        )
    return section


# -- files -------------------------------------------------------------------


class ConfigFile:
    """The config file: read it, validate a new text beside it, replace it safely."""

    def __init__(self, path: str) -> None:
        self.given = Path(path)
        self.path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
        self.data: bytes | None = None

    def read(self) -> str | None:
        """The file's text; None if it does not exist.  ConfigEditError naming it."""
        try:
            return self._read()
        except ConfigEditError as exc:
            raise ConfigEditError(f"{self.path}: {exc}") from None

    def _read(self) -> str | None:
        try:
            if not stat.S_ISREG(self.path.stat().st_mode):  # a FIFO would block the read
                raise ConfigEditError("not a regular file")
            self.data = self.path.read_bytes()
        except FileNotFoundError:
            if self.path.parent.is_dir():
                return None
            raise ConfigEditError(
                f"{self.path.parent} does not exist: is containerd installed? "
                "(create the directory to have enable write a new config there)"
            ) from None
        except OSError as exc:
            raise ConfigEditError(f"cannot read it: {exc.strerror}") from None
        if self.data.startswith(b"\xef\xbb\xbf"):
            raise ConfigEditError(
                "it starts with a UTF-8 byte order mark, which containerd 2.x refuses to "
                f"parse: remove it (sed -i '1s/^\\xEF\\xBB\\xBF//' {self.path}) and run again"
            )
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigEditError("not UTF-8 text") from None

    @property
    def imports_from(self) -> Path:
        """Where containerd resolves the config's relative `imports`: beside
        the path it is given (a link's directory, not its target's)."""
        return self.given.parent

    def temp(self, text: str, directory: Path | None = None) -> Path:
        """`text` in a hidden file beside the config (or in `directory`).

        The name does not end in .toml, so no `imports` glob picks it up.
        """
        directory = directory or self.path.parent
        try:
            fd, name = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".nri-gpushare.tmp", dir=directory
            )
        except OSError as exc:
            raise NoTempFileError(
                f"cannot write a temporary file in {directory}: {exc.strerror}"
            ) from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            os.unlink(name)
            raise ConfigEditError(f"cannot write {name}: {exc.strerror}") from None
        return Path(name)

    def backup(self) -> Path:
        """Copy the current file beside it, timestamped, with its mode and owner."""
        assert self.data is not None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        st = self.path.stat()
        for n in range(100):
            suffix = f".nri-gpushare-{stamp}" + (f".{n}" if n else "") + ".bak"
            target = self.path.with_name(self.path.name + suffix)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, st.st_mode & 0o7777)
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigEditError(f"cannot write the backup {target}: {exc.strerror}") from None
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(self.data)
                    out.flush()
                    os.fchmod(out.fileno(), st.st_mode & 0o7777)
                    _chown(out.fileno(), st.st_uid, st.st_gid)
                    os.fsync(out.fileno())
            except OSError as exc:  # a full disk: no partial backup stays
                target.unlink(missing_ok=True)
                raise ConfigEditError(f"cannot write the backup {target}: {exc.strerror}") from None
            return target
        raise ConfigEditError("too many backups this second")

    def replace(self, temp: Path) -> Path | None:
        """Move `temp` over the file (backup first); returns the backup."""
        self._unchanged_since_read()
        backup = None
        if self.data is not None:
            backup = self.backup()
            st = self.path.stat()
            os.chmod(temp, st.st_mode & 0o7777)
            _chown_path(temp, st.st_uid, st.st_gid)
        else:
            os.chmod(temp, 0o644)
        os.replace(temp, self.path)
        _fsync_dir(self.path.parent)
        return backup

    def remove(self) -> Path:
        self._unchanged_since_read()
        backup = self.backup()
        self.path.unlink()
        _fsync_dir(self.path.parent)
        return backup

    def _unchanged_since_read(self) -> None:
        try:
            now: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            now = None
        if now != self.data:
            raise ConfigEditError("it changed while enable was editing it; run it again")


def _chown(fd: int, uid: int, gid: int) -> None:
    try:
        os.fchown(fd, uid, gid)
    except PermissionError:
        pass  # not root: the file is ours anyway


def _chown_path(path: Path, uid: int, gid: int) -> None:
    try:
        os.chown(path, uid, gid)
    except PermissionError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- the commands ------------------------------------------------------------


def _diff(plan: Plan, path: Path) -> str:
    old = (plan.old or "").splitlines(keepends=True)
    new = (plan.new or "").splitlines(keepends=True)
    lines = difflib.unified_diff(old, new, f"{path}", f"{path} (new)")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _validated(
    binary: ContainerdBinary, file: ConfigFile, plan: Plan, settings: NriSettings | None
) -> tuple[Path | None, dict[str, Any]]:
    """Write the new text beside the file and have containerd parse it: the
    temp file (None: the file goes) and containerd's NRI settings after."""
    text = plan.new if plan.new is not None else ""
    temp = file.temp(text)
    check = temp  # parsed where containerd resolves the imports (a link's directory)
    try:
        if os.path.realpath(file.imports_from) != os.path.realpath(temp.parent):
            check = file.temp(text, file.imports_from)
        try:
            dump = binary.dump(check, f"the edited {file.path} (in {check})")
        finally:
            if check != temp:
                check.unlink(missing_ok=True)
        nri = effective_nri(dump, "the new file")
        if settings is not None:
            wrong = [
                f"{key} = {json.dumps(nri.get(key))}"
                for key, value in settings.wanted().items()
                if key in nri and not _same(key, nri[key], value)
            ]
            if wrong:
                own = os.path.abspath(check)
                imports = [str(i) for i in dump.get("imports") or [] if str(i) != own]
                raise ConfigEditError(
                    "after the edit containerd still reads "
                    + ", ".join(wrong)
                    + ": a file in `imports` sets it ("
                    + (", ".join(imports) or "none listed")
                    + "); change it there and run enable again"
                )
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if plan.new is None:
        temp.unlink()
        return None, nri
    return temp, nri


def _describe(nri: Mapping[str, Any]) -> str:
    if nri.get("disable"):
        return "NRI off"
    return (
        f"NRI on, socket {nri.get('socket_path')}, registration timeout "
        f"{nri.get('plugin_registration_timeout')}, request timeout "
        f"{nri.get('plugin_request_timeout')}"
        + (
            ", external plugins refused (disable_connections)"
            if nri.get("disable_connections")
            else ""
        )
    )


def _apply(
    binary: ContainerdBinary,
    file: ConfigFile,
    plan: Plan,
    args: argparse.Namespace,
    settings: NriSettings | None,
    verb: str,
    unchanged: str = "",
) -> int:
    path = file.path
    if file.given != file.path:
        print(f"{file.given} is a link to {path}: editing {path}")
    if not plan.changed:
        print(f"{path}: no change: " + "; ".join(plan.notes or [unchanged]))
        return 0
    try:
        temp, nri = _validated(binary, file, plan, settings)
    except NoTempFileError as exc:
        if not args.dry_run:
            raise
        sys.stdout.write(_diff(plan, path))
        print(f"dry run, not checked with containerd ({exc}); nothing was changed")
        return 0
    try:
        if args.dry_run:
            sys.stdout.write(_diff(plan, path))
            print(
                f"dry run: containerd {binary.version} parses the result ({_describe(nri)}); "
                "nothing was changed"
            )
            return 0
        backup = file.replace(temp) if temp is not None else file.remove()
    finally:
        if temp is not None:
            temp.unlink(missing_ok=True)
    print(f"{path}: {verb}:")
    for line in plan.changes:
        print(f"  {line}")
    for line in plan.notes:
        print(f"  note: {line}")
    print(f"containerd {binary.version} parses the new file: {_describe(nri)}")
    print(f"backup: {backup}" if backup else "(there was no file before: no backup)")
    print(f"Next: {RESTART_HINT}")
    return 0


def _enable(args: argparse.Namespace) -> int:
    settings, source = settings_from_plugin_config(args.plugin_config)
    binary = ContainerdBinary.find(args.containerd)
    file = ConfigFile(args.config)
    text = file.read()
    if text is not None:
        effective = effective_nri(binary.dump(file.given), str(file.given))
    else:
        base = file.temp(f"version = {binary.config_version}\n", file.imports_from)
        try:
            effective = effective_nri(binary.dump(base), "containerd's defaults")
        finally:
            base.unlink()
    print(
        f"NRI settings from {source}: socket {settings.socket_path}, "
        f"registration timeout {go_duration(settings.registration_timeout)}, "
        f"request timeout {go_duration(settings.request_timeout)}"
    )
    try:
        plan = plan_enable(text, effective, settings, binary.config_version)
    except ConfigEditError as exc:
        raise ConfigEditError(f"{file.path}: {exc}") from None
    return _apply(
        binary,
        file,
        plan,
        args,
        settings,
        "NRI enabled for nri-gpushare",
        "NRI is already on with these settings (as containerd reads this file)",
    )


def _disable(args: argparse.Namespace) -> int:
    binary = ContainerdBinary.find(args.containerd)
    file = ConfigFile(args.config)
    text = file.read()
    if text is None:
        print(f"{file.path}: no change: the file does not exist")
        return 0
    binary.dump(file.given)  # containerd must parse it now, as after
    try:
        plan = plan_disable(text)
    except ConfigEditError as exc:
        raise ConfigEditError(f"{file.path}: {exc}") from None
    return _apply(binary, file, plan, args, None, "NRI settings before enable restored")


def _main(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = func(args)
        except ConfigEditError as exc:
            print(f"nri-gpushare {args.command}: {exc}\nNothing was changed.", file=sys.stderr)
            return 1
        return code

    return run


def register(subparsers: Any) -> None:
    for name, func, text in (
        ("enable", _enable, "turn NRI on in containerd's config.toml with the plugin's settings"),
        ("disable", _disable, "put back the NRI settings enable changed in config.toml"),
    ):
        sub = subparsers.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--config",
            default=DEFAULT_CONFIG,
            help=f"containerd's config (default {DEFAULT_CONFIG})",
        )
        sub.add_argument(
            "--containerd",
            default="containerd",
            help="the containerd binary that parses the result (default: containerd on PATH)",
        )
        sub.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
        if name == "enable":
            sub.add_argument(
                "--plugin-config",
                default=None,
                help=f"the plugin's config, for nri.socket and its timeouts "
                f"(default {DEFAULT_PLUGIN_CONFIG}, its defaults if absent)",
            )
        sub.set_defaults(func=_main(func))
