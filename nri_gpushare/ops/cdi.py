"""`nri-gpushare cdi generate`: write this node's CDI spec (kind
`gpushare.io/gpu`, for nerdctl, docker and podman: `--device
gpushare.io/gpu=<index|uuid|all>`) from the node's config, its GPUs and its
device nodes.  What the spec holds is `nri_gpushare.ops.cdi_spec`'s; see
docs/cdi.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import shutil
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from nri_gpushare.config import Config, ConfigError, load_config
from nri_gpushare.host.devices import (
    PRELOAD_FILE_NAME,
    HostDevices,
    library_problem,
    load_inventory,
)
from nri_gpushare.host.statefile import replace_file
from nri_gpushare.ops.cdi_spec import (
    KIND,
    PROGRAM,
    CdiError,
    build_spec,
    device_names,
    render,
)
from nri_gpushare.share.model import Gpu, InterposerPolicy
from nri_gpushare.share.plan import DeviceLookup

DEFAULT_OUTPUT = "/etc/cdi/gpushare.io-gpu.json"
#: The compiled hooks (front/), installed next to nri-gpushare in its venv.
FRONT = "gpushare-front"
#: The file names a CDI runtime loads from /etc/cdi and /var/run/cdi.
SPEC_SUFFIXES = (".json", ".yaml")


# -- the node's values ----------------------------------------------------------------


def default_hook_path(
    which: Callable[[str], str | None] | None = None, argv0: str | None = None
) -> str | None:
    """The absolute path of the program the hooks run: the compiled front
    (`FRONT`, no Python start per hook) when it is installed next to the
    nri-gpushare program (its venv's bin), else that program.  nri-gpushare
    is found on PATH (`which`, default shutil.which), else it is the running
    one (`argv0`, default sys.argv[0]) when that is an executable file; None
    otherwise (run as `python -m`)."""
    found = (which or shutil.which)(PROGRAM)
    program = os.path.abspath(found) if found else None
    argv0 = sys.argv[0] if argv0 is None else argv0
    if program is None and argv0:
        path = Path(argv0).resolve()
        if path.is_file() and os.access(path, os.X_OK):
            program = str(path)
    if program is None:
        return None
    front = Path(program).resolve().with_name(FRONT)
    if front.is_file() and os.access(front, os.X_OK):
        return str(front)
    return program


def _executable_problem(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if not st.st_mode & 0o111:
        return "is not executable"
    return ""


def _makedirs(directory: str) -> None:
    """Create `directory` and any missing parents, each mode 0755 whatever the
    umask (runtimes, rootless podman too, read the specs)."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if os.path.isdir(path):
                continue
            raise NotADirectoryError(errno.ENOTDIR, f"{path} is not a directory") from None
        os.chmod(path, 0o755)


def write_spec(path: str, text: str) -> None:
    """Replace `path` with `text`, mode 0644, atomically (a temporary file in
    the same directory renamed over it: a runtime reading the directory sees
    the old spec or the new one).  Raises OSError."""
    directory, name = os.path.split(os.path.abspath(path))
    _makedirs(directory)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        replace_file(dir_fd, name, text.encode(), 0o644)
    finally:
        os.close(dir_fd)


# -- the command ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROGRAM} cdi",
        description="The CDI spec of this node's GPUs (kind gpushare.io/gpu), for "
        "nerdctl, docker and podman: --device gpushare.io/gpu=0.  See docs/cdi.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write the CDI spec")
    gen.add_argument("--config", help="the node configuration (default: built-in defaults)")
    gen.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help=f"where to write it, '-' for stdout (default {DEFAULT_OUTPUT})",
    )
    gen.add_argument(
        "--format",
        choices=("json", "yaml"),
        help="default: from the output's suffix (.yaml/.yml: yaml; else json)",
    )
    gen.add_argument(
        "--hook-path",
        help=f"absolute path of the hook program (default: {FRONT} next to {PROGRAM}, "
        f"else {PROGRAM})",
    )
    return parser


def _warn(message: str) -> None:
    print(f"{PROGRAM}: warning: {message}", file=sys.stderr)


