"""What `enable` and `disable` change in containerd's config.toml (pure: text
in, text out; containerd's own view of the file comes in as `effective`).

enable writes only the NRI settings whose effective value differs from what
the plugin needs, each line with enable's record of the value it set and the
one it replaced; disable puts back exactly those, and leaves alone a line
whose value was changed since.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nri_gpushare.ops.containerd_nri import (
    NRI_HEADER,
    NRI_PLUGIN,
    ConfigEditError,
    NriSettings,
    same_setting,
)
from nri_gpushare.ops.containerd_toml import (
    enable_mark,
    enable_record,
    key_indent,
    key_item,
    line_end,
    literal_strings,
    nri_table,
    recorded_value,
    set_comment,
    toml_document,
    toml_item,
    toml_text,
    written_by_enable,
)

if TYPE_CHECKING:
    from tomlkit.items import Table
    from tomlkit.toml_document import TOMLDocument

_ADDED_PAD = re.compile(r"(\r?\n){0,2}(version = [23](\r?\n){2})?")
"""What enable puts before a table it adds: line ends, a version line."""


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
        if key in effective and not same_setting(key, effective[key], value)
    }
    plan = Plan(text, text)
    if not differ:
        return plan
    if text is None:
        base, pad, added = "", f"version = {binary_version}\n\n", "file"
        version, eol = binary_version, "\n"
    else:
        doc = toml_document(text)
        version = _config_version(doc, binary_version)
        table = nri_table(doc)
        if table is not None:
            return _edit_table(plan, doc, table, differ, effective)
        base, added, eol = text, "table", line_end(text)
        pad = eol if text and not text.endswith("\n") else ""
        pad += eol if text.strip() else ""
        if version == 0:
            version = binary_version
            pad += f"version = {binary_version}{eol}{eol}"
            plan.changes.append(f"added version = {binary_version} (the file had no keys)")
    values = {key: toml_text(value, literal=False) for key, value in differ.items()}
    lines = [NRI_HEADER + enable_mark({"added": added, "before": pad, "set": values})]
    for key, value_text in values.items():
        lines.append(f"  {key} = {value_text}")
        plan.changes.append(f"{key} = {value_text} (was containerd's default)")
    plan.new = base + pad + eol.join(lines) + eol
    plan.changes.insert(0, f"added the {NRI_HEADER} table")
    nri_table(toml_document(plan.new))  # still one plain table
    return plan


def _edit_table(
    plan: Plan,
    doc: TOMLDocument,
    table: Table,
    differ: Mapping[str, bool | str],
    effective: Mapping[str, object],
) -> Plan:
    literal = literal_strings(table)
    indent = key_indent(table)
    for key, value in differ.items():
        value_text = toml_text(value, literal)
        if key in table:
            current = key_item(table, key)
            if same_setting(key, current.unwrap(), value):
                raise ConfigEditError(
                    f"{key} is already {current.as_string()} in this file, but containerd "
                    f"reads {json.dumps(effective[key])}: a file in `imports` sets it; "
                    "change it there (or remove it there) and run enable again"
                )
            old = enable_record(current)
            if old is not None and same_setting(
                key, current.unwrap(), recorded_value(old.get("set"))
            ):
                record = {"set": value_text, "was": old.get("was")}
                if old.get("comment"):
                    record["comment"] = old["comment"]
            else:
                record = {"set": value_text, "was": current.as_string()}
                if current.trivia.comment and old is None:
                    record["comment"] = current.trivia.comment_ws + current.trivia.comment
                elif old is not None and old.get("comment"):
                    record["comment"] = old["comment"]
            table[key] = toml_item(value_text)
            plan.changes.append(f"{key} = {value_text} (was {current.as_string()})")
        else:
            table.add(key, toml_item(value_text))
            key_item(table, key).trivia.indent = indent
            key_item(table, key).trivia.trail = line_end(doc.as_string())
            record = {"set": value_text, "was": None}
            plan.changes.append(
                f"{key} = {value_text} (added; containerd read {json.dumps(effective[key])})"
            )
        set_comment(key_item(table, key), enable_mark(record))
    plan.new = doc.as_string()
    return plan


def plan_disable(text: str) -> Plan:
    """The edit that puts back what enable's records say was there before."""
    plan = Plan(text, text)
    doc = toml_document(text)
    try:
        table = nri_table(doc)
    except ConfigEditError:
        table = None  # enable never writes those forms: nothing of ours there
    if table is None:
        plan.notes.append(f"no {NRI_HEADER} table: nothing enable changed")
        return plan
    for key in list(table):
        item = key_item(table, key)
        record = enable_record(item)
        if record is None:
            continue
        set_text, was = record.get("set"), record.get("was")
        comment = record.get("comment") or ""
        if not written_by_enable(key, set_text, was, comment):
            plan.notes.append(f"left {key}: its nri-gpushare comment is not one enable wrote")
            continue
        assert isinstance(set_text, str) and isinstance(comment, str)
        current = item.as_string()
        if not same_setting(key, item.unwrap(), recorded_value(set_text)):
            set_comment(item, comment)
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
            table[key] = toml_item(was)
            set_comment(key_item(table, key), comment)
            plan.changes.append(f"{key} = {was} (enable had set {current})")
    header = enable_record(table)
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
        if key not in table or not written_by_enable(key, set_text, None, ""):
            continue
        current = key_item(table, key).as_string()
        if same_setting(key, key_item(table, key).unwrap(), recorded_value(set_text)):
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
