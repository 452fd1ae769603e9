"""The status socket's file and directory: created with their final modes,
and a directory someone else could write is refused, not repaired."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_gpushare.config import ConfigError
from nri_gpushare.daemon.status import StatusServer
from nri_gpushare.host import sockets
from nri_gpushare.host.sockets import query_status


@pytest.fixture
def umask() -> Iterator[None]:
    """The loosest umask, so any mode below comes from the code, not the umask."""
    old = os.umask(0)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def started(path: Path) -> StatusServer:
    server = StatusServer(str(path), lambda: {"ok": True})
    await server.start()
    return server


async def test_socket_and_new_directory_get_their_modes_and_serve(tmp_path, umask) -> None:
    path = tmp_path / "run" / "gpushare" / "status.sock"
    server = await started(path)
    try:
        assert mode(path) == 0o660
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert mode(path.parent) == 0o750
        assert await asyncio.to_thread(query_status, str(path)) == {"ok": True}
    finally:
        await server.close()
    assert not path.exists()


async def test_new_directory_is_0750_whatever_the_umask(tmp_path) -> None:
    old = os.umask(0o077)
    try:
        server = await started(tmp_path / "d" / "status.sock")
    finally:
        os.umask(old)
    await server.close()
    assert mode(tmp_path / "d") == 0o750


async def test_socket_is_never_wider_than_0660(tmp_path, umask, monkeypatch) -> None:
    # Without the chmod, what bind() created is what a client could have met
    # between bind and chmod: it must already be 0660 at most.
    chmods: list[tuple[str, int]] = []
    monkeypatch.setattr(os, "chmod", lambda p, m: chmods.append((str(p), m)))
    path = tmp_path / "status.sock"
    server = await started(path)
    try:
        assert mode(path) & ~0o660 == 0, oct(mode(path))
        assert chmods == [(str(path), 0o660)]
    finally:
        await server.close()
    assert os.umask(0) == 0  # the umask is the process's again


async def test_existing_private_directory_is_used_unchanged(tmp_path, umask) -> None:
    directory = tmp_path / "private"
    directory.mkdir(0o700)
    server = await started(directory / "status.sock")
    await server.close()
    assert mode(directory) == 0o700


async def test_a_stale_socket_is_replaced(tmp_path) -> None:
    path = tmp_path / "status.sock"
    path.write_text("stale")
    server = await started(path)
    try:
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        await server.close()


@pytest.mark.parametrize("bits", [0o770, 0o777, 0o1777, 0o752])
async def test_directory_writable_by_others_is_refused(tmp_path, umask, bits) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    os.chmod(directory, bits)
    with pytest.raises(ConfigError) as info:
        await started(directory / "status.sock")
    message = str(info.value)
    assert f"status_socket {directory}/status.sock: directory {directory}" in message
    assert f"is writable by others (mode {bits:04o})" in message
    assert "chmod 0750" in message
    assert mode(directory) == bits  # not ours to change
    assert not (directory / "status.sock").exists()


async def test_directory_of_another_owner_is_refused(tmp_path, monkeypatch) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(0o755)
    owner = os.stat(directory).st_uid
    monkeypatch.setattr(sockets.os, "geteuid", lambda: owner + 1)
    with pytest.raises(ConfigError, match=f"is owned by uid {owner}, not by this daemon"):
        await started(directory / "status.sock")


async def test_directory_that_is_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        await started(tmp_path / "file" / "status.sock")


async def test_an_unusable_path_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="status_socket .*: cannot create it: "):
        await started(tmp_path / ("x" * 120) / "status.sock")  # longer than sun_path
