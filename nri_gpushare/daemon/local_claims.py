"""The DRA driver's local API ops: a prepared claim booked in the share
table, forgotten, listed (`nri_gpushare.share.claims`)."""

from __future__ import annotations

from typing import Any

from nri_gpushare.local.protocol import Reply, Request
from nri_gpushare.share.claims import ClaimAsk, ShareAsk
from nri_gpushare.share.model import ShareRefused
from nri_gpushare.share.service import ShareService


def claim_ask(claim: dict[str, Any]) -> ClaimAsk:
    """The protocol's checked claim object as the domain's ask."""
    return ClaimAsk(
        claim["uid"],
        claim["namespace"],
        claim["name"],
        tuple(claim["pods"]),
        tuple(ShareAsk(g["uuid"], g["memory"], g["core"]) for g in claim["gpus"]),
    )


def claim_op(service: ShareService, request: Request) -> Reply:
    """Answer ``claim-prepare``, ``claim-unprepare`` or ``claims``."""
    claims = service.claims
    if request.op == "claims":
        return Reply(True, claims=claims.status())
    if request.op == "claim-unprepare":
        return Reply(True, released=claims.unprepare(request.id))
    assert request.claim is not None  # the protocol requires it
    try:
        claim = claims.prepare(claim_ask(request.claim))
    except ShareRefused as e:
        service.decisions.refused(
            request.id,
            e.reason,
            str(e),
            name=f"{request.claim['namespace']}/{request.claim['name']}",
            origin="dra",
            operation="claim-prepare",
        )
        return Reply.refused(str(e), e.reason)
    return Reply(True, claim=claim.json())
