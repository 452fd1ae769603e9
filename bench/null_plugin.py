"""An NRI plugin that subscribes to CreateContainer and changes nothing.

The benchmark's middle arm: what any plugin on this stub and transport costs,
so that the share logic's own cost shows as the difference to gpushare.  It
reads nothing of the request, so with the stub's lazy views it decodes only
the request's top level, like the Go reference plugin's handler that ignores
its arguments (Go's stub unmarshals them whole, though).

    python bench/null_plugin.py SOCKET [--stats PATH]

--stats PATH: on SIGTERM, before exiting, write its own handling time per
method there, as the daemon's status reports it:
{"CreateContainer": {"count": N, "p50": ms, "p99": ms}}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nri_gpushare.daemon.status import handler_summary  # noqa: E402
from nri_gpushare.nri.api.lite import ContainerView, PodSandboxView  # noqa: E402
from nri_gpushare.nri.stub import Plugin, Stub  # noqa: E402


class NullPlugin(Plugin):
    async def create_container(self, pod: PodSandboxView, container: ContainerView) -> None:
        return None


async def main(socket_path: str, stats: Path | None) -> None:
    stub = Stub(NullPlugin(), name="null", index="10", socket_path=socket_path)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(stub.stop()))
    await stub.run()
    if stats is not None:
        summary = {method: handler_summary(s) for method, s in stub.handler_seconds.items()}
        stats.write_text(json.dumps(summary))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("socket")
    parser.add_argument("--stats", type=Path, help="write handling times here on exit")
    args = parser.parse_args()
    asyncio.run(main(args.socket, args.stats))
