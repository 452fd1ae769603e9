"""The wire layer's hand-written ttrpc envelope codec agrees with the codec
generated from nri_gpushare/nri/api/ttrpc.proto, in both directions."""

from __future__ import annotations

import pytest

from nri_gpushare.nri.api import ttrpc
from nri_gpushare.nri.wire import Request, Response

REQUESTS = [
    Request("nri.pkg.api.v1alpha1.Plugin", "Configure", b"\x0a\x03cfg", 2_000_000_000),
    Request("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"", 0, (("k", "v"), ("a", ""))),
    Request("s", "m", bytes(range(256)), -1),
]


@pytest.mark.parametrize("req", REQUESTS)
def test_request(req: Request) -> None:
    generated = ttrpc.Request(
        service=req.service,
        method=req.method,
        payload=req.payload,
        timeout_nano=req.timeout_nano,
        metadata=[ttrpc.KeyValue(key=k, value=v) for k, v in req.metadata],
    )
    assert req.encode() == bytes(generated)
    assert Request.decode(bytes(generated)) == req
    back = ttrpc.Request().parse(req.encode())
    assert back.to_dict() == generated.to_dict()


@pytest.mark.parametrize(
    "resp",
    [Response(0, "", b"\x10\x08"), Response(12, "not implemented"), Response(2, "boom", b"x")],
)
def test_response(resp: Response) -> None:
    generated = ttrpc.Response(
        status=ttrpc.Status(code=int(resp.code), message=resp.message), payload=resp.payload
    )
    assert resp.encode() == bytes(generated)
    assert Response.decode(bytes(generated)) == resp
    back = ttrpc.Response().parse(resp.encode())
    assert (back.status.code, back.status.message, back.payload) == (
        resp.code,
        resp.message,
        resp.payload,
    )


def test_status_details_are_skipped() -> None:
    generated = ttrpc.Response(
        status=ttrpc.Status(
            code=3,
            message="bad",
            details=[ttrpc.Any(type_url="type.googleapis.com/x", value=b"\x08\x01")],
        )
    )
    decoded = Response.decode(bytes(generated))
    assert (decoded.code, decoded.message, decoded.payload) == (3, "bad", b"")
