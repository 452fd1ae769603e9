"""deploy/ and deploy/dra/: every manifest is valid against the Kubernetes
schemas (kubernetes-validate, strict: unknown fields are errors) and the
pieces agree with each other and with the code: the ConfigMap is a config the
daemon takes, the RBAC grants what events.py (and the DRA variant's what
dra/kubeapi.py) uses, the paths the DaemonSets and their scripts name are the
ones the image, the node installer, the config and the DRA plugin use, and
the DRA example's claim fits the request policies the driver publishes."""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from nri_gpushare.config import Config, parse_config
from nri_gpushare.k8s import endpoint, events
from nri_gpushare.k8s.dra import DRIVER, kubeapi
from nri_gpushare.k8s.dra.slices import SliceGpu, node_slice
from nri_gpushare.names import MEMORY
from tests.prereqs import missing

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DRA = DEPLOY / "dra"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
DRA_MANIFESTS = sorted(p for p in DRA.glob("*.yaml") if p.name != "kustomization.yaml")
NEWEST = ".".join(kubernetes_validate.latest_version().split(".")[:2])
DRA_VERSIONS = tuple(dict.fromkeys(("1.34", "1.37", NEWEST)))
"""DRA's resource.k8s.io/v1 is GA from 1.34, and the newest schemas installed."""
VERSIONS = tuple(dict.fromkeys(("1.29",) + DRA_VERSIONS))
"""The oldest Kubernetes we claim, DRA's and the newest the installed schemas know."""
NAMESPACE = "gpushare-system"
SRC = "/opt/nri-gpushare/src"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for p in MANIFESTS
        for d in documents(p)
        if d["kind"] == kind and name in (None, d["metadata"]["name"])
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def container(pod: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in pod["initContainers" if init else "containers"] if c["name"] == name
    ]
    assert len(found) == 1, name
    return found[0]


def daemonset_pod() -> dict[str, Any]:
    spec: dict[str, Any] = find("DaemonSet", "nri-gpushare")["spec"]["template"]["spec"]
    return spec


def node_config() -> Config:
    text = find("ConfigMap", "nri-gpushare-config")["data"]["gpushare.yaml"]
    return parse_config(yaml.safe_load(text), "deploy/configmap.yaml")


def shell_settings(path: Path) -> dict[str, str]:
    """NAME=value lines at the top level of a script, with $NAME expanded."""
    values: dict[str, str] = {}
    for name, value in re.findall(r"^([A-Z_]+)=(\S+)", path.read_text(), re.M):
        value = re.sub(r"^\$\{[A-Z_]+:-(.*)\}$", r"\1", value)  # ${VAR:-default}
        for known, resolved in values.items():
            value = value.replace(f"${known}", resolved)
        values[name] = value
    return values


def validate(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


# -- the schemas -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "version"),
    [(p, v) for p in MANIFESTS for v in VERSIONS]
    + [(p, v) for p in DRA_MANIFESTS for v in DRA_VERSIONS],
    ids=lambda v: str(v.relative_to(DEPLOY)) if isinstance(v, Path) else v,
)
def test_every_manifest_is_valid(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} has no documents"
    for doc in docs:
        validate(doc, version)


def broken_daemonsets() -> list[tuple[str, dict[str, Any]]]:
    good = find("DaemonSet")
    cases: list[tuple[str, dict[str, Any]]] = []
    for what in ("unknown field", "wrong type", "missing required", "bad enum"):
        doc = copy.deepcopy(good)
        pod = doc["spec"]["template"]["spec"]
        if what == "unknown field":
            container(pod, "credentials")["volumeMount"] = []
        elif what == "wrong type":
            pod["hostPID"] = "yes"
        elif what == "missing required":
            del container(pod, "device-plugin")["name"]
        else:
            pod["volumes"][1]["hostPath"]["type"] = 7
        cases.append((what, doc))
    return cases


@pytest.mark.parametrize(("what", "doc"), broken_daemonsets(), ids=lambda v: str(v)[:20])
def test_a_broken_manifest_is_refused(what: str, doc: dict[str, Any]) -> None:
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(doc, VERSIONS[-1])


