"""An NRI plugin that subscribes to CreateContainer and changes nothing.

The benchmark's middle arm: what any plugin on this stub and transport costs,
so that the share logic's own cost shows as the difference to gpushare.

    python bench/null_plugin.py SOCKET
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nri_gpushare.stub import Plugin, Stub  # noqa: E402


class NullPlugin(Plugin):
    async def create_container(self, pod, container):
        return None


async def main(socket_path: str) -> None:
    stub = Stub(NullPlugin(), name="null", index="10", socket_path=socket_path)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(stub.stop()))
    await stub.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
