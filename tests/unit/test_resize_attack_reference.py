"""Attacks on how `nri-gpushare resize` names its container and prints it.

1. `Resizer.find` tried ID prefixes before names: an operator who resized a
   container by its name ("db", "cafe", "be": names that are hex) resized,
   silently, whichever other container's ID started with those letters.
   Now a name and an ID prefix that match different containers are refused
   as ambiguous (a whole container ID still wins outright).
2. The CLI printed the container's name unescaped: a hand-started
   container's name is its creator's text (`nerdctl/name` or the
   `io.containerd.container.name` annotation of config.json), so a tenant
   could send terminal escape sequences to the operator's terminal.  Now
   `resize` and `status` escape it (`units.quote`)."""

from nri_gpushare.cli.resize import describe
from nri_gpushare.share.model import ContainerInfo
from tests.fakes import done
from tests.unit.test_resize import P, refused, resize, service


def test_a_name_is_not_taken_for_another_containers_id_prefix():
    svc, _ = service(gpus=1)
    named = ContainerInfo(
        id="f00d" * 16,
        name="db",
        pod_name="p",
        pod_namespace="ns",
        pod_uid="u1",
        pod_annotations={P + "gpu-memory": "1Gi"},
    )
    other = ContainerInfo(
        id="db" + "0" * 62,
        name="web",
        pod_name="q",
        pod_namespace="ns",
        pod_uid="u2",
        pod_annotations={P + "gpu-memory": "1Gi"},
    )
    done(svc.lifecycle.create_container(named))
    done(svc.lifecycle.create_container(other))
    e = refused(svc, "db", memory="2Gi")
    assert e.reason == "invalid" and "names 2 containers" in str(e), str(e)
    assert all(a.shares[0].memory_bytes == 1 << 30 for a in svc.allocations.values())
    assert resize(svc, "ns/p/db", memory="2Gi")[0].name == "db"  # the full name: one
    assert resize(svc, "db" + "0" * 62, memory="2Gi")[0].name == "web"  # a whole ID wins


def test_the_cli_does_not_print_a_tenants_escape_sequences():
    out = describe(
        {
            "container_id": "c1",
            "name": "job\x1b]0;owned\x07\x1b[2J",
            "pod": "",
            "priority": "normal",
            "changed": True,
            "gpus": [{"index": 0, "memory": 1 << 30, "core": 0}],
        }
    )
    assert out.isprintable(), repr(out)


def test_status_does_not_print_a_tenants_escape_sequences(capsys):
    from nri_gpushare.cli.main import _print_status

    _print_status(
        {
            "kmod": {"mode": "optional", "loaded": True, "problem": ""},
            "gpus": [],
            "allocations": [
                {
                    "container_id": "c1",
                    "name": "job\x1b]0;owned\x07\x1b[2J",
                    "pod": "",
                    "origin": "runc",
                    "priority": "normal",
                    "resized": True,
                    "gpus": [{"index": 0, "memory": 1 << 30, "core": 0, "memory_used": 0}],
                }
            ],
        }
    )
    out = capsys.readouterr().out
    assert "\x1b" not in out, repr(out)
