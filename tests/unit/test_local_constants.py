"""`nri_gpushare.local` imports the standard library only (it runs in every
container start), so it carries copies of constants defined elsewhere in the
package.  Each copy is pinned here to its original: a change on one side
fails this test until the other follows."""

from __future__ import annotations

from nri_gpushare import names
from nri_gpushare.config import DEFAULT_API_SOCKET
from nri_gpushare.host.devices import NVIDIA_MAJOR
from nri_gpushare.local import client, hook, oci, runc_wrapper
from nri_gpushare.share.model import Allocation, Gpu, GpuShare, InterposerPolicy
from nri_gpushare.share.plan import injection_plan
from nri_gpushare.share.request import MARKERS
from nri_gpushare.share.request.sources import REQUEST_ENV
from tests.fakes import FakeDevices

UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
OPT_OUT = "CGPU_DISABLE"
"""The request variable that asks for no share: no hint that one is wanted."""


def test_our_keys_are_the_names_of_the_vocabulary() -> None:
    assert runc_wrapper.KEY_PREFIX == names.KEY_PREFIX
    assert runc_wrapper.ASSIGNED == names.ASSIGNED


def test_every_request_variable_is_seen_without_the_daemon() -> None:
    assert OPT_OUT in REQUEST_ENV
    seen = [
        name
        for name in REQUEST_ENV
        if name in runc_wrapper.REQUEST_ENV_NAMES
        or name.startswith(runc_wrapper.REQUEST_ENV_PREFIXES)
    ]
    assert sorted(seen) == sorted(set(REQUEST_ENV) - {OPT_OUT})
    assert set(runc_wrapper.REQUEST_ENV_NAMES) <= set(REQUEST_ENV)
    assert set(runc_wrapper.REQUEST_ENV_NAMES) <= set(MARKERS)
    assert runc_wrapper.REQUEST_ENV_PREFIXES[0] in MARKERS


def test_every_injected_variable_is_given_to_an_exec() -> None:
    """What create writes into config.json is what exec copies from it."""
    alloc = Allocation("c1", "c", "", (GpuShare(0, UUID, 1 << 30, 50),), interposer=True)
    interposer = InterposerPolicy(library="/lib/libgpushare.so", preload="env", allow_managed=True)
    gpu = Gpu(0, UUID, "NVIDIA H100", 80 << 30, 1)
    plan = injection_plan(alloc, {0: gpu}, FakeDevices(), True, interposer, {})
    assert {"LD_PRELOAD", "GPUSHARE_CORE_LIMIT", "GPUSHARE_ALLOW_MANAGED"} <= set(plan.env)
    for name in plan.env:
        assert name in runc_wrapper.INJECTED_ENV or name.startswith(runc_wrapper.INJECTED_PREFIX), (
            name
        )
    assert set(runc_wrapper.INJECTED_ENV) <= set(plan.env)


def test_the_socket_and_the_device_major_are_the_daemons() -> None:
    assert client.DEFAULT_SOCKET == DEFAULT_API_SOCKET
    assert runc_wrapper.SOCKET_ENV == hook.SOCKET_ENV
    assert oci.NVIDIA_MAJOR == NVIDIA_MAJOR
