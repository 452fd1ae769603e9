"""runc's command line, read as runc 1.1 and 1.2 read it: the global
options, the subcommand, and a subcommand's options and arguments (options
anywhere, unknown ones tolerated).  Pure; gpushare-runc decides from these
alone whether a call is only passed through.
"""

from __future__ import annotations

# runc's global options (`runc --help`, 1.1 and 1.2), by whether they take a value.
GLOBAL_VALUE = frozenset({"log", "log-format", "root", "criu", "rootless"})
GLOBAL_BOOL = frozenset({"debug", "systemd-cgroup", "help", "h", "version", "v"})
COMMANDS = frozenset(
    {
        "checkpoint",
        "create",
        "delete",
        "events",
        "exec",
        "features",
        "init",
        "kill",
        "list",
        "pause",
        "ps",
        "restore",
        "resume",
        "run",
        "spec",
        "start",
        "state",
        "update",
        "help",
        "h",
    }
)
CREATE_VALUE = frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"})
CREATE_BOOL = frozenset({"no-pivot", "no-new-keyring", "help", "h"})
DELETE_BOOL = frozenset({"force", "f", "help", "h"})
ALIASES = {"b": "bundle", "f": "force", "h": "help", "v": "version"}

# exec (`runc exec --help`, 1.1 and 1.2).
EXEC_VALUE = frozenset(
    {
        "process", "p", "console-socket", "cwd", "env", "e", "user", "u", "additional-gids",
        "g", "process-label", "apparmor", "cap", "c", "preserve-fds", "cgroup", "pid-file",
    }
)  # fmt: skip
EXEC_BOOL = frozenset({"tty", "t", "detach", "d", "no-new-privs", "ignore-paused", "help", "h"})


def _flag(token: str) -> tuple[str, str | None] | None:
    """(name, value after '=' or None) of a Go flag token; None for an argument."""
    if len(token) < 2 or token[0] != "-":
        return None
    name, eq, value = token[2 if token[1] == "-" else 1 :].partition("=")
    return ALIASES.get(name, name), value if eq else None


def parse_globals(args: list[str]) -> tuple[dict[str, str], int]:
    """runc's global options (by long name, the last one given wins) and the
    index in `args` of the subcommand (len(args) when there is none).  An
    option runc 1.1/1.2 does not have takes the next word as its value unless
    that word is a subcommand."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        if args[i] == "--":
            return options, i + 1
        flag = _flag(args[i])
        if flag is None:
            break
        name, value = flag
        if value is None:
            following = args[i + 1] if i + 1 < len(args) else None
            takes_value = name in GLOBAL_VALUE or (
                name not in GLOBAL_BOOL
                and following is not None
                and following not in COMMANDS
                and _flag(following) is None
            )
            if takes_value and following is not None:
                value, i = following, i + 1
            else:
                value = "" if takes_value else "true"
        options[name] = value
        i += 1
    return options, i


def parse_command(
    args: list[str], values: frozenset[str], bools: frozenset[str]
) -> tuple[dict[str, str], list[str]] | None:
    """A subcommand's options (by long name) and arguments, options anywhere
    (runc reorders them before the arguments).  Unknown options (a newer
    runc's) are taken as switches, or, when that leaves more than one
    argument, all as taking the next word: whichever of the two readings
    leaves one argument is the only reading that does.  None when neither
    does (then the container ID is not known)."""
    first = _parse_command(args, values, bools, unknown_takes_value=False)
    if first is None:
        return None
    options, arguments, unknown = first
    if unknown and len(arguments) != 1:
        second = _parse_command(args, values, bools, unknown_takes_value=True)
        if second is None or len(second[1]) != 1:
            return None
        options, arguments, unknown = second
    return options, arguments


def _parse_command(
    args: list[str], values: frozenset[str], bools: frozenset[str], *, unknown_takes_value: bool
) -> tuple[dict[str, str], list[str], bool] | None:
    options: dict[str, str] = {}
    arguments: list[str] = []
    unknown = False
    i = 0
    while i < len(args):
        if args[i] == "--":
            arguments += args[i + 1 :]
            break
        flag = _flag(args[i])
        if flag is None:
            arguments.append(args[i])
            i += 1
            continue
        name, value = flag
        if value is None:
            if name in values:
                if i + 1 >= len(args):
                    return {}, [], False  # runc says what is missing
                value, i = args[i + 1], i + 1
            elif name in bools:
                value = "true"
            else:
                unknown = True
                following = args[i + 1] if i + 1 < len(args) else None
                if unknown_takes_value and following is not None and _flag(following) is None:
                    value, i = following, i + 1
                else:
                    value = "true"
        elif name not in values and name not in bools:
            unknown = True
        options[name] = value
        i += 1
    return options, arguments, unknown
