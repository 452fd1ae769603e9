"""The bad-input suite's inventory: every parser and decoder of input that a
container, a runtime, containerd, the kubelet, the kernel module or a file
on disk can shape, and the property test that covers it.

PARSERS lists them; EXEMPT lists the functions that look like parsers by
name but take no such input directly, each with the reason.  The tests:

- every listed name still exists (a rename must update the table);
- every listed name is referenced, through its module, in a hypothesis
  test module tests/unit/test_fuzz_*.py (read as source with ast: an
  import of it, or an attribute of its imported module or class; a method
  counts when its class is referenced and the method is accessed), so a
  parser nobody fuzzes fails here;
- every public function or method of nri_gpushare named parse*/decode*/
  load*/read*/unpack* is listed or exempt, so a new parser without a
  property test fails here too.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "nri_gpushare"
TESTS = sorted(
    p
    for p in (REPO / "tests" / "unit").glob("test_fuzz_*.py")
    if p.name not in ("test_fuzz_inventory.py", "test_fuzz_common.py")
)
NAME = re.compile(r"^(parse|decode|load|read|unpack)(_|$)")

PARSERS: dict[str, tuple[str, ...]] = {
    # NRI: the runtime's requests (the plugin's socket).
    "nri_gpushare.nri.wire.mux": ("MuxDecoder.feed",),
    "nri_gpushare.nri.wire.ttrpc": (
        "Request.decode",
        "Response.decode",
        "TtrpcConnection.receive_data",
    ),
    "nri_gpushare.nri.wire.pb": ("read_varint", "fields"),
    "nri_gpushare.nri.api.lite": (
        "decode_configure_request",
        "decode_synchronize_request",
        "decode_create_container_request",
        "decode_stop_container_request",
        "decode_pod_container_request",
        "decode_pod_request",
        "decode_update_pod_sandbox_request",
        "decode_update_container_request",
        "decode_validate_adjustment_request",
        "decode_state_change",
        "decode_pod_sandbox",
        "decode_container",
    ),
    # What a container asks for (annotations, labels, env).
    "nri_gpushare.share.request": ("parse_request",),
    "nri_gpushare.units": ("parse_size",),
    # Containers NRI never sees: the local API, OCI state and config.json, runc's argv.
    "nri_gpushare.local.protocol": ("decode_request", "decode_reply"),
    "nri_gpushare.local.oci": (
        "parse_state",
        "load_config",
        "read_config",
        "parse_env",
        "bundle_info",
        "apply_plan",
        "read_pid_file",
        "namespace_of",
        "namespace_from_root",
    ),
    "nri_gpushare.local.runc_wrapper": (
        "parse_globals",
        "parse_command",
        "share_env",
        "share_hints",
    ),
    "nri_gpushare.local.hook": ("parse_args",),
    # Recovery: the state file and its records, the saved kmod-upgrade state.
    "nri_gpushare.host.statefile": ("StateFile.load",),
    "nri_gpushare.share.records": ("decode",),
    "nri_gpushare.share.claims": ("Claims.load",),
    "nri_gpushare.share.claim_model": ("decode_entry",),
    "nri_gpushare.ops.kmod_upgrade_state": ("ModuleState.parse", "load_saved"),
    # The node's config and inventory.
    "nri_gpushare.config": ("parse_config", "load_config", "parse_quantity"),
    # The kernel module's procfs tree, mountinfo, a runtime's cgroup paths.
    "nri_gpushare.kmod.readings": ("parse_meminfo",),
    "nri_gpushare.kmod.cgroup": ("cgroup_v2_path", "cgroup2_mounts", "expand_systemd_slice"),
    "nri_gpushare.kmod.procfs": (
        "ProcfsKernelModule.registrations",
        "ProcfsKernelModule.gpus",
        "ProcfsKernelModule.bindings",
        "ProcfsKernelModule.gpu_state",
        "ProcfsKernelModule.default_memsize",
        "ProcfsKernelModule.meminfo",
        "ProcfsKernelModule.gputime",
        "ProcfsKernelModule.slice_us",
        "ProcfsKernelModule.drain_us",
        "ProcfsKernelModule.forced_ends",
        "ProcfsKernelModule.orphaned_memory",
        "ProcfsKernelModule.upgrading",
    ),
    # The device plugin: the kubelet's IDs, the daemon's status document.
    "nri_gpushare.share.ids": ("parse_ids", "id_number"),
    "nri_gpushare.k8s.plugin": ("read_status",),
    "nri_gpushare.k8s.state": ("PluginState.update",),
    # containerd: events anyone with its socket can publish; its config's durations.
    "nri_gpushare.host.containerd.client": ("decode_envelope",),
    "nri_gpushare.host.containerd.verdicts": ("epoch",),
    "nri_gpushare.ops.containerd_nri": ("parse_go_duration",),
}

EXEMPT: dict[str, str] = {
    "nri_gpushare.nri.api.decode.*": (
        "the same functions as nri_gpushare.nri.api.lite's, listed there"
    ),
    "nri_gpushare.nri.api.views.parse": (
        "generic view parsing, reached through every api.lite decoder"
    ),
    "nri_gpushare.local.hook.read_state": (
        "reads stdin (bounded) and returns oci.parse_state's result"
    ),
    "nri_gpushare.host.devices.load_inventory": (
        "NVML's answers and the config's inventory; no input a"
        " container or a file shapes beyond parse_config's"
    ),
    "nri_gpushare.kmod.abi.unpack_query": "the kernel's answer to our ioctl in buffers we size;"
    " fuzzed against the real module in tests/guest/kmod_guest_fuzz.py",
    "nri_gpushare.kmod.abi.unpack_mem": "as unpack_query",
    "nri_gpushare.kmod.abi.unpack_sched": "as unpack_query",
    "nri_gpushare.ops.kmod_upgrade.Host.read_state": (
        "I/O protocol; the text goes to ModuleState.parse"
    ),
    "nri_gpushare.ops.kmod_upgrade.Host.load": "loads a module (a command, not a parser)",
    "nri_gpushare.ops.kmod_upgrade.SystemHost.read_state": "reads /proc/gpushare/upgrade for"
    " ModuleState.parse",
    "nri_gpushare.ops.kmod_upgrade.SystemHost.load": "loads a module (a command, not a parser)",
    "nri_gpushare.daemon.metrics.parse_listen": "splits metrics.listen, which parse_config checked",
    "nri_gpushare.ops.containerd_config.ConfigFile.read": "reads the operator's containerd config"
    " for `enable` (tomlkit parses it; tests/integration/test_enable.py runs real configs)",
    "nri_gpushare.ops.load_module.load_module": "a CLI command, not a parser",
    "nri_gpushare.share.records.AllocationStore.load": "protocol of StateFile.load",
    "nri_gpushare.share.records.MemoryStore.load": "in-memory store (tests, no state_dir)",
    "nri_gpushare.share.claim_model.ClaimStore.load": "protocol of ClaimFile.load",
    "nri_gpushare.host.statefile.ClaimFile.load": "StateFile.load of another file name",
    "nri_gpushare.share.request.settings.Context.parse_gpus": "reached through parse_request",
    "nri_gpushare.share.request.values.GpuList.parse": "reached through parse_request",
    "nri_gpushare.share.service.ShareService.read_usage": "reads the module through"
    " ProcfsKernelModule's readers",
    "nri_gpushare.share.usage.GpuTimeSource.read": "protocol of ModuleGpuTime.read",
    "nri_gpushare.share.usage.ModuleGpuTime.read": "ProcfsKernelModule.gputime's value",
}


def resolve(module: str, name: str) -> object:
    """The function module.name (a classmethod's function, so that two
    lookups give the same object)."""
    obj: object = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "__func__", obj)


@pytest.mark.parametrize("module", sorted(PARSERS))
def test_listed_parsers_exist(module: str) -> None:
    for name in PARSERS[module]:
        assert callable(resolve(module, name)), f"{module}.{name}"


def references(path: Path) -> tuple[set[str], bool]:
    """The dotted names a test module refers to (aliases resolved to full
    paths; `x.attr` also as `?.attr` for instances), and whether it has
    a hypothesis @given test."""
    tree = ast.parse(path.read_text())
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                alias[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )

    def dotted(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return alias.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else f"?.{node.attr}"
        return None

    found: set[str] = set(alias.values())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name):
            name = dotted(node)
            if name:
                found.add(name)
            if isinstance(node, ast.Attribute):
                found.add(f"?.{node.attr}")
    given = any(
        isinstance(n, ast.FunctionDef)
        and n.name.startswith("test_")
        and any("given" in ast.unparse(d) for d in n.decorator_list)
        for n in ast.walk(tree)
    )
    return found, given


REFERENCES = {p.name: references(p) for p in TESTS}


def covered_by(module: str, name: str) -> list[str]:
    """The fuzz test modules that refer to module.name."""
    full = f"{module}.{name}"
    out = []
    for test, (found, given) in REFERENCES.items():
        if not given:
            continue
        if "." in name:  # Class.method: the class referenced, the method accessed
            cls, method = name.rsplit(".", 1)
            if f"{module}.{cls}" in found and (
                f"{module}.{cls}.{method}" in found or f"?.{method}" in found
            ):
                out.append(test)
        elif full in found:
            out.append(test)
    return out


@pytest.mark.parametrize("module", sorted(PARSERS))
def test_every_parser_has_a_property_test(module: str) -> None:
    missing = [name for name in PARSERS[module] if not covered_by(module, name)]
    assert not missing, (
        f"{module}: {missing} have no property test in tests/unit/test_fuzz_*.py"
        " (a @given test module importing and using them)"
    )


def discovered() -> list[tuple[str, str]]:
    """Public parse*/decode*/load*/read*/unpack* functions and methods of the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "generated" in path.parts:
            continue
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and NAME.match(node.name):
                out.append((module, node.name))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef) and NAME.match(
                        sub.name
                    ):
                        out.append((module, f"{node.name}.{sub.name}"))
    return out


def test_no_parser_is_left_out() -> None:
    listed = [resolve(m, n) for m, names in PARSERS.items() for n in names]
    unlisted = []
    found = discovered()
    assert len(found) > 40, found  # the scan works
    for module, name in found:
        if f"{module}.{name}" in EXEMPT or f"{module}.*" in EXEMPT:
            continue
        if any(resolve(module, name) is f for f in listed):
            continue
        unlisted.append(f"{module}.{name}")
    assert not unlisted, (
        f"parsers with neither a property test listed in PARSERS nor a reason in EXEMPT: {unlisted}"
    )


def test_exemptions_are_current() -> None:
    """An exemption for a function that is gone (or now listed) is stale."""
    found = {f"{m}.{n}" for m, n in discovered()}
    modules = {m for m, _ in discovered()}
    for key in EXEMPT:
        if key.endswith(".*"):
            assert key[:-2] in modules, key
        else:
            assert key in found, key
