"""chute.grain_source: a split's records by number, as tf.data reads them, for Grain."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records

import chute
from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import storage

grain = pytest.importorskip("grain")


@pytest.fixture
def dataset(shared_dataset: Path, tmp_path: Path) -> Path:
    """A copy of the shared dataset (3 classes, raw 12x10, train 18 + val 6) to change."""
    return Path(shutil.copytree(shared_dataset, tmp_path / "out"))


def _plain(record: dict) -> dict:
    """A record from the source in the form helpers.read_records gives (tf.data's)."""
    return {**record, "size": tuple(record["size"].tolist())}


def _keys(source, numbers) -> list[str]:
    """Module-level (picklable): the keys of records ``numbers``, read in this process."""
    return [source[i]["key"] for i in numbers]


@pytest.mark.parametrize("split", ["train", "val"])
def test_records_equal_tf_datas_in_order(shared_dataset, split):
    source = chute.grain_source(shared_dataset, split)
    expected = all_records(shared_dataset, split)  # tf.data, shard after shard
    assert len(source) == len(expected) == chute.load_manifest(shared_dataset).num_examples(split)
    got = [source[i] for i in range(len(source))]
    assert [_plain(r) for r in got] == expected
    first = got[0]
    assert isinstance(first["image"], bytes) and isinstance(first["class"], int)
    assert first["size"].dtype == np.int64 and first["size"].shape == (2,)
    assert source[-1]["key"] == expected[-1]["key"]  # from the end, as a sequence
    assert source[np.int64(2)]["key"] == expected[2]["key"]
    with pytest.raises(IndexError, match=f"the {split} split .* holds {len(source)} records"):
        source[len(source)]
    assert repr(source) == (
        f"GrainSource(location={str(shared_dataset)!r}, split={split!r}, records={len(source)})"
    )


def test_a_grain_map_dataset_reads_it(shared_dataset):
    source = chute.grain_source(shared_dataset, "train")
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    dataset = grain.MapDataset.source(source).map(lambda record: record["key"])
    assert list(dataset) == [r["key"] for r in all_records(shared_dataset, "train")]
    shuffled = list(dataset.shuffle(seed=3))
    assert sorted(shuffled) == sorted(dataset) and shuffled != list(dataset)


def test_threads_read_it_at_once(shared_dataset):
    from concurrent.futures import ThreadPoolExecutor

    source = chute.grain_source(shared_dataset, "train")
    numbers = [i % len(source) for i in range(37 * len(source))]
    with ThreadPoolExecutor(8) as pool:
        keys = list(pool.map(lambda i: source[i]["key"], numbers))
    expected = [r["key"] for r in all_records(shared_dataset, "train")]
    assert keys == [expected[i] for i in numbers]


def test_it_pickles_without_open_files_and_reads_in_a_spawned_process(shared_dataset):
    source = chute.grain_source(shared_dataset, "train")
    expected = _keys(source, range(len(source)))  # opens the files in this process
    copy = pickle.loads(pickle.dumps(source))
    assert copy._fds == {} and _keys(copy, [0, 17]) == [expected[0], expected[17]]
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        assert pool.apply(_keys, (source, range(len(source)))) == expected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_process_opens_files_of_its_own(shared_dataset):
    source = chute.grain_source(shared_dataset, "val")
    expected = _keys(source, range(len(source)))
    parent_fds = dict(source._fds)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: read everything with files it opened itself
        try:
            keys = _keys(source, reversed(range(len(source))))
            ok = keys == expected[::-1] and source._pid == os.getpid() and source._fds
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
    assert source._fds == parent_fds and _keys(source, [0]) == expected[:1]  # still open here


def test_grain_worker_processes_read_it(shared_dataset):
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain's worker processes read absl flags
        flags.FLAGS.mark_as_parsed()
    source = chute.grain_source(shared_dataset, "val")
    dataset = grain.MapDataset.source(source).to_iter_dataset()
    prefetched = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=1))
    assert [r["key"] for r in prefetched] == [r["key"] for r in all_records(shared_dataset, "val")]


def test_a_damaged_record_is_an_error_naming_it_and_the_others_still_read(dataset):
    source = chute.grain_source(dataset, "train")
    shard = chute.load_manifest(dataset).splits["train"]["shards"][0]
    index_file = dataset / record_index.FOLDER / shard["index"]["file"]
    index = record_index.RecordIndex.from_bytes(index_file.read_bytes())
    path = dataset / shard["file"]
    data = bytearray(path.read_bytes())
    data[int(index.offsets[2]) + 30] ^= 0xFF  # inside record 2's data
    path.write_bytes(bytes(data))
    with pytest.raises(ChuteError, match=r"Record 2 of the train split .* damaged: .*CRC"):
        source[2]
    assert source[1]["key"] and source[3]["key"]
    path.write_bytes(bytes(data[: int(index.offsets[4]) + 5]))  # cut inside record 4
    with pytest.raises(ChuteError, match="the shard is cut short"):
        source[4]


def test_a_dataset_without_indexes_says_to_run_chute_index(dataset):
    path = dataset / "manifest.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    for split in body["splits"].values():
        for shard in split["shards"]:
            del shard["index"]
    path.write_text(json.dumps(body), encoding="utf-8")
    with pytest.raises(ChuteError, match=r"has no record index .*run `chute index .*` to write"):
        chute.grain_source(dataset, "train")
    chute.index(dataset)
    assert len(chute.grain_source(dataset, "train")) == 18


