"""The local API's ops for the compiled front (``front/``: gpushare-runc and
the CDI hooks), which parses no JSON: the daemon reads here what the Python
wrapper and hook read themselves (the bundle's config.json, the hook's OCI
state), asks as they ask (`LocalApiHandler`'s create, start, release), and
for ``runc-create`` writes the share into config.json with the same `oci`
functions (a new file renamed over the old one).

Everything read here is the container's: config.json is opened without
following a symlink, read bounded (`MAX_CONFIG`) and parsed and written
off the event loop; the state is parsed as the hook parses it.  Any problem
with either is a refusal with reason ``bundle`` (nothing left reserved), on
which the front runs the Python program: it says why in its own words, or
follows the symlink as runc does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable
from typing import Any

from nri_gpushare.local import oci
from nri_gpushare.local.hook import create_request
from nri_gpushare.local.protocol import (
    ProtocolError,
    Reply,
    Request,
    decode_reply,
    encode_reply,
    encode_request,
)

Ask = Callable[[Request], Awaitable[Reply]]
BUNDLE = "bundle"
"""The refusal reason on which the front runs the Python program instead."""
MAX_CONFIG = 1 << 20
"""Bytes of config.json the daemon reads (real ones are kilobytes).  The
image and the user write it, and its parse holds the interpreter lock: 32 MiB
of ``{}`` (`oci.MAX_CONFIG`) cost 0.6 s of stalled event loop and 800 MiB.
A bigger one is left to the Python program, which pays for it itself."""


def _cannot(message: str) -> Reply:
    text = message if message.startswith("gpushare:") else f"gpushare: {message}"
    return Reply.refused(text, BUNDLE)


def _checked(request: Request) -> Request:
    """`request` if the Python caller could have sent it (ProtocolError otherwise)."""
    encode_request(request)
    return request


def _open(bundle: str) -> int:
    """The bundle directory, open: config.json is read and written in the one
    directory, even if the path is made to name another meanwhile."""
    try:
        return os.open(bundle, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise oci.OciError(f"{bundle}: cannot open: {e.strerror or e}") from e


def _read(bundle: str, dir_fd: int) -> tuple[dict[str, Any], oci.BundleInfo]:
    config = oci.read_config(bundle, follow=False, limit=MAX_CONFIG, dir_fd=dir_fd)
    return config, oci.bundle_info(config)


def _read_closed(bundle: str) -> tuple[dict[str, Any], oci.BundleInfo]:
    dir_fd = _open(bundle)
    try:
        return _read(bundle, dir_fd)
    finally:
        os.close(dir_fd)


def _write(bundle: str, dir_fd: int, config: dict[str, Any], reply: Reply) -> None:
    # The plan as the Python wrapper gets it (through the wire: keys sorted),
    # so that config.json comes out the same byte for byte.
    plan = decode_reply(encode_reply(reply)).plan
    oci.write_config(bundle, oci.apply_plan(config, plan or {}), dir_fd)


async def runc_create(r: Request, ask: Ask) -> Reply:
    """gpushare-runc's create, the bundle read and edited here; the reply
    names the namespace the share is booked under."""
    bundle = os.path.normpath(r.bundle)  # absolute (the protocol checked): abspath's result
    try:
        dir_fd = await asyncio.to_thread(_open, bundle)
    except oci.OciError as e:
        return _cannot(str(e))
    try:
        return await _runc_create(r, ask, bundle, dir_fd)
    finally:
        os.close(dir_fd)


async def _runc_create(r: Request, ask: Ask, bundle: str, dir_fd: int) -> Reply:
    try:
        config, info = await asyncio.to_thread(_read, bundle, dir_fd)
        namespace = oci.namespace_of(bundle, r.id, r.root)
        create = _checked(
            Request(
                "create",
                namespace,
                r.id,
                via="runc",
                bundle=bundle,
                cgroups_path=info.cgroups_path,
                env=info.env,
                annotations=info.annotations,
            )
        )
    except (oci.OciError, ProtocolError) as e:
        return _cannot(str(e))
    reply = await ask(create)
    if not reply.ok:
        return reply
    if reply.plan is not None:
        try:
            await asyncio.to_thread(_write, bundle, dir_fd, config, reply)
        except (oci.OciError, oci.PlanError, ProtocolError, OSError) as e:
            await ask(Request("release", namespace, r.id, via="runc"))
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            return _cannot(
                f"cannot give container {r.id} its GPU share in {bundle}/config.json: {why}"
            )
    return dataclasses.replace(reply, namespace=namespace)


def _state(r: Request) -> oci.State:
    try:
        return oci.parse_state(r.state.encode())
    except UnicodeEncodeError:  # a lone surrogate: the front sends UTF-8 only
        raise oci.OciError("OCI state: not UTF-8") from None


async def hook(r: Request, ask: Ask) -> Reply:
    """The CDI hooks, the state and the bundle read here."""
    try:
        state = _state(r)
        namespace = oci.namespace_of(state.bundle, state.id)
        if r.hook == "poststop":
            return await ask(_checked(Request("release", namespace, state.id)))
        _config, info = await asyncio.to_thread(_read_closed, state.bundle)
        create = _checked(create_request(state, info))
    except (oci.OciError, ProtocolError) as e:
        return _cannot(f"{r.hook} hook: {e}")
    return dataclasses.replace(await ask(create), namespace=namespace)


def created(request: Request, reply: Reply) -> tuple[str, str] | None:
    """(namespace, id) of the share a runc-create or create-runtime reply
    booked; None when it booked none (for a reply its caller never read)."""
    if not reply.ok or reply.plan is None or reply.namespace is None:
        return None
    if request.op == "runc-create":
        return reply.namespace, request.id
    if request.op == "hook" and request.hook == "create-runtime":
        try:
            return reply.namespace, _state(request).id
        except oci.OciError:
            return None
    return None