def _inventory(config: Config, nvml: Any) -> list[Gpu]:
    """The daemon's rule: NVML when use_nvml and it reports a GPU, else the config's."""
    if config.use_nvml:
        try:
            gpus = load_inventory(config.inventory, nvml)
        except ValueError as e:
            raise CdiError(str(e)) from None
        if not gpus:
            raise CdiError("no GPUs: NVML found none and the config has no `inventory:`")
        return gpus
    if not config.inventory:
        raise CdiError("no GPUs: use_nvml is false and the config has no `inventory:`")
    return sorted(config.inventory, key=lambda g: g.index)


def _interposer(config: Config) -> InterposerPolicy | None:
    """The node's interposer policy, its preload file filled in; None (and a
    warning) when the library is not on the node."""
    policy = config.interposer
    if problem := library_problem(policy.library):
        _warn(
            f"interposer {policy.library} {problem}: the spec has no interposer mounts, so "
            f"containers started through it never get libgpushare.so, even once it is "
            f"installed; install it and generate the spec again"
        )
        return None
    if policy.preload == "ld.so.preload":
        preload_file = os.path.join(config.state_dir, PRELOAD_FILE_NAME)
        policy = dataclasses.replace(policy, preload_file=preload_file)
        try:
            os.stat(preload_file)
        except FileNotFoundError:
            _warn(
                f"{preload_file} does not exist yet: the daemon writes it when it starts, "
                f"and until then containers with a {KIND} device cannot be created "
                f"(the spec mounts it)"
            )
        except OSError:
            pass  # not ours to look at (state_dir is root's, 0700): the daemon's concern
    return policy


def _check_nodes(config: Config, devices: DeviceLookup) -> None:
    """Warn about nodes the host lacks now, which the static spec then lacks for good."""
    if not any(n.path == "/dev/nvidia-uvm" for n in devices.common()):
        _warn(
            "/dev/nvidia-uvm is not on this node, so the spec does not give it: CUDA "
            "programs need it (`nvidia-modprobe -u -c=0` creates it); generate the spec "
            "again once it exists"
        )
    if config.kmod != "off" and devices.control() is None:
        _warn(
            "the kernel module's control device (/dev/gpushare) is not on this node, so "
            "the spec does not give it: the interposer in these containers cannot read "
            "their quotas from the module; load gpushare.ko and generate the spec again"
        )


def generate(
    args: argparse.Namespace,
    devices: DeviceLookup | None = None,
    nvml: Any = None,
) -> int:
    """`cdi generate` with parsed `args`; CdiError when it cannot."""
    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as e:
        raise CdiError(str(e)) from e
    hook_path = args.hook_path or default_hook_path()
    if hook_path is None:
        raise CdiError(f"cannot find the {PROGRAM} program on PATH: pass --hook-path")
    if not os.path.isabs(hook_path):
        raise CdiError(f"--hook-path {hook_path!r} must be an absolute path")
    gpus = _inventory(config, nvml)
    # Errors above, warnings below: an error is the only line said.
    if problem := _executable_problem(hook_path):
        _warn(f"hook program {hook_path} {problem}: containers cannot be created until it is")
    lookup = devices if devices is not None else HostDevices()
    spec = build_spec(gpus, lookup, _interposer(config), hook_path, config.api_socket)
    _check_nodes(config, lookup)
    output: str = args.output
    fmt: Literal["json", "yaml"] = args.format or (
        "yaml" if output.endswith((".yaml", ".yml")) else "json"
    )
    text = render(spec, fmt)
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    if not output.endswith(SPEC_SUFFIXES):
        _warn(f"{output}: runtimes load only *.json and *.yaml files from /etc/cdi")
    try:
        write_spec(output, text)
    except OSError as e:
        raise CdiError(f"cannot write {output}: {e.strerror or e}") from e
    plural = "" if len(gpus) == 1 else "s"
    print(f"wrote {output}: {len(gpus)} GPU{plural}, devices {', '.join(device_names(spec))}")
    return 0


def main(argv: Sequence[str], *, devices: DeviceLookup | None = None, nvml: Any = None) -> int:
    """`nri-gpushare cdi ...`; `devices` and `nvml` replace the host's (tests).
    Exit 2 with one line on stderr when the spec cannot be made or written."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as e:  # --help, or a usage error (argparse said why)
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 2
    try:
        return generate(args, devices, nvml)
    except CdiError as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 2
