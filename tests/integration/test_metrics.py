"""Observability on the real test bed: the metrics endpoint of the real plugin
process (metrics.listen), scraped and parsed with prometheus-client's own
parser, against `nri-gpushare status --json` and `gpushare-smi --json` of the
same moment; refusals by reason, the NRI latency histogram; the decision log
line of a refused pod, in text and JSON."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.plugin import ROOT, gpu_inventory
from tests.integration.test_hand_started import NS, bed, ctr_run, name  # noqa: F401 - bed: a fixture
from tests.testbed.cri import GRPCError
from tests.unit.test_decisions import parse_logfmt

GiB = 1 << 30
P = "gpushare.io/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """sample name -> {labels: value}"""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def status_json(plugin: Any, *command: str) -> dict[str, Any]:
    """`nri-gpushare status --json` (or another command), as an operator runs it."""
    argv = command or ("-m", "nri_gpushare.cli.main", "status", "--json")
    run = subprocess.run(
        [sys.executable, *argv, "--config", str(plugin.config_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    document: dict[str, Any] = json.loads(run.stdout)
    return document


def one(samples: dict[frozenset[tuple[str, str]], float], **labels: str) -> float:
    [value] = [v for k, v in samples.items() if set(labels.items()) <= k]
    return value


async def sleeper(cri, name: str, annotations: dict[str, str]) -> tuple[str, str]:
    pod_id = await cri.run_pod(name, annotations=annotations)
    cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"])
    await cri.start(cid)
    return pod_id, cid


async def refused(cri, name: str, annotations: dict[str, str]) -> str:
    """The gpushare message kubectl describe would show."""
    pod_id = await cri.run_pod(name, annotations=annotations)
    with pytest.raises(GRPCError) as info:
        await cri.create_container(pod_id, "main", command=["true"])
    message = info.value.message or ""
    assert "gpushare:" in message, message
    return "gpushare:" + message.split("gpushare:", 1)[1]


def decision_lines(log: str, decision: str) -> list[dict[str, str]]:
    return [
        parse_logfmt(line.split("nri_gpushare.decisions: ", 1)[1])
        for line in log.splitlines()
        if f"nri_gpushare.decisions: decision={decision} " in line
    ]


async def test_metrics_match_status_and_count_refusals_and_events(containerd, start_plugin, cri):
    port = free_port()
    plugin = start_plugin(
        containerd, inventory=gpu_inventory(2, "16Gi"), metrics={"listen": f"127.0.0.1:{port}"}
    )
    before = scrape(port)
    assert one(before["gpushare_scrape_ok"]) == 1
    assert one(before["gpushare_refusals_total"], reason="capacity") == 0
    train_pod, train = await sleeper(
        cri, "m-train", {P + "gpu-memory": "8Gi", P + "gpu-core": "30"}
    )
    _, notebook = await sleeper(
        cri, "m-notebook", {P + "gpu-memory": "4Gi", P + "priority": "high"}
    )
    message = await refused(cri, "m-too-big", {P + "gpu-memory": "20Gi"})
    invalid = await refused(cri, "m-invalid", {P + "gpu-memory": "lots"})

    metrics, status = scrape(port), status_json(plugin)
    assert {dict(k)["version"] for k in metrics["gpushare_plugin_info"]} == {status["version"]}
    assert one(metrics["gpushare_kmod_loaded"]) == 0 and not status["kmod"]["loaded"]
    assert one(metrics["gpushare_kmod_mode"], mode="off") == 1
    assert one(metrics["gpushare_nri_connected"]) == 1
    for gpu in status["gpus"]:
        at = {"gpu": str(gpu["index"]), "uuid": gpu["uuid"]}
        assert one(metrics["gpushare_gpu_memory_total_bytes"], **at) == gpu["memory_total"]
        assert one(metrics["gpushare_gpu_memory_allocated_bytes"], **at) == gpu["memory_allocated"]
        assert one(metrics["gpushare_gpu_core_allocated_percent"], **at) == gpu["core_allocated"]
        assert one(metrics["gpushare_gpu_containers"], **at) == len(gpu["containers"])
    assert status["gpus"][0]["memory_allocated"] == 12 * GiB  # binpack: both on GPU 0
    quota = metrics["gpushare_container_memory_quota_bytes"]
    assert len(quota) == len(status["allocations"]) == 2
    for alloc in status["allocations"]:
        [share] = alloc["gpus"]
        namespace, name = alloc["pod"].split("/")
        at = {"container_id": alloc["container_id"], "pod_namespace": namespace, "pod_name": name}
        at |= {"origin": "nri", "name": "main", "gpu": "0", "uuid": share["uuid"]}
        assert one(quota, **at) == share["memory"]
        target = metrics.get("gpushare_container_compute_target_percent", {})
        if share["compute_target"] is None:
            assert not [k for k in target if ("container_id", alloc["container_id"]) in k]
        else:
            assert one(target, **at) == share["compute_target"]
        high = 1 if alloc["priority"] == "high" else 0
        assert one(metrics["gpushare_container_high_priority"], **at) == high
        # kmod off: memory in use is unknown, so there is no sample (not a 0).
        assert share["memory_used"] is None
        used = metrics.get("gpushare_container_memory_used_bytes", {})
        assert not [k for k in used if ("container_id", alloc["container_id"]) in k]
    assert {a["container_id"] for a in status["allocations"]} == {train, notebook}

    refusals = metrics["gpushare_refusals_total"]
    assert one(refusals, reason="capacity") == 1
    assert one(refusals, reason="invalid_request") == 1
    assert sum(refusals.values()) == 2
    decisions = metrics["gpushare_decisions_total"]
    assert one(decisions, decision="placed") == 2 and one(decisions, decision="refused") == 2
    count = metrics["gpushare_nri_handler_seconds_count"]
    assert one(count, event="create_container") == 4  # two placed, two refused
    assert one(count, event="start_container") == 2
    assert one(metrics["gpushare_nri_handler_seconds_bucket"], event="create_container",
               le="+Inf") == 4  # fmt: skip

    smi = status_json(plugin, "-m", "nri_gpushare.cli.smi", "--json")
    assert smi["schema"] == "gpushare-smi/1"
    assert {c["container_id"] for c in smi["containers"]} == {train, notebook}

    # The log: one refused line per refused pod, with what kubectl describe shows.
    [capacity] = [
        d for d in decision_lines(plugin.log(), "refused") if d["pod"] == "default/m-too-big"
    ]
    assert (capacity["reason"], capacity["message"], capacity["name"]) == (
        "capacity",
        message,
        "main",
    )
    [bad] = [d for d in decision_lines(plugin.log(), "refused") if d["pod"] == "default/m-invalid"]
    assert (bad["reason"], bad["message"]) == ("invalid_request", invalid)
    [placed] = [d for d in decision_lines(plugin.log(), "placed") if d["container"] == train]
    assert placed["pod"] == "default/m-train" and placed["core"] == "30"
    assert placed["gpus"] == f"0({status['gpus'][0]['uuid']})"

    # A pod that goes away: its series vanish, its events are counted.
    handled = dict(metrics["gpushare_nri_handler_seconds_count"])
    await cri.stop_pod(train_pod)
    await cri.remove_pod(train_pod)
    metrics = scrape(port)
    quota = metrics["gpushare_container_memory_quota_bytes"]
    assert [dict(k)["container_id"] for k in quota] == [notebook]
    assert one(metrics["gpushare_decisions_total"], decision="released") == 1
    count = metrics["gpushare_nri_handler_seconds_count"]
    for event in ("stop_container", "remove_container", "stop_pod_sandbox"):
        at = frozenset({("event", event)})
        assert count[at] > handled.get(at, 0), event
    [released] = decision_lines(plugin.log(), "released")
    assert released["container"] == train and released["why"] == "stopped (StopContainer)"


async def test_json_log_has_one_refused_object_with_its_reason(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(1, "8Gi"), log_format="json")
    message = await refused(cri, "j-too-big", {P + "gpu-memory": "9Gi"})
    lines = [line for line in plugin.log().splitlines() if line.strip()]
    documents = [json.loads(line) for line in lines]  # every line is JSON
    assert all({"ts", "level", "logger", "msg"} <= set(d) for d in documents)
    [refusal] = [d for d in documents if d.get("decision") == "refused"]
    assert refusal["pod"] == "default/j-too-big" and refusal["name"] == "main"
    assert (refusal["reason"], refusal["message"], refusal["level"]) == (
        "capacity",
        message,
        "warning",
    )
    assert refusal["msg"] == f"refused container main (pod default/j-too-big): {message}"


async def test_hand_started_decisions_are_logged_once_each(bed, start_plugin):  # noqa: F811
    """gpushare-runc: placed and released (when runc deletes it), and a refusal
    with the message ctr printed, one line each."""
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "8Gi"))
    runtime = plugin.runc_wrapper()
    fits, too_big = name(), name()
    ctr_run(bed, runtime, fits, ["true"], "--rm", "--label", P + "gpu-memory=2Gi")
    done = ctr_run(
        bed, runtime, too_big, ["true"], "--rm", "--label", P + "gpu-memory=12Gi", check=False
    )
    assert done.returncode != 0
    log = plugin.log()
    [placed] = [d for d in decision_lines(log, "placed") if d["container"] == fits]
    [released] = [d for d in decision_lines(log, "released") if d["container"] == fits]
    [refused] = [d for d in decision_lines(log, "refused") if d["container"] == too_big]
    assert placed["origin"] == released["origin"] == refused["origin"] == f"runc:{NS}"
    assert "pod" not in placed and placed["memory"] == "2048Mi"
    # Whichever comes first: runc's delete through the wrapper, or the task's exit event.
    assert released["why"] == "released (runc asked)" or "task exited" in released["why"]
    assert refused["reason"] == "capacity" and refused["message"] in done.stderr, done.stderr
    assert len(decision_lines(log, "placed")) == 1 and len(decision_lines(log, "refused")) == 1


def test_a_metrics_address_in_use_stops_the_daemon_at_start(containerd, start_plugin):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        plugin = start_plugin(containerd, wait=False, metrics={"listen": f"127.0.0.1:{port}"})
        assert plugin.proc is not None
        assert plugin.proc.wait(30) == 2
    assert f"metrics.listen 127.0.0.1:{port}: cannot listen there" in plugin.log()
    assert not Path(plugin.status_socket).exists()
