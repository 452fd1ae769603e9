"""The tomlkit editing behind `enable` / `disable` (pure): finding the NRI
table, writing values as TOML, and enable's record on each line it writes, a
trailing comment `# nri-gpushare enable: {"set": ..., "was": ...}`.
"""

from __future__ import annotations

import json
import tomllib
from typing import TYPE_CHECKING, Any

from nri_gpushare.ops.containerd_nri import NRI_HEADER, NRI_PLUGIN, ConfigEditError, NriSettings

if TYPE_CHECKING:
    from tomlkit.items import Item, Table
    from tomlkit.toml_document import TOMLDocument

MARK = "nri-gpushare enable:"


def toml_document(text: str) -> TOMLDocument:
    """`text` parsed by tomlkit (comments and layout kept); ConfigEditError if not TOML."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigEditError(f"not valid TOML: {exc}") from None


def nri_table(doc: TOMLDocument) -> Table | None:
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


def toml_text(value: bool | str, literal: bool) -> str:
    """`value` as a TOML value; a string in literal quotes when asked and possible."""
    import tomlkit

    if isinstance(value, bool):
        return "true" if value else "false"
    if literal and "'" not in value and not any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"'{value}'"
    return tomlkit.string(value).as_string()


def toml_item(text: str) -> Item:
    """The tomlkit item a TOML value text parses to."""
    return key_item(toml_document(f"v = {text}\n"), "v")


def toml_value(text: str) -> object:
    """The Python value of a TOML value text; ConfigEditError if it is not one value."""
    try:
        parsed = tomllib.loads(f"v = {text}\n")
    except tomllib.TOMLDecodeError:
        parsed = {}
    if list(parsed) != ["v"] or "\n" in text.strip():
        raise ConfigEditError(f"{text!r} is not one TOML value")
    return parsed["v"]


def key_item(table: Table | TOMLDocument, key: str) -> Item:
    """The item of `key` in `table` (a key, never an out-of-order table)."""
    from tomlkit.items import Item

    item = table.item(key)
    if not isinstance(item, Item):  # an out-of-order table: never a key
        raise ConfigEditError(f"{key} in the NRI table is split over several places")
    return item


def enable_record(item: Item) -> dict[str, Any] | None:
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


def recorded_value(text: object) -> object:
    """The value a record's "set" names; None when the record is not one enable wrote."""
    try:
        return toml_value(text) if isinstance(text, str) else None
    except ConfigEditError:
        return None


def written_by_enable(key: str, set_text: object, was: object, comment: object) -> bool:
    """Whether a line's record is one enable could have written: a key enable
    sets, "set" and "was" one value each of the type that key takes, and
    "comment" a comment.  Anything else (a record edited by hand, or by
    someone who could edit the file) is left alone."""
    if key not in NriSettings().wanted():
        return False
    value = recorded_value(set_text)
    if not isinstance(value, bool | str):
        return False
    if was is not None and type(recorded_value(was)) is not type(value):
        return False
    return isinstance(comment, str) and (not comment or _is_comment(comment))


def _is_comment(text: str) -> bool:
    """Blanks, '#', then printable characters (or tabs) only: one TOML comment."""
    stripped = text.lstrip(" \t")
    return stripped.startswith("#") and all(c == "\t" or c.isprintable() for c in stripped)


def set_comment(item: Item, comment: str) -> None:
    """Replace the trailing comment (`comment` is whitespace + '# ...', or "")."""
    stripped = comment.lstrip()
    item.trivia.comment_ws = comment[: len(comment) - len(stripped)] if stripped else ""
    item.trivia.comment = stripped


def enable_mark(record: dict[str, Any]) -> str:
    """The trailing comment that records what enable did on a line."""
    return f"  # {MARK} " + json.dumps(record, ensure_ascii=True)


def literal_strings(table: Table) -> bool:
    """Write strings as the table's neighbours are written (v3 stock: 'literal')."""
    from tomlkit.items import String, StringType

    for key in table:
        item = key_item(table, key)
        if isinstance(item, String):
            return bool(item.type in (StringType.SLL, StringType.MLL))
    return False


def line_end(text: str) -> str:
    """The file's line ending: CRLF if its lines end so, else LF."""
    return "\r\n" if "\r\n" in text else "\n"


def key_indent(table: Table) -> str:
    """The indentation of the table's keys (its last one's), else the header's + 2."""
    from tomlkit.items import Comment, Whitespace

    indent = None
    for _key, item in table.value.body:
        if _key is not None and not isinstance(item, Comment | Whitespace):
            indent = item.trivia.indent
    if indent is not None:
        return indent
    return table.trivia.indent + "  "
