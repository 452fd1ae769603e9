"""The daemon's state file: root-only, atomic, never trusted when others could write it."""

import os
import stat

import pytest

from nri_gpushare.host.statefile import StateDirError, StateFile


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_created_root_only_and_round_trips(tmp_path):
    store = StateFile(tmp_path / "a" / "state")
    old = os.umask(0)
    try:
        store.prepare()
        store.replace('{"x": 1}')
    finally:
        os.umask(old)
    assert mode(store.directory) == 0o700
    assert mode(store.path) == 0o600
    assert store.load() == '{"x": 1}'
    store.replace("second")
    assert store.load() == "second"
    assert sorted(os.listdir(store.directory)) == ["allocations.json"]  # no temporary left


def test_missing_file_is_no_records(tmp_path):
    store = StateFile(tmp_path)
    assert store.load() is None


@pytest.mark.parametrize("bad_mode", [0o666, 0o620, 0o602])
def test_a_file_others_can_write_is_ignored(tmp_path, bad_mode, caplog):
    store = StateFile(tmp_path)
    store.replace("records")
    os.chmod(store.path, bad_mode)
    assert store.load() is None
    assert "not trusted" in caplog.text


def test_a_file_of_another_user_is_ignored(tmp_path, caplog):
    store = StateFile(tmp_path)
    store.replace("records")
    os.chown(store.path, 12345, -1)
    assert store.load() is None
    assert "owned by uid 12345" in caplog.text


def test_a_symlink_is_never_followed(tmp_path, caplog):
    target = tmp_path / "elsewhere"
    target.write_text("forged")
    store = StateFile(tmp_path / "state")
    store.prepare()
    store.path.symlink_to(target)
    assert store.load() is None
    store.replace("real")  # replaces the link itself
    assert target.read_text() == "forged"
    assert store.load() == "real"


@pytest.mark.parametrize("setup", ["world-writable", "other-owner", "file"])
def test_an_unsafe_directory_is_refused(tmp_path, setup):
    d = tmp_path / "state"
    if setup == "file":
        d.write_text("")
    else:
        d.mkdir()
        if setup == "world-writable":
            d.chmod(0o777)
        else:
            os.chown(d, 12345, -1)
    with pytest.raises(StateDirError):
        StateFile(d).prepare()


def test_a_failed_write_keeps_the_old_records(tmp_path, monkeypatch):
    store = StateFile(tmp_path)
    store.replace("old")

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        store.replace("new")
    monkeypatch.undo()
    assert store.load() == "old"
    assert os.listdir(tmp_path) == ["allocations.json"]


def test_a_second_daemon_is_refused(tmp_path):
    first = StateFile(tmp_path / "state")
    first.prepare()
    with pytest.raises(StateDirError, match="in use by another nri-gpushare daemon"):
        StateFile(tmp_path / "state").prepare()
    first.close()
    StateFile(tmp_path / "state").prepare()  # free again once the first is gone


def test_a_fifo_never_blocks_loading(tmp_path, caplog):
    store = StateFile(tmp_path / "state")
    store.prepare()
    os.mkfifo(store.path, 0o600)
    assert store.load() is None  # returns at once instead of waiting for a writer
    assert "not a regular file" in caplog.text


def test_a_symlinked_state_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(StateDirError, match="not a symlink"):
        StateFile(tmp_path / "link").prepare()


def test_swapping_the_path_after_start_redirects_nothing(tmp_path):
    store = StateFile(tmp_path / "state")
    store.prepare()
    store.replace("one")
    os.rename(tmp_path / "state", tmp_path / "moved")
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (tmp_path / "state").symlink_to(decoy)
    store.replace("two")
    assert os.listdir(decoy) == []
    assert (tmp_path / "moved" / "allocations.json").read_text() == "two"
