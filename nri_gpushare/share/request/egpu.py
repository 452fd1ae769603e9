"""Requests written as China Telecom eGPU's ``EGPU=`` variable::

    EGPU="POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10:..."

an optional header of node settings (ignored), then one block per GPU:
``PGPU`` the GPU index, ``MEM`` MiB, ``WEIGHT`` compute percent 1..100
(absent: no limit on that GPU).
"""

from __future__ import annotations

from nri_gpushare.share.model import ShareRefused
from nri_gpushare.share.request.settings import NOTHING, Context, Setting, Settings
from nri_gpushare.share.request.values import MAX_ITEMS, Invalid, int_list
from nri_gpushare.units import MiB, quote


def from_egpu(ctx: Context) -> Settings:
    text = ctx.c.env.get("EGPU")
    if text is None or not text.strip():
        return NOTHING
    parsed = _blocks(ctx, text)
    devices: list[int] = []
    memory: list[int] = []
    core: list[int] = []
    for number, fields in parsed:

        def bad(what: str, number: int = number) -> ShareRefused:
            return ctx.fail(f"EGPU block {number}: {what}", "EGPU")

        if unknown := set(fields) - {"PGPU", "MEM", "WEIGHT"}:
            names = quote(", ".join(sorted(unknown)))
            raise bad(f"unknown field {names}; allowed PGPU, MEM, WEIGHT")
        if "PGPU" not in fields or "MEM" not in fields:
            raise bad("needs PGPU=<GPU index> and MEM=<MiB>")
        try:
            devices.extend(ctx.gpu_list.parse(fields["PGPU"], indexes_only=True))
        except Invalid as e:
            raise bad(f"PGPU={quote(fields['PGPU'])}: {e}") from None
        try:
            memory.extend(m * MiB for m in int_list(fields["MEM"], 1, None, single=True))
        except Invalid:
            raise bad(
                f"MEM={quote(fields['MEM'])}: must be a whole number of MiB, at least 1"
            ) from None
        if "WEIGHT" in fields:
            try:
                core.extend(int_list(fields["WEIGHT"], 1, 100, single=True))
            except Invalid:
                raise bad(
                    f"WEIGHT={quote(fields['WEIGHT'])}: must be a percentage between 1 and 100"
                ) from None
        else:
            core.append(0)
    seen: set[int] = set()
    for d in devices:
        if d in seen:
            raise ctx.fail(f"EGPU: a GPU appears in two blocks (GPU {d})", "EGPU")
        seen.add(d)
    listed = ",".join(str(d) for d in devices)
    return Settings(
        memory=Setting(
            tuple(memory),
            f"environment EGPU MEM={','.join(str(m // MiB) for m in memory)} (MiB)",
            "EGPU",
            "env",
        ),
        devices=Setting(tuple(devices), f"environment EGPU PGPU={listed}", "EGPU", "env"),
        core=(
            Setting(
                tuple(core),
                f"environment EGPU WEIGHT={','.join(str(x) for x in core)}",
                "EGPU",
                "env",
            )
            if any(core)
            else None
        ),
    )


def _blocks(ctx: Context, text: str) -> list[tuple[int, dict[str, str]]]:
    """The GPU blocks as (position in `text` from 1, NAME -> value), the header skipped."""
    parsed: list[tuple[int, dict[str, str]]] = []
    if text.count(":") >= MAX_ITEMS or text.count(",") >= 4 * MAX_ITEMS:
        raise ctx.fail(f"EGPU has more blocks than GPUs (at most {MAX_ITEMS})", "EGPU")
    for number, block in enumerate((b.strip() for b in text.strip().split(":")), 1):
        fields: dict[str, str] = {}
        for item in filter(None, (i.strip() for i in block.split(","))):
            name, eq, value = item.partition("=")
            if not eq:
                raise ctx.fail(f"EGPU block {number}: '{quote(item)}' is not NAME=VALUE", "EGPU")
            fields[name.strip().upper()] = value.strip()
        if number == 1 and "PGPU" not in fields:
            continue  # header: node settings (POLICY, ONLINE, TYPE), not ours
        parsed.append((number, fields))
    if not parsed:
        raise ctx.fail(
            "EGPU has no GPU block; expected PGPU=<index>,MEM=<MiB>[,WEIGHT=<percent>] "
            "blocks separated by ':'",
            "EGPU",
        )
    return parsed
