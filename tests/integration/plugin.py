"""Runs the real plugin (`nri-gpushare run`) as a process next to the test bed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from nri_gpushare.host.sockets import query_status

ROOT = Path(__file__).resolve().parents[2]


def gpu_inventory(count: int, memory: str) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "uuid": f"GPU-{i:08x}-1111-2222-3333-444444444444",
            "name": "Simulated GPU",
            "memory": memory,
        }
        for i in range(count)
    ]


class PluginProcess:
    def __init__(self, nri_socket: str | Path, workdir: Path, **settings: Any) -> None:
        workdir.mkdir(mode=0o750, parents=True, exist_ok=True)  # the status socket's dir
        self.workdir = workdir
        self.status_socket = str(workdir / "status.sock")
        self.api_socket = str(workdir / "api.sock")
        config = {
            "nri": {"socket": str(nri_socket), "plugin_index": "10"},
            "status_socket": self.status_socket,
            "api_socket": self.api_socket,
            # The test bed's containerd serves gRPC next to its NRI socket.
            "containerd": {"socket": str(Path(nri_socket).parent / "containerd.sock")},
            "log_level": "debug",
            "kmod": "off",
            "use_nvml": False,
            "inventory": gpu_inventory(2, "16Gi"),
            "state_dir": str(workdir.parent / "state"),  # shared by a test's plugins
            # No libgpushare.so on test machines: shares run without the
            # interposer (with a warning) unless a test gives it a library.
            "interposer": {"missing": "warn"},
        }
        config.update(settings)
        self.config_path = workdir / "gpushare.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "plugin.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> PluginProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nri_gpushare.cli.main",
                "run",
                "--config",
                str(self.config_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        if wait:
            self.wait_connected()
        return self

    def status(self) -> dict[str, Any]:
        return query_status(self.status_socket)

    def runc_wrapper(self, program: str = "gpushare-front") -> Path:
        """gpushare-runc asking this plugin: a runtime binary for ctr's
        --runc-binary or dockerd's --add-runtime.  `program`: the compiled
        front (what scripts/install-node.sh installs as gpushare-runc), or
        "gpushare-runc" for the Python wrapper alone."""
        name = "gpushare-runc" if program == "gpushare-front" else "gpushare-runc-py"
        script = self.workdir / name
        script.write_text(
            f"#!/bin/sh\nGPUSHARE_API_SOCKET={self.api_socket} "
            f'exec {ROOT / ".venv" / "bin" / program} "$@"\n'
        )
        script.chmod(0o755)
        return script

    def wait_connected(self, timeout: float = 15.0, sessions: int = 1) -> float:
        """Wait until the plugin has synchronized `sessions` times; returns when."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"plugin exited with {self.proc.returncode}:\n{self.log()}")
            try:
                nri = self.status()["nri"]
                if nri["connected"] and nri["sessions"] >= sessions:
                    return time.monotonic()
            except OSError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"plugin did not connect within {timeout} s:\n{self.log()}")

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