@pytest.mark.parametrize(
    "path", MANIFESTS + DRA_MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY))
)
def test_every_kind_is_checked_strictly(path: Path) -> None:
    """Each document's kind has a schema that is really applied: a field its
    kind does not have fails (no kind passes by having no schema)."""
    for doc in documents(path):
        bad = copy.deepcopy(doc)
        bad["metadata"]["annotationz"] = {"a": "b"}
        with pytest.raises(kubernetes_validate.ValidationError, match="annotationz"):
            validate(bad, VERSIONS[-1])
        bad = copy.deepcopy(doc)
        bad["kind"] = bad["kind"] + "X"
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            validate(bad, VERSIONS[-1])


def test_everything_is_in_one_namespace() -> None:
    for path in MANIFESTS:
        for doc in documents(path):
            if doc["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
                continue
            assert doc["metadata"]["namespace"] == NAMESPACE, f"{path.name}: {doc['kind']}"
    namespace = find("Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_kustomization_lists_the_manifests() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == NAMESPACE
    wanted = {p.name for p in MANIFESTS} - {"uninstall-job.yaml"}
    assert set(kustomization["resources"]) == wanted
    [image] = kustomization["images"]
    images = {c["image"].split(":")[0] for c in all_containers()}
    assert images == {image["name"]}


def all_containers() -> list[dict[str, Any]]:
    pod = daemonset_pod()
    job = find("Job")["spec"]["template"]["spec"]
    found: list[dict[str, Any]] = pod["initContainers"] + pod["containers"] + job["containers"]
    return found


# -- the config --------------------------------------------------------------


def test_configmap_is_a_kubernetes_node_config() -> None:
    config = node_config()
    assert config.kubernetes_events is True
    assert config.pod_sources.annotations is False, "shares must come through limits"
    assert config.pod_sources.kubelet is True
    assert config.kmod == "required" and config.kmod_load is True
    assert config.use_nvml is True and config.inventory == ()


# -- RBAC --------------------------------------------------------------------


def test_rbac_grants_exactly_what_events_posts() -> None:
    role = find("ClusterRole", "nri-gpushare")
    granted = [
        (group, resource, tuple(rule["verbs"]))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    ]
    assert tuple(granted) == events.RBAC_RULES
    binding = find("ClusterRoleBinding", "nri-gpushare")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = find("ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert daemonset_pod()["serviceAccountName"] == account["metadata"]["name"]


# -- the DaemonSet and its scripts --------------------------------------------


def test_the_pod_reaches_the_nodes_namespaces() -> None:
    pod = daemonset_pod()
    assert pod["hostPID"] is True  # nsenter --target 1
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"gpushare.io/enabled": "true"}
    install = container(pod, "install", init=True)
    assert install["securityContext"]["privileged"] is True
    on_node = "nsenter --target 1 --mount --uts --ipc --net --pid --"
    for script in ("node-install.sh", "node-uninstall.sh"):
        assert f'on_node() {{ {on_node} "$@"; }}' in (DEPLOY / script).read_text()


def test_init_container_mounts_what_its_script_writes() -> None:
    pod = daemonset_pod()
    install = container(pod, "install", init=True)
    assert install["command"] == ["sh", f"{SRC}/deploy/node-install.sh"]
    script = shell_settings(DEPLOY / "node-install.sh")
    installer = shell_settings(REPO / "scripts" / "install-node.sh")
    assert script["CONFIG"] == installer["CONFIG"] == "/etc/nri-gpushare/gpushare.yaml"
    assert script["VENV"] == installer["VENV"]
    assert script["SRC"].startswith(installer["PREFIX"] + "/")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in install["volumeMounts"]}
    # The ConfigMap, where the script reads it.
    config_mount = str(Path(script["CONFIG_IN"]).parent)
    config_volume = volumes[mounts[config_mount]]
    assert config_volume["configMap"]["name"] == "nri-gpushare-config"
    # The node's directories, at $HOST + their path.
    for wanted in (installer["PREFIX"], installer["ETC"]):
        volume = volumes[mounts[script["HOST"] + wanted]]
        assert volume["hostPath"]["path"] == wanted


def test_device_plugin_runs_the_installed_daemons_version_on_the_node() -> None:
    """The device plugin runs in the node's mount namespace: the venv the
    init container installed, the node's NVML, the config the daemon reads,
    the kubelet's device-plugin directory and the daemon's status socket as
    they are on the node."""
    config = node_config()
    pod = daemonset_pod()
    plugin = container(pod, "device-plugin")
    venv = shell_settings(REPO / "scripts" / "install-node.sh")["VENV"]
    config_path = shell_settings(DEPLOY / "node-install.sh")["CONFIG"]
    assert plugin["command"] == ["nsenter", "--target=1", "--mount", "--"] + [
        f"{venv}/bin/nri-gpushare",
        "device-plugin",
        "--config",
        config_path,
    ]
    assert plugin["securityContext"]["privileged"] is True
    probe = plugin["livenessProbe"]["exec"]["command"]
    socket = f"{config.device_plugin_dir}/{endpoint(MEMORY)}"
    assert probe == ["nsenter", "--target=1", "--mount", "--", "test", "-S", socket]
    assert "volumeMounts" not in plugin  # the node's own paths, through nsenter


def test_credentials_go_where_the_daemon_reads_them() -> None:
    config = node_config()
    pod = daemonset_pod()
    creds = container(pod, "credentials")
    argv = creds["command"]
    assert argv[:4] == [
        "/opt/nri-gpushare/venv/bin/python",
        "-m",
        events.__name__,
        "sync-credentials",
    ]
    assert argv[argv.index("--to") + 1] == events.HOST_DIR
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in creds["volumeMounts"]}
    assert set(mounts) == {"host-credentials", "api-token"}
    # The node's credentials directory only, at the same path inside: not the
    # daemon's status socket beside it.
    host_path = volumes["host-credentials"]["hostPath"]["path"]
    assert mounts["host-credentials"]["mountPath"] == host_path == events.HOST_DIR
    assert str(Path(host_path).parent) == str(Path(config.status_socket).parent)
    # The token: this container's alone, where events.py reads a pod's.
    assert pod["automountServiceAccountToken"] is False
    token = mounts["api-token"]
    assert token["mountPath"] == events.SERVICE_ACCOUNT_DIR and token["readOnly"] is True
    sources = volumes["api-token"]["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}} in sources
    assert {
        "configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    } in sources
    for other in pod["initContainers"] + pod["containers"]:
        if other["name"] != "credentials":
            assert "api-token" not in {m["name"] for m in other.get("volumeMounts", [])}
    env = {e["name"]: e for e in creds["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "privileged" not in creds["securityContext"]
    assert creds["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert creds["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert creds["securityContext"]["allowPrivilegeEscalation"] is False


def test_uninstall_job_runs_the_installers_uninstall_on_one_node() -> None:
    job = find("Job", "nri-gpushare-uninstall")
    pod = job["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["nodeName"]
    [uninstall] = pod["containers"]
    assert uninstall["command"] == ["sh", f"{SRC}/deploy/node-uninstall.sh"]
    assert uninstall["securityContext"]["privileged"] is True
    text = (DEPLOY / "node-uninstall.sh").read_text()
    assert 'on_node sh "$SRC/scripts/install-node.sh" --uninstall' in text
    assert job["spec"]["backoffLimit"] == 0  # a refusal is an answer, not a retry


def dockerfile_copies() -> dict[str, str]:
    """destination -> source of the Dockerfile's COPY lines."""
    copies: dict[str, str] = {}
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            *sources, dest = shlex.split(line)[1:]
            for source in sources:
                target = dest + source if dest.endswith("/") else dest
                copies[target.rstrip("/")] = source
    return copies


def test_image_carries_what_the_scripts_run() -> None:
    copies = dockerfile_copies()
    for dest, source in copies.items():
        assert (REPO / source).exists(), f"Dockerfile copies {source}, which is not in the repo"
        assert dest == f"{SRC}/{source}", "the image's tree is the repository's layout"
    # Everything install-node.sh reads from its tree.
    installer = (REPO / "scripts" / "install-node.sh").read_text()
    used = set(re.findall(r'"\$src/([A-Za-z_.-]+)', installer))
    used |= {"pyproject.toml", "README.md", "LICENSE", "nri_gpushare"}  # its tar of the package
    assert used <= {dest.removeprefix(f"{SRC}/") for dest in copies}
    # Every path under the tree a manifest runs is in the repository.
    for c in all_containers():
        for arg in c["command"]:
            if arg.startswith(SRC + "/"):
                assert (REPO / arg.removeprefix(SRC + "/")).is_file(), arg
    venv = shell_settings(REPO / "scripts" / "install-node.sh")["VENV"]
    assert f"python3 -m venv {venv}" in (DEPLOY / "Dockerfile").read_text()


@pytest.mark.parametrize("script", ["node-install.sh", "node-uninstall.sh"])
def test_scripts_pass_shellcheck(script: str) -> None:
    if shutil.which("shellcheck") is None:
        missing("shellcheck is needed to check deploy/*.sh")
    done = subprocess.run(
        ["shellcheck", "-s", "sh", str(DEPLOY / script)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout


# -- the scripts, run against a fake node ----------------------------------------

FAKE_NSENTER = """#!/bin/sh
# Logs the node-side command and answers as a node would ($FAKE_* say how).
while [ "$1" != "--" ]; do shift; done
shift
echo "$*" >>"$FAKE_LOG"
case $1 in
test) case $3 in
	*/device-plugins/*) [ -n "$FAKE_PLUGIN" ] ;;
	*/plugins_registry/*) [ -n "$FAKE_DRA" ] ;;
	*) [ -n "$FAKE_SOCKETS" ] ;;
	esac ;;
sh)
	case $2 in
	-c) n=$(grep -c sha256sum "$FAKE_LOG"); [ -n "$FAKE_CHANGED" ] && echo "sum-$n" || echo sum ;;
	*) [ -z "$FAKE_REFUSE" ] || { echo "refusing to unload gpushare: 1 container"; exit 1; } ;;
	esac ;;
*) exit 0 ;;
esac
"""


def run_on_fake_node(
    tmp_path: Path, script: str, config: str = "", **fake: str
) -> tuple[subprocess.CompletedProcess[str], list[str], Path]:
    """Run deploy/<script> as its container would, with the image's tree at
    /opt/nri-gpushare (a private tmpfs, in a user and mount namespace), this
    venv as the image's, and a fake nsenter that logs what would run on the
    node.  Returns the run, the node commands and the fake node's root."""
    if shutil.which("unshare") is None:
        missing("unshare (util-linux) is needed to run deploy's scripts")
    bin_dir, host, log = tmp_path / "bin", tmp_path / "host", tmp_path / "node.log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    host.mkdir(exist_ok=True)
    log.write_text("")
    (bin_dir / "nsenter").write_text(FAKE_NSENTER)
    (bin_dir / "nsenter").chmod(0o755)
    config_in = tmp_path / "gpushare.yaml"
    config_in.write_text(config or find("ConfigMap")["data"]["gpushare.yaml"])
    image = tmp_path / "image"
    for part in ("deploy", "scripts"):
        shutil.copytree(REPO / part, image / "src" / part, dirs_exist_ok=True)
    venv = Path(sys.prefix)
    inner = (
        f"mount -t tmpfs none /opt && mkdir -p /opt/nri-gpushare"
        f" && cp -a {image}/src /opt/nri-gpushare/src"
        f" && ln -s {venv} /opt/nri-gpushare/venv"
        f" && exec sh /opt/nri-gpushare/src/deploy/{script}"
    )
    env = {
        "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOST_ROOT": str(host),
        "CONFIG_IN": str(config_in),
        "WAIT_SECONDS": "1",
        "FAKE_LOG": str(log),
        "FAKE_SOCKETS": "",
        "FAKE_CHANGED": "",
        "FAKE_REFUSE": "",
        "FAKE_PLUGIN": "",
        "FAKE_DRA": "",
    } | fake
    unshare = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner]
    done = subprocess.run(unshare, env=env, capture_output=True, text=True, timeout=60)
    if "unshare:" in done.stderr and done.returncode != 0 and not log.read_text():
        missing(f"cannot make a user and mount namespace: {done.stderr.strip()}")
    return done, log.read_text().splitlines(), host


PLUGIN_SOCKET = "/var/lib/kubelet/device-plugins/gpushare-gpu-memory.sock"
DRA_SOCKET = "/var/lib/kubelet/plugins_registry/gpushare.io-reg.sock"
ENABLE = (
    "/opt/nri-gpushare/venv/bin/nri-gpushare enable --config /etc/containerd/config.toml"
    " --plugin-config /etc/nri-gpushare/gpushare.yaml"
)


def test_install_leaves_containerd_alone_when_enable_changed_nothing(tmp_path: Path) -> None:
    done, node, host = run_on_fake_node(tmp_path, "node-install.sh", FAKE_SOCKETS="1")
    assert done.returncode == 0, done.stderr
    assert [c for c in node if not c.startswith(("sh -c", "hostname"))] == [
        "sh /opt/nri-gpushare/src/scripts/install-node.sh",
        ENABLE,
        "test -S /var/run/nri/nri.sock",
        "chmod 0750 /run/nri-gpushare",
        "systemctl enable --now nri-gpushare.service",
        "test -S /run/nri-gpushare/status.sock",
    ]
    assert (host / "etc/nri-gpushare/gpushare.yaml").read_text() == (
        find("ConfigMap")["data"]["gpushare.yaml"]
    )
    assert (host / "opt/nri-gpushare/src/scripts/install-node.sh").is_file()
    assert not list((host / "opt/nri-gpushare").glob("src.*"))  # no .new / .old left


def test_a_pod_restart_with_the_same_image_installs_nothing_again(tmp_path: Path) -> None:
    install = "sh /opt/nri-gpushare/src/scripts/install-node.sh"
    done, node, host = run_on_fake_node(tmp_path, "node-install.sh", FAKE_SOCKETS="1")
    assert done.returncode == 0 and install in node
    stamp = host / "opt/nri-gpushare/src/.installed-by-daemonset"
    assert stamp.read_text().strip()
    done, node, _ = run_on_fake_node(tmp_path, "node-install.sh", FAKE_SOCKETS="1")
    assert done.returncode == 0, done.stderr
    assert install not in node and "systemctl try-restart nri-gpushare.service" not in node
    assert "install-node.sh is skipped" in done.stdout
    # A new config restarts the daemon, still without installing.
    changed = find("ConfigMap")["data"]["gpushare.yaml"].replace("max_inst: 16", "max_inst: 8")
    done, node, host = run_on_fake_node(tmp_path, "node-install.sh", changed, FAKE_SOCKETS="1")
    assert done.returncode == 0, done.stderr
    assert install not in node and "systemctl try-restart nri-gpushare.service" in node
    assert "max_inst: 8" in (host / "etc/nri-gpushare/gpushare.yaml").read_text()
    # Other install-node.sh arguments, or a changed tree: installed again.
    done, node, _ = run_on_fake_node(
        tmp_path, "node-install.sh", changed, FAKE_SOCKETS="1", INSTALL_ARGS="--no-kmod"
    )
    assert install + " --no-kmod" in node
    (tmp_path / "image/src/scripts/new-file").write_text("x")
    done, node, _ = run_on_fake_node(
        tmp_path, "node-install.sh", changed, FAKE_SOCKETS="1", INSTALL_ARGS="--no-kmod"
    )
    assert install + " --no-kmod" in node
    assert (host / "opt/nri-gpushare/src/scripts/new-file").exists()


def test_install_restarts_containerd_when_its_config_changed(tmp_path: Path) -> None:
    done, node, _ = run_on_fake_node(
        tmp_path, "node-install.sh", FAKE_SOCKETS="1", FAKE_CHANGED="1"
    )
    assert done.returncode == 0, done.stderr
    assert node[node.index(ENABLE) + 2] == "systemctl restart containerd"
    assert node.count("systemctl restart containerd") == 1


def test_install_restarts_containerd_without_an_nri_socket(tmp_path: Path) -> None:
    done, node, _ = run_on_fake_node(tmp_path, "node-install.sh")
    assert "systemctl restart containerd" in node
    # ... and, the daemon's socket never appearing, fails showing its journal.
    assert done.returncode == 1
    assert "did not come up within 1s" in done.stderr
    assert "journalctl --no-pager -n 30 -u nri-gpushare.service" in node


def test_an_empty_containerd_config_leaves_containerd_to_the_operator(tmp_path: Path) -> None:
    """k3s/RKE2: their containerd config is generated and their containerd is
    no containerd.service; NRI's socket must be there, and nothing restarts."""
    done, node, _ = run_on_fake_node(
        tmp_path, "node-install.sh", FAKE_SOCKETS="1", FAKE_CHANGED="1", CONTAINERD_CONFIG=""
    )
    assert done.returncode == 0, done.stderr
    assert not [c for c in node if "nri-gpushare enable" in c or "restart containerd" in c]
    assert "test -S /var/run/nri/nri.sock" in node
    assert "systemctl enable --now nri-gpushare.service" in node
    done, node, _ = run_on_fake_node(tmp_path / "no-nri", "node-install.sh", CONTAINERD_CONFIG="")
    assert done.returncode == 1
    assert "no NRI socket at /var/run/nri/nri.sock" in done.stderr
    assert "config.toml.tmpl" in done.stderr
    assert not [c for c in node if "systemctl" in c]


def test_install_refuses_a_bad_configmap_before_touching_the_node(tmp_path: Path) -> None:
    bad = find("ConfigMap")["data"]["gpushare.yaml"] + "max_inst: 99\n"
    done, node, host = run_on_fake_node(tmp_path, "node-install.sh", bad, FAKE_SOCKETS="1")
    assert done.returncode == 1
    assert "the ConfigMap's gpushare.yaml" in done.stderr and "max_inst" in done.stderr
    assert node == [] and list(host.iterdir()) == []


def test_uninstall_removes_the_tree_only_after_the_installer_agreed(tmp_path: Path) -> None:
    done, node, _ = run_on_fake_node(tmp_path, "node-uninstall.sh", FAKE_SOCKETS="1")
    assert done.returncode == 0, done.stderr
    uninstall = "sh /opt/nri-gpushare/src/scripts/install-node.sh --uninstall"
    assert node[:5] == [
        f"test -S {PLUGIN_SOCKET}",
        f"test -S {DRA_SOCKET}",
        "test -f /opt/nri-gpushare/src/scripts/install-node.sh",
        uninstall,
        "rm -rf /opt/nri-gpushare/src /run/nri-gpushare/kubernetes",
    ]
    done, node, _ = run_on_fake_node(
        tmp_path / "refused", "node-uninstall.sh", FAKE_SOCKETS="1", FAKE_REFUSE="1"
    )
    assert done.returncode == 1
    assert "nothing was removed" in done.stderr and "drain" in done.stderr
    assert node == [
        f"test -S {PLUGIN_SOCKET}",
        f"test -S {DRA_SOCKET}",
        "test -f /opt/nri-gpushare/src/scripts/install-node.sh",
        uninstall,
    ]
    done, node, _ = run_on_fake_node(
        tmp_path / "purge", "node-uninstall.sh", FAKE_SOCKETS="1", PURGE="1"
    )
    assert node[3] == uninstall + " --purge"


def test_uninstall_refuses_while_the_daemonset_runs_on_the_node(tmp_path: Path) -> None:
    """Its device plugin would keep advertising from a removed venv, and its
    pod install everything again: nothing is touched."""
    config = node_config()
    assert PLUGIN_SOCKET == f"{config.device_plugin_dir}/{endpoint(MEMORY)}"
    done, node, host = run_on_fake_node(
        tmp_path, "node-uninstall.sh", FAKE_SOCKETS="1", FAKE_PLUGIN="1"
    )
    assert done.returncode == 1
    assert "the DaemonSet still runs on this node" in done.stderr
    assert "gpushare.io/enabled-" in done.stderr and "Nothing was removed" in done.stderr
    assert node == [f"test -S {PLUGIN_SOCKET}"]
    assert list(host.iterdir()) == []
    from nri_gpushare.k8s.dra import kubelet

    assert DRA_SOCKET == f"{kubelet.REGISTRY_DIR}/{DRIVER}-reg.sock"
    done, node, host = run_on_fake_node(
        tmp_path / "dra", "node-uninstall.sh", FAKE_SOCKETS="1", FAKE_DRA="1"
    )
    assert done.returncode == 1 and "Nothing was removed" in done.stderr
    assert node == [f"test -S {PLUGIN_SOCKET}", f"test -S {DRA_SOCKET}"]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether BuildKit leaves `path` (relative, '/'-separated) out of the
    context: a pattern matching the path or one of its parent directories."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, c) for c in candidates):
            ignored = not negate
    return ignored


def test_the_build_context_keeps_what_the_node_installer_builds() -> None:
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    needed = [
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "scripts/install-node.sh",
        "systemd/nri-gpushare.service",
        "docs/install.md",
        "config/gpushare.yaml",
        "deploy/node-install.sh",
        "deploy/node-uninstall.sh",
        "kmod/Kbuild",
        "kmod/Makefile",
        "kmod/COPYING",
        "kmod/dkms.conf",
        "libgpushare/Makefile",
    ]
    for pattern in ("kmod/*.[ch]", "kmod/include/**/*", "libgpushare/src/*", "nri_gpushare/**/*"):
        needed += [
            str(p.relative_to(REPO))
            for p in REPO.glob(pattern)
            if p.is_file()
            and "__pycache__" not in p.parts
            and "build" not in p.parts  # the native scanner's test binaries
            and not p.name.endswith((".pyc", ".mod.c", ".so"))  # build output, kbuild's included
        ]
    assert len(needed) > 50
    kept_out = [p for p in needed if dockerignored(p, patterns)]
    assert kept_out == []
    for junk in (".git/config", ".venv/bin/python", "kmod/gpushare.ko", "kmod/gs_core.o"):
        assert dockerignored(junk, patterns), junk
    assert not dockerignored("kmod/gs_core.c", ["**/*.o"]) and dockerignored("a/b.o", ["**/*.o"])


# -- the DRA variant (deploy/dra) ------------------------------------------------


def dra_find(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for p in DRA_MANIFESTS
        for d in documents(p)
        if d["kind"] == kind and name in (None, d["metadata"]["name"])
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def dra_pod() -> dict[str, Any]:
    spec: dict[str, Any] = dra_find("DaemonSet", "nri-gpushare")["spec"]["template"]["spec"]
    return spec


def test_dra_kustomization_is_deploys_with_the_dra_pieces() -> None:
    kustomization = yaml.safe_load((DRA / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {p.name for p in DRA_MANIFESTS} - {"example.yaml"}
    assert "namespace" not in kustomization  # it would namespace the DeviceClass
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["images"] == base["images"]
    for copied in ("namespace.yaml", "configmap.yaml"):
        assert (DRA / copied).read_text() == (DEPLOY / copied).read_text(), copied
    for path in DRA_MANIFESTS:
        for doc in documents(path):
            if doc["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass"):
                assert "namespace" not in doc["metadata"]
            elif path.name != "example.yaml":  # the user's namespace
                assert doc["metadata"]["namespace"] == NAMESPACE, f"{path.name}: {doc['kind']}"


def test_dra_rbac_covers_the_driver_and_the_events() -> None:
    role = dra_find("ClusterRole", "nri-gpushare")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    used = {(g, r, v) for g, r, verbs in events.RBAC_RULES + kubeapi.RBAC_RULES for v in verbs}
    assert used <= granted
    # Besides: the watches and gets a driver may add, and its Node; nothing else.
    more = {
        ("resource.k8s.io", resource, verb)
        for resource in ("resourceslices", "resourceclaims")
        for verb in ("get", "list", "watch")
    }
    assert granted == used | more | {("", "nodes", "get")}
    binding = dra_find("ClusterRoleBinding", "nri-gpushare")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = dra_find("ServiceAccount")
    assert account == find("ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nri-gpushare", "namespace": NAMESPACE}
    ]
    assert dra_pod()["serviceAccountName"] == account["metadata"]["name"]


def test_dra_daemonset_is_deploys_with_dra_driver_for_device_plugin() -> None:
    base, dra = copy.deepcopy(daemonset_pod()), copy.deepcopy(dra_pod())
    plugin = container(base, "device-plugin")
    driver = container(dra, "dra-driver")
    base["containers"] = [c for c in base["containers"] if c["name"] != "device-plugin"]
    dra["containers"] = [c for c in dra["containers"] if c["name"] != "dra-driver"]
    assert dra == base
    whole_base, whole_dra = find("DaemonSet"), dra_find("DaemonSet")
    assert whole_dra["metadata"] == whole_base["metadata"]  # one replaces the other in place
    assert whole_dra["spec"]["selector"] == whole_base["spec"]["selector"]
    # dra-driver runs as the device plugin does: the node's nri-gpushare in the
    # node's mount namespace, with the daemon's config; the credentials the
    # "credentials" container keeps on the node (not the pod's token paths).
    venv = shell_settings(REPO / "scripts" / "install-node.sh")["VENV"]
    enter = ["nsenter", "--target=1", "--mount", "--"]
    assert plugin["command"][: len(enter)] == enter
    assert driver["command"] == enter + [
        "env",
        "-u",
        "KUBERNETES_SERVICE_HOST",
        f"{venv}/bin/nri-gpushare",
        "dra-driver",
        "--config",
        plugin["command"][-1],
        "--node-name",
        "$(NODE_NAME)",
    ]
    env = {e["name"]: e for e in driver["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "volumeMounts" not in driver
    credentials = container(dra_pod(), "credentials")
    assert events.HOST_DIR in credentials["command"]
    from nri_gpushare.k8s.dra import kubelet

    probe = driver["livenessProbe"]["exec"]["command"]
    assert probe == enter + ["test", "-S", f"{kubelet.REGISTRY_DIR}/{DRIVER}-reg.sock"]
    assert driver["securityContext"] == plugin["securityContext"]


def test_the_device_class_selects_this_driver() -> None:
    device_class = dra_find("DeviceClass")
    assert device_class["metadata"]["name"] == DRIVER
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    ]


def test_the_example_claim_fits_the_published_request_policies() -> None:
    from tests.k8s.dra_scheduler import allocate

    template = dra_find("ResourceClaimTemplate", "gpu-2gi-30")
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == dra_find("DeviceClass")["metadata"]["name"]
    gpu = SliceGpu(0, "GPU-0", "H100", 80 << 30, "580.65.06")
    published = node_slice("node-a", [gpu], memory_reserve_bytes=0, max_inst=4, generation=1)
    claim = {"metadata": {"namespace": "n", "name": "c"}, "spec": template["spec"]["spec"]}
    assert allocate(claim, [published], [], ("pod", "uid")) == ""
    [result] = claim["status"]["allocation"]["devices"]["results"]
    # Nothing rounded: the claim gets what it asks for.
    assert result["consumedCapacity"] == request["exactly"]["capacity"]["requests"] | {"slots": "1"}
    assert result["consumedCapacity"] == {"memory": "2Gi", "compute": "30", "slots": "1"}
    pod = dra_find("Pod")["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpu-2gi-30"}]
    assert [c["resources"]["claims"] for c in pod["containers"]] == [[{"name": "gpu"}]]
