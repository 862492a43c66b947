"""The worker's local log store: one directory per batch, earlier layouts still readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.worker.logstore import LocalLogStore


def _write(store: LocalLogStore, key: tuple[int, int, str, str], data: bytes) -> None:
    writer = store.writer(*key)
    writer.write(data)
    writer.close()


def test_logs_round_trip_and_stay_apart(tmp_path: Path) -> None:
    store = LocalLogStore(tmp_path / "logs")
    keys = [(7, 1, "a1", "main"), (7, 1, "a2", "main"), (7, 1, "a1", "input"),
            (7, 12, "a1", "main"), (8, 1, "a1", "main"),
            # names that a separator allowed in names ('.', '-') would confuse
            (7, 2, "a.b", "c"), (7, 2, "a", "b.c"), (7, 3, "x-1", "main"), (7, 31, "x", "main")]
    for i, key in enumerate(keys):
        _write(store, key, f"log {i}\n".encode())
    for i, key in enumerate(keys):
        assert store.read(*key) == f"log {i}\n".encode()
    assert store.read(7, 1, "a3", "main") is None
    assert store.read(9, 1, "a1", "main") is None
    # One directory per batch, no directory per job or attempt.
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["7", "8"]
    assert all(p.is_file() for p in (tmp_path / "logs" / "7").iterdir())


def test_a_new_writer_truncates_and_a_missing_batch_directory_is_made_again(
        tmp_path: Path) -> None:
    store = LocalLogStore(tmp_path / "logs")
    _write(store, (1, 1, "a1", "main"), b"a long first version\n")
    _write(store, (1, 1, "a1", "main"), b"short\n")
    assert store.read(1, 1, "a1", "main") == b"short\n"
    store.path(1, 1, "a1", "main").unlink()
    (tmp_path / "logs" / "1").rmdir()  # e.g. a retention sweep removed the batch
    _write(store, (1, 2, "a1", "main"), b"again\n")
    assert store.read(1, 2, "a1", "main") == b"again\n"


def test_logs_of_the_earlier_layout_are_still_read(tmp_path: Path) -> None:
    old = tmp_path / "logs" / "5" / "3" / "a1"
    old.mkdir(parents=True)
    (old / "main.log").write_bytes(b"written before the upgrade\n")
    store = LocalLogStore(tmp_path / "logs")
    assert store.read(5, 3, "a1", "main") == b"written before the upgrade\n"
    # A newer log of the same attempt wins (a rerun writes the new layout).
    _write(store, (5, 3, "a1", "main"), b"new\n")
    assert store.read(5, 3, "a1", "main") == b"new\n"


@pytest.mark.parametrize(("attempt_id", "container"), [
    ("../x", "main"), ("a+b", "main"), ("a1", "ma/in"), ("a1", "x+y"), (".hidden", "main"),
    ("", "main")])
def test_names_that_could_escape_or_collide_are_refused(tmp_path: Path, attempt_id: str,
                                                        container: str) -> None:
    store = LocalLogStore(tmp_path / "logs")
    with pytest.raises(ValueError, match="invalid"):
        store.writer(1, 1, attempt_id, container)
    with pytest.raises(ValueError, match="invalid"):
        store.read(1, 1, attempt_id, container)
    assert not (tmp_path / "logs").exists()


def test_a_log_is_made_on_its_first_byte_and_one_closed_unwritten_removes_a_stale_file(
        tmp_path: Path) -> None:
    store = LocalLogStore(tmp_path / "logs")
    key = (3, 1, "a1", "main")
    writer = store.writer(*key)
    assert not (tmp_path / "logs").exists()  # nothing made for a log nothing wrote to yet
    writer.write(b"first\n")
    assert store.read(*key) == b"first\n"  # unbuffered: readable while it runs
    writer.write(b"second\n")
    writer.close()
    assert store.read(*key) == b"first\nsecond\n"
    # A rerun of the same attempt that writes nothing leaves no log of the run before.
    rerun = store.writer(*key)
    assert store.read(*key) == b"first\nsecond\n"  # not truncated until it writes or ends
    rerun.close()
    assert store.read(*key) is None
    rerun.close()  # twice is harmless
    # One whose descriptor is asked for (a process writes to it) is made, even if empty.
    other = store.writer(3, 2, "a1", "main")
    assert other.fileno() >= 0
    other.close()
    assert store.read(3, 2, "a1", "main") == b""
