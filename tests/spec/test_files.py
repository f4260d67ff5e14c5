"""Files written whole or not at all (`libra.spec.files`)."""

from __future__ import annotations

import os

import pytest

from libra.spec import files
from libra.spec.files import atomic_open, umask, write_whole


def test_an_error_in_the_block_leaves_the_old_file_and_no_temporary_file(tmp_path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write("half of the new")
        raise RuntimeError("the disk filled up")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_the_new_file_reaches_the_disk_before_it_is_renamed_over_the_old(tmp_path, monkeypatch) -> None:
    """A rename before the data is on disk can leave an empty file after a power loss (delayed allocation)."""
    calls: list[str] = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(files.os, "fsync", lambda fd: (calls.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(files.os, "replace", lambda a, b: (calls.append("replace"), replace(a, b))[1])
    write_whole(tmp_path / "run.jsonl", b'{"step": 0}\n')
    assert calls == ["fsync", "replace"]
    assert (tmp_path / "run.jsonl").read_bytes() == b'{"step": 0}\n'


@pytest.mark.parametrize(("executable", "mode"), [(False, 0o640), (True, 0o750)])
def test_a_new_file_has_the_permissions_of_any_new_file(tmp_path, executable, mode) -> None:
    old = os.umask(0o027)
    try:
        with atomic_open(tmp_path / "f", executable=executable) as f:
            f.write("x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == mode  # not the temporary file's 0o600


def test_the_umask_is_read_without_being_changed_where_linux_reports_it(tmp_path, monkeypatch) -> None:
    """Setting the umask to read it races with any other thread creating a file in between."""
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nUmask:\t0077\nState:\tR (running)\n")

    def no_umask(mask: int) -> int:
        raise AssertionError("os.umask called")

    monkeypatch.setattr(files.os, "umask", no_umask)
    assert umask(status) == 0o077


def test_the_umask_is_set_and_restored_where_linux_does_not_report_it(tmp_path) -> None:
    old = os.umask(0o027)
    try:
        assert umask(tmp_path / "missing") == 0o027
        assert umask() == 0o027  # /proc/self/status on Linux, the fallback elsewhere
        assert os.umask(0o027) == 0o027  # left as it was
    finally:
        os.umask(old)
