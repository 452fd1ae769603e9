"""A share asked for through CDI devices: placed on exactly the GPUs the
devices give, and what the CDI path cannot do without the kernel module."""

from __future__ import annotations

import dataclasses

from nri_gpushare.share.model import ShareRefused
from nri_gpushare.share.request import ShareRequest


def on_given_gpus(req: ShareRequest, gpus: tuple[int, ...], who: str) -> ShareRequest:
    """`req` placed on exactly `gpus` (the CDI devices the container was given)."""
    named = ", ".join(str(i) for i in gpus)
    if req.devices is not None and sorted(req.devices) != sorted(gpus):
        raise ShareRefused(
            f"gpushare: cannot create {who}: its CDI devices give it GPU(s) {named}, but "
            f"{req.keys.get('devices', 'gpu-devices')} asks for GPU(s) "
            f"{', '.join(str(i) for i in req.devices)}; ask for the same GPUs in both",
            "conflict",
            req.keys.get("devices"),
        )
    if req.count != len(gpus):
        raise ShareRefused(
            f"gpushare: cannot create {who}: its CDI devices give it {len(gpus)} GPU(s) "
            f"({named}) but it asks for a share of {req.count}; ask for "
            f"gpushare.io/gpu-count={len(gpus)} or request {req.count} device(s) "
            f"(one CDI device: a GPU's index or UUID, or all)",
            "conflict",
            req.keys.get("count"),
        )
    return dataclasses.replace(req, devices=gpus)


def cdi_needs_module(who: str, problem: str) -> str:
    return (
        f"gpushare: cannot create {who}: a share with isolation full|memory through a CDI "
        f"device is enforced by the gpushare kernel module (the CDI hook cannot put the "
        f"quota in the container's environment), and {problem}; load gpushare.ko, or "
        f"start the container with the gpushare-runc runtime, or ask for "
        f"gpushare.io/isolation=none"
    )
