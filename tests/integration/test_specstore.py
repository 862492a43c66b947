"""The local spec store on real files: bunches, lookups, caching and atomic writes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.common.settings import Settings, load_settings, log_root, spec_root
from services.common.specstore import LocalSpecStore, SpecStore, decode_bunch, encode_bunch

pytestmark = pytest.mark.integration


def spec(job_id: int) -> str:
    return json.dumps({"job_id": job_id, "process": {"type": "docker", "command": ["true"]}})


def bunch(first: int, n: int) -> list[tuple[int, str]]:
    return [(j, spec(j)) for j in range(first, first + n)]


def test_a_bunch_round_trips(tmp_path: Path) -> None:
    store: SpecStore = LocalSpecStore(tmp_path)
    store.write_bunch(3, bunch(1, 5))
    assert [store.read(3, j) for j in range(1, 6)] == [spec(j) for j in range(1, 6)]
    # A second store (another process) reads the same files.
    other = LocalSpecStore(tmp_path)
    assert other.read(3, 4) == spec(4)
    assert sorted(p.name for p in (tmp_path / "3").iterdir()) == ["1.specs"]


def test_a_run_is_stored_as_the_same_bunch(tmp_path: Path) -> None:
    runs = LocalSpecStore(tmp_path / "runs")
    runs.write_run(3, 11, [s for _, s in bunch(11, 5)])
    runs.write_run(3, 16, [])  # nothing to store
    assert [runs.read(3, j) for j in range(10, 17)] == [None, *(spec(j) for j in range(11, 16)),
                                                         None]
    pairs = LocalSpecStore(tmp_path / "pairs")
    pairs.write_bunch(3, bunch(11, 5))
    assert runs.path(3, 11).read_bytes() == pairs.path(3, 11).read_bytes()
    assert sorted(p.name for p in (tmp_path / "runs" / "3").iterdir()) == ["11.specs"]


def test_a_bunch_is_stored_compressed(tmp_path: Path) -> None:
    specs = bunch(1, 1_024)
    LocalSpecStore(tmp_path).write_bunch(3, specs)
    stored = (tmp_path / "3" / "1.specs").read_bytes()
    assert stored[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert len(stored) * 10 < sum(len(s) for _, s in specs)
    found = decode_bunch(stored)
    assert (found.job_ids, found.specs) == ([j for j, _ in specs], [s for _, s in specs])


def test_a_bunch_stored_before_compression_is_still_read(tmp_path: Path) -> None:
    """Files written as plain msgpack (before 2026-11-30) read as they did."""
    (tmp_path / "3").mkdir()
    plain = msgspec.msgpack.encode([[1, 2, 3], [spec(1), spec(2), spec(3)]])
    (tmp_path / "3" / "1.specs").write_bytes(plain)
    store = LocalSpecStore(tmp_path)
    assert [store.read(3, j) for j in (1, 2, 3, 4)] == [spec(1), spec(2), spec(3), None]


@pytest.mark.parametrize("damage", [lambda b: b[:-3], lambda b: b[:4] + b"\x00" * 20],
                         ids=["truncated", "garbled"])
def test_a_damaged_compressed_bunch_is_a_decode_error(damage: Any) -> None:
    stored = encode_bunch([1, 2], [spec(1), spec(2)])
    with pytest.raises(msgspec.DecodeError):
        decode_bunch(damage(stored))


@pytest.mark.parametrize(("batch_id", "job_id"), [(3, 0), (3, 6), (3, 1_000), (4, 1)],
                         ids=["before-first", "after-last", "far-beyond", "unknown-batch"])
def test_a_missing_job_is_none(tmp_path: Path, batch_id: int, job_id: int) -> None:
    store = LocalSpecStore(tmp_path)
    store.write_bunch(3, bunch(1, 5))
    assert store.read(batch_id, job_id) is None


def test_cached_answers_from_memory_only(tmp_path: Path) -> None:
    writer, reader = LocalSpecStore(tmp_path), LocalSpecStore(tmp_path)
    writer.write_bunch(3, bunch(1, 5))
    assert reader.cached(3, 2) is None  # never read here: nothing in memory
    assert reader.read(3, 2) == spec(2)
    assert [reader.cached(3, j) for j in range(1, 6)] == [spec(j) for j in range(1, 6)]
    assert reader.cached(3, 6) is None and reader.cached(4, 1) is None
    # A rewritten bunch drops out of the writer's memory; its next read sees the new text.
    writer.read(3, 1)
    writer.write_bunch(3, [(1, "{}")])
    assert writer.cached(3, 1) is None
    assert writer.read(3, 1) == "{}" and writer.cached(3, 1) == "{}"
    (tmp_path / "3" / "1.specs").unlink()  # gone on disk: memory still answers, no I/O
    assert reader.cached(3, 4) == spec(4)


def test_a_batch_written_in_several_bunches(tmp_path: Path) -> None:
    writer, reader = LocalSpecStore(tmp_path), LocalSpecStore(tmp_path, cache_bunches=2)
    writer.write_bunch(9, bunch(1, 3))
    writer.write_bunch(9, bunch(4, 1))
    assert reader.read(9, 2) == spec(2)
    assert reader.read(9, 5) is None  # not written yet
    # Bunches arriving after the reader listed the batch are found (the listing is refreshed).
    writer.write_bunch(9, bunch(5, 10))
    writer.write_bunch(9, bunch(100, 2))
    for j in (*range(1, 15), 100, 101):
        assert reader.read(9, j) == spec(j), j
    for j in (15, 99, 102):
        assert reader.read(9, j) is None
    assert sorted(int(p.name.split(".")[0]) for p in (tmp_path / "9").iterdir()) == [
        1, 4, 5, 100]


def test_a_rewritten_bunch_replaces_the_old_one(tmp_path: Path) -> None:
    store = LocalSpecStore(tmp_path)
    store.write_bunch(1, bunch(1, 2))
    assert store.read(1, 2) == spec(2)
    store.write_bunch(1, [(1, "{}"), (2, "[]"), (3, "{}")])  # a retried request, say
    assert (store.read(1, 2), store.read(1, 3)) == ("[]", "{}")


def test_writes_are_atomic_and_leave_no_temporary_files(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalSpecStore(tmp_path)
    store.write_bunch(2, bunch(1, 3))
    original = os.replace

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        store.write_bunch(2, bunch(4, 3))
    monkeypatch.setattr(os, "replace", original)
    # The failed bunch is invisible, the earlier one intact, and no temporary file is left.
    assert [p.name for p in (tmp_path / "2").iterdir()] == ["1.specs"]
    assert LocalSpecStore(tmp_path).read(2, 4) is None
    assert LocalSpecStore(tmp_path).read(2, 3) == spec(3)
    # A temporary file of a writer that crashed mid-write is never mistaken for a bunch.
    (tmp_path / "2" / ".4.abc.tmp").write_bytes(b"\x00half")
    assert LocalSpecStore(tmp_path).read(2, 4) is None


def test_bunches_must_have_increasing_job_ids(tmp_path: Path) -> None:
    store = LocalSpecStore(tmp_path)
    with pytest.raises(ValueError, match="increase"):
        store.write_bunch(1, [(2, "{}"), (1, "{}")])
    store.write_bunch(1, [])  # nothing to store
    assert not (tmp_path / "1").exists() or not any((tmp_path / "1").iterdir())


def test_concurrent_readers_and_writers(tmp_path: Path) -> None:
    store = LocalSpecStore(tmp_path, cache_bunches=3)
    errors: list[BaseException] = []

    def write(first: int) -> None:
        try:
            store.write_bunch(5, bunch(first, 10))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def read() -> None:
        try:
            for j in range(1, 201):
                found = store.read(5, j)
                assert found is None or found == spec(j)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(f,)) for f in range(1, 201, 10)]
    threads += [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(store.read(5, j) == spec(j) for j in range(1, 201))


def test_storage_roots_from_the_settings(tmp_path: Path) -> None:
    defaults = load_settings({"HS_DATA_DIR": str(tmp_path)})
    assert spec_root(defaults) == str(tmp_path / "specs")
    assert log_root(defaults) == str(tmp_path / "job-logs")
    given = load_settings({"HS_SPEC_DIR": "/s", "HS_LOG_DIR": "/l"})
    assert (spec_root(given), log_root(given)) == ("/s", "/l")
    relative = Settings(data_dir="var")
    assert os.path.isabs(spec_root(relative)) and spec_root(relative).endswith("var/specs")


def test_a_written_bunch_and_its_name_are_flushed_to_disk(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The file before its rename, then the directory that holds its new name (and, for a
    batch's first bunch, the root that holds the batch's new directory): what a crash of the
    machine must not lose once the bunch's event is published."""
    flushed: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store = LocalSpecStore(tmp_path)
    store.write_bunch(3, bunch(1, 2))
    store.write_bunch(3, bunch(3, 2))
    batch = str(tmp_path / "3")
    assert flushed[0] == str(tmp_path)  # the new batch directory's entry
    assert flushed[1].startswith(batch + "/.") and flushed[1].endswith(".tmp")
    assert flushed[2:] == [batch, flushed[3], batch]
    assert flushed[3].startswith(batch + "/.")
    flushed.clear()
    LocalSpecStore(tmp_path, fsync=False).write_bunch(4, bunch(1, 2))
    assert flushed == []


def test_a_bunch_stored_as_its_json_array_is_read_job_by_job(tmp_path: Path) -> None:
    """Ingest stores a bunch's body as it came; each job's text is its element, verbatim."""
    texts = [spec(j) for j in range(21, 24)]
    texts[1] = '{"job_id": 22,\n  "name": "\\u00e9t\u00e9"}'
    body = (" \n[" + " ,\n ".join(texts) + "]\n").encode()
    store = LocalSpecStore(tmp_path)
    store.write_json(3, 21, body)
    store.write_bunch(3, bunch(1, 2))  # the same batch's bunches of both kinds
    fresh = LocalSpecStore(tmp_path)
    assert [fresh.read(3, j) for j in range(20, 25)] == [None, *texts, None]
    assert [fresh.read(3, j) for j in (1, 2)] == [spec(1), spec(2)]
    stored = fresh.path(3, 21).read_bytes()
    assert stored[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    found = decode_bunch(stored, 21)
    assert (found.job_ids, found.specs) == ([21, 22, 23], texts)
    with pytest.raises(msgspec.DecodeError, match="without its first job id"):
        decode_bunch(stored)