def test_a_missing_or_changed_index_is_refused(dataset):
    # a second shard's index: the train split's
    shards = chute.load_manifest(dataset).splits["train"]["shards"]
    (dataset / record_index.FOLDER / shards[1]["index"]["file"]).unlink()
    with pytest.raises(ChuteError, match="is missing: run `chute index"):
        chute.grain_source(dataset, "train")
    chute.index(dataset)
    index = dataset / record_index.FOLDER / shards[0]["index"]["file"]
    data = bytearray(index.read_bytes())
    data[-1] ^= 1
    index.write_bytes(bytes(data))
    with pytest.raises(ChuteError, match="differs from the manifest"):
        chute.grain_source(dataset, "train")
    with pytest.raises(ChuteError, match="`split` must be one of"):
        chute.grain_source(dataset, "test")


def test_a_missing_shard_is_an_error_naming_it_and_chute_verify(dataset):
    shard = chute.load_manifest(dataset).splits["train"]["shards"][1]["file"]
    source = chute.grain_source(dataset, "train")
    (dataset / shard).unlink()  # gone after the source was made: when a record is read
    expected = rf"Shard {shard} of the train split .* is missing.*`chute verify {dataset}`"
    with pytest.raises(ChuteError, match=expected):
        [source[i] for i in range(len(source))]
    with pytest.raises(ChuteError, match=expected):  # gone before: when the dataset is loaded
        chute.load(dataset, engine="grain", batch_size=4, workers=0)


def test_it_reads_through_a_tensorflow_filesystem(shared_dataset):
    import tensorflow as tf

    out = f"ram://chute-grain-{uuid.uuid4().hex}/out"
    tf.io.gfile.makedirs(out)
    for path in shared_dataset.rglob("*"):
        if path.is_file():
            storage.write_atomic(
                f"{out}/{path.relative_to(shared_dataset).as_posix()}", path.read_bytes()
            )
    source = chute.grain_source(out, "train")
    assert not any(source._local)
    expected = all_records(shared_dataset, "train")
    assert [_plain(source[i]) for i in reversed(range(len(source)))] == expected[::-1]
    assert storage.is_local(str(shared_dataset)) and len(pickle.loads(pickle.dumps(source))) == 18


def test_importing_it_loads_neither_tensorflow_nor_grain():
    code = (
        "import sys, chute.read.grain.source; "
        "print(sorted(m for m in ('tensorflow', 'keras', 'jax', 'grain') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_open_shards_are_bounded_whatever_the_shard_count(many_shards, monkeypatch):
    """One descriptor per shard would run out at ImageNet's 1,024 shards and ulimit -n
    1024: a source keeps at most max_open_files() open, the ones read longest ago closed,
    and still reads every record, from several threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    from chute.read.grain import source as source_lib

    monkeypatch.setattr(source_lib, "max_open_files", lambda wanted=0: 3)
    source = chute.grain_source(many_shards, "train")
    assert len(source.shard_starts) == 96
    before = _open_descriptors()
    expected = [record["key"] for record in all_records(many_shards, "train")]
    with ThreadPoolExecutor(4) as pool:  # reads under way keep their file open
        keys = list(pool.map(lambda i: source[i]["key"], range(len(source))))
    assert keys == expected
    assert len(source._fds) <= 3 and _open_descriptors() - before <= 3
    source.close()
    assert not source._fds and _open_descriptors() <= before


def test_the_open_file_limit_follows_rlimit_nofile():
    """A share of the process's own limit, read in the process that reads (a worker may
    run under another limit than the process that made the source); raised first toward
    the hard limit where a split has more shards than the share (as ``ulimit -n`` would),
    never past a hard limit (``ulimit -n N`` sets both)."""
    resource = pytest.importorskip("resource")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = (
        "import resource, sys; from chute.read.grain.limits import max_open_files; "
        "soft, hard, wanted = map(int, sys.argv[1:]); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard if hard else "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
        "print(max_open_files(wanted), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    cases = [  # (soft, hard (0: as it is), shards) -> (share, soft limit after)
        ((24, 0, 0), (4, 24)), ((256, 0, 0), (32, 256)), ((1024, 0, 0), (128, 1024)),
        ((256, 256, 1024), (32, 256)),  # ulimit -n 256: the share holds, whatever the shards
        ((256, 0, 1024), (1024, 8192)),  # room under the hard limit: raised for 1,024 shards
    ]  # fmt: skip
    for (soft, hard_asked, wanted), expected in cases:
        if hard != resource.RLIM_INFINITY and max(soft, hard_asked, 8192) > hard:
            continue
        args = [str(soft), str(hard_asked), str(wanted)]
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        assert tuple(map(int, done.stdout.split())) == expected, (soft, hard_asked, wanted)


def test_record_indexes_load_without_a_python_object_a_record(many_shards, monkeypatch):
    """1.28M records: the offsets and lengths are copied array to array, never listed
    (a Python int a record, twice), and give the same records."""
    expected = [record["key"] for record in all_records(many_shards, "train")]

    class Unlisted(np.ndarray):
        def tolist(self):
            raise AssertionError("a record index was turned into Python objects")

    real = record_index.RecordIndex.from_bytes

    def unlisted(data, where="the record index"):
        index = real(data, where)
        return record_index.RecordIndex(
            index.offsets.view(Unlisted), index.lengths.view(Unlisted), index.shard_bytes
        )

    monkeypatch.setattr(record_index.RecordIndex, "from_bytes", staticmethod(unlisted))
    source = chute.grain_source(many_shards, "train")
    assert [source[i]["key"] for i in range(len(source))] == expected
