"""``chute.load([a, b], weights=...)``: several datasets read as one on both engines.

Every image carries where it came from in its first pixel (``mark + label``), so a batch
says which dataset and which of its classes each image is, after the mixture's channel
conversion and label mapping."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import MIX_MARKS as MARKS
from helpers import MIX_NAMES as NAMES

import chute
from chute.errors import ChuteError
from chute.read.stream import StreamPosition

MIXED = ["cat", "dog", "eel", "fox", "ant"]  # a's classes, then b's new one, then c's


def _origins(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each image's dataset (a name) and its label there, from its first pixel."""
    first = np.asarray(images)[:, 0, 0, 0].astype(int)
    names = np.array(["c" if v < 100 else "a" if v < 200 else "b" for v in first])
    marks = np.array([MARKS[n] for n in names])
    return names, first - marks


def _batches(dataset, count: int | None = None):
    out = []
    for number, batch in enumerate(dataset):
        if count is not None and number >= count:
            break
        out.append(tuple(np.asarray(part) for part in batch))
    return out


GRAIN = {"engine": "grain", "workers": 0}


@pytest.mark.parametrize("engine", ["grain", "tf"])
def test_classes_join_by_name_and_images_take_the_first_datasets_channels(mixable, engine):
    reading = GRAIN if engine == "grain" else {"engine": "tf"}
    train = chute.load(
        [mixable["a"], mixable["b"], mixable["c"]], weights=[2, 1, 1], batch_size=8, seed=3,
        **reading,
    )  # fmt: skip
    assert train.chute.class_names == tuple(MIXED)
    assert train.chute.mixture.label_maps == ((0, 1, 2), (1, 3), (4, 0))
    seen = set()
    for images, labels in _batches(train):
        assert images.shape == (8, 8, 8, 1) and images.dtype == np.uint8  # b's colour to gray
        for name, own, label in zip(*_origins(images), labels.tolist(), strict=True):
            assert MIXED[label] == NAMES[name][own]  # the same class, by name
            seen.add(name)
    assert seen == {"a", "b", "c"}


@pytest.mark.parametrize("engine", ["grain", "tf"])
def test_every_batch_holds_each_datasets_share_exactly_where_the_batch_allows(mixable, engine):
    reading = GRAIN if engine == "grain" else {"engine": "tf"}
    train = chute.load(
        [mixable["a"], mixable["b"]], weights=[0.75, 0.25], batch_size=8, seed=1, **reading
    )
    # An epoch shows a's 90 training images once: 6 a batch.
    assert len(train) == 15 and train.chute.mixture.images == (90, 30)
    batches = _batches(train)
    assert len(batches) == 15
    for images, _ in batches:
        names, _ = _origins(images)
        assert (names == "a").sum() == 6 and (names == "b").sum() == 2


@pytest.mark.parametrize("engine", ["grain", "tf"])
def test_shares_hold_within_one_percent_over_many_batches_of_a_size_that_does_not_divide(
    mixable, engine
):
    reading = GRAIN if engine == "grain" else {"engine": "tf"}
    train = chute.load(
        [mixable["a"], mixable["b"], mixable["c"]], weights=[0.6, 0.3, 0.1], batch_size=7,
        steps=400, seed=5, label_mode=None, **reading,
    )  # fmt: skip
    counts = {"a": 0, "b": 0, "c": 0}
    per_batch = []
    for images in _batches(train):
        names, _ = _origins(images)
        per_batch.append([(names == n).sum() for n in counts])
        for name in counts:
            counts[name] += int((names == name).sum())
    total = 400 * 7
    for name, share in zip(counts, [0.6, 0.3, 0.1], strict=True):
        assert abs(counts[name] / total - share) < 0.01
    # each share rounded down or up in every batch (0.7 of c's a batch: 0 or 1)
    assert np.all(np.abs(np.array(per_batch) - np.array([4.2, 2.1, 0.7])) < 1)
    # and the running totals within one image of their shares
    running = np.cumsum(per_batch, axis=0) - np.outer(np.arange(1, 401), [4.2, 2.1, 0.7])
    assert np.abs(running).max() < 1 + 1e-9


def test_each_dataset_is_drawn_whole_and_anew_on_every_pass_over_it(mixable):
    # b has 36 training images and gives 4 of every 8: a pass over b every 9 batches.
    train = chute.load(
        [mixable["a"], mixable["b"]], weights=[1, 1], batch_size=8, steps=18, seed=2, **GRAIN
    )
    drawn = [
        hashlib.sha256(image.tobytes()).hexdigest()
        for images, _ in _batches(train)
        for image in images
        if _origins(image[None])[0][0] == "b"
    ]
    first, second = drawn[:36], drawn[36:72]
    assert len(set(first)) == 36 and set(first) == set(second)  # every record once a pass
    assert first != second  # a new shuffle each pass


def test_an_epoch_shows_every_image_of_the_first_dataset(mixable):
    # 7 of a's 90 training images a batch: 13 batches, 91 draws of a an epoch
    train = chute.load(
        [mixable["a"], mixable["b"]], weights=[0.7, 0.3], batch_size=10, seed=8, **GRAIN
    )
    assert len(train) == 13 and train.chute.mixture.images[0] == 91
    for _ in range(2):
        seen = {
            hashlib.sha256(image.tobytes()).hexdigest()
            for images, _ in _batches(train)
            for image in images
            if _origins(image[None])[0][0] == "a"
        }
        assert len(seen) == 90  # every one of them, each epoch


def test_class_balanced_sampling_balances_within_each_dataset(mixable):
    train = chute.load(
        [mixable["a"], mixable["c"]], weights=[0.5, 0.5], batch_size=8, steps=200, seed=4,
        sampling="balanced", **GRAIN,
    )  # fmt: skip
    names, own = [], []
    for images, _ in _batches(train):
        n, o = _origins(images)
        names.extend(n)
        own.extend(o)
    names, own = np.array(names), np.array(own)
    assert abs((names == "c").mean() - 0.5) < 0.01  # the datasets' shares hold
    c = own[names == "c"]  # c holds 36 of one class and 6 of the other: drawn alike
    assert abs((c == 1).mean() - 0.5) < 0.05


def _stream_batches(
    paths, position: StreamPosition, count: int, pipelines=1, index=0, augment="crop,flip"
):
    context = types.SimpleNamespace(num_input_pipelines=pipelines, input_pipeline_id=index)
    train = chute.load(
        paths, weights=[0.7, 0.3], batch_size=10 // pipelines, seed=9, augment=augment,
        input_context=context if pipelines > 1 else None, repeat=True, steps=12, **GRAIN,
    )  # fmt: skip
    return _batches(train.stream(position), count)


CHILD = """
import sys, numpy as np
sys.path[:0] = [{tests!r}, {helpers!r}]
from test_mixed_load import _stream_batches
from chute.read.stream import StreamPosition
batches = _stream_batches({paths!r}, StreamPosition(1, 4), 3)
np.savez({out!r}, *[part for batch in batches for part in batch])
"""


def test_a_mixed_run_resumes_mid_epoch_in_a_new_process_with_the_same_batches(mixable, tmp_path):
    paths = [str(mixable["a"]), str(mixable["b"])]
    whole = _stream_batches(paths, StreamPosition(0), 30)  # 12 batches an epoch
    out = tmp_path / "resumed.npz"
    here = Path(__file__).parent
    code = CHILD.format(tests=str(here), helpers=str(here.parent), paths=paths, out=str(out))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=240)
    resumed = list(np.load(out).values())
    expected = [part for batch in whole[16:19] for part in batch]  # epoch 1, batch 4 on
    assert len(resumed) == len(expected)
    for got, want in zip(resumed, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_mixed_run_resumes_on_another_number_of_pipelines(mixable):
    paths = [mixable["a"], mixable["b"]]
    # (Crops are keyed by pipeline, as for one dataset: the same records, compared whole.)
    alone = _stream_batches(paths, StreamPosition(1, 3), 2, augment=())
    halves = [
        _stream_batches(paths, StreamPosition(1, 3), 2, 2, index, augment=()) for index in (0, 1)
    ]
    for number, (images, labels) in enumerate(alone):
        np.testing.assert_array_equal(
            images, np.concatenate([halves[0][number][0], halves[1][number][0]])
        )
        np.testing.assert_array_equal(
            labels, np.concatenate([halves[0][number][1], halves[1][number][1]])
        )


def test_a_mixture_resumes_only_at_a_batch_of_its_own_global_size(mixable):
    train = chute.load([mixable["a"], mixable["b"]], batch_size=8, seed=1, **GRAIN)
    with pytest.raises(ChuteError, match="same global batch size"):
        next(iter(train.stream(StreamPosition(0, 1, offset=3))))


def test_a_version_per_dataset_reads_each_as_it_was(mixable, tmp_path):
    import shutil

    grown = tmp_path / "b"
    shutil.copytree(mixable["b"], grown)
    rng = np.random.default_rng(11)
    x = rng.integers(0, 40, (20, 8, 8, 3), dtype=np.uint8)
    x[:, 0, 0, :] = MARKS["b"] + 1  # foxes
    np.savez(tmp_path / "new.npz", x=x, y=np.zeros(20, int), class_names=np.array(["fox"]))
    chute.convert(tmp_path / "new.npz", grown, append=True, workers=1)
    assert chute.load_manifest(grown).version == 2
    both = [mixable["a"], grown]
    latest = chute.load(both, batch_size=8, seed=1, **GRAIN)
    then = chute.load(both, version=[None, 1], batch_size=8, seed=1, **GRAIN)
    assert latest.chute.mixture.examples == (90, 51) and then.chute.mixture.examples == (90, 36)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: chute.load([p["a"], p["b"]], weights=[1]), "one positive number per dataset"),
        (lambda p: chute.load([p["a"], p["b"]], weights=[1, -1]), r"weights=\[1, -1\]"),
        (lambda p: chute.load([p["a"], f"{p['a']}/"]), "mixed in twice"),
        (lambda p: chute.load(p["a"], weights=[1]), "pass a list of them"),
        (lambda p: chute.load([p["a"], p["b"]], version=1), "one version"),
        (lambda p: chute.load([p["a"], p["b"]], "val"), "read for evaluation"),
        (lambda p: chute.load([p["a"], p["b"]], "val", engine="grain"), "read for evaluation"),
        (lambda p: chute.load([p["a"], p["b"]], steps=0), "steps=0"),
        (
            lambda p: chute.load([p["a"], p["b"]], skip_corrupt=True, engine="grain"),
            "skip_corrupt=True",
        ),
        (lambda p: chute.load([]), "a list of datasets"),
        (lambda p: chute.load([p["a"], p["b"]], sampling={"cat": 2}), "'balanced'"),
        (
            lambda p: chute.load([p["a"], p["b"]], sample_weights=True, engine="grain"),
            "sample_weights=True",
        ),
        (
            lambda p: chute.load([p["a"], p["b"]], data_service="grpc://localhost:1"),
            "not through the tf.data service",
        ),
    ],
)
def test_mixing_refuses_what_it_cannot_read_naming_the_argument(mixable, call, match):
    with pytest.raises(ChuteError, match=match):
        call(mixable)


def test_a_mixture_has_static_batch_shapes_on_both_engines(mixable, multi_label_data, tmp_path):
    """(TPU/XLA compile for them): the images-alone path, and the batch path that
    regroups (raw pixels, multi-label)."""
    reads = [
        chute.load([mixable["a"], mixable["b"]], weights=[0.7, 0.3], batch_size=10),
        chute.load([multi_label_data, _tagged(tmp_path)], weights=[0.7, 0.3], batch_size=10),
        chute.load([mixable["a"], mixable["b"]], weights=[0.7, 0.3], batch_size=10, augment="crop"),
    ]
    for train in reads:
        images, labels = train.element_spec
        assert images.shape[0] == 10 and labels.shape[0] == 10


def _tagged(root: Path) -> Path:
    """A multi-label dataset of 40 16x16 colour images tagged ``stripes`` (bit 1) and
    ``dots`` (bit 2) in turn, its first pixel 250 and the next one 40 x its bits."""
    from PIL import Image

    (root / "img").mkdir(parents=True)
    rows = ["path,labels"]
    for i in range(40):
        bits = i % 4
        image = np.full((16, 16, 3), 30 + i, np.uint8)
        image[0, 0], image[0, 1] = 250, 40 * bits
        Image.fromarray(image).save(root / f"img/{i:03d}.png")
        names = [name for bit, name in ((1, "stripes"), (2, "dots")) if bits & bit]
        rows.append(f"img/{i:03d}.png,{'|'.join(names)}")
    (root / "list.csv").write_text("\n".join(rows) + "\n")
    chute.convert(root / "list.csv", root / "out", allow_empty_labels=True, workers=1)
    return root / "out"


@pytest.mark.parametrize("engine", ["grain", "tf"])
def test_multi_label_datasets_mix_their_label_columns(multi_label_data, tmp_path, engine):
    tagged = _tagged(tmp_path)
    reading = GRAIN if engine == "grain" else {"engine": "tf"}
    train = chute.load([multi_label_data, tagged], batch_size=8, seed=0, **reading)
    first = chute.load_manifest(multi_label_data).class_names  # sorted: blue, green, ...
    assert train.chute.class_names == (*first, "dots") and first[3] == "stripes"
    theirs = 0
    for images, labels in _batches(train):
        assert labels.shape == (8, 5) and labels.dtype == np.float32
        for image, row in zip(images, labels, strict=True):
            if image[0, 0, 0] == 250:  # the tagged dataset's: its columns 0, 1 are 3, 4
                bits = int(image[0, 1, 0]) // 40
                assert row.tolist() == [0, 0, 0, bits & 1, bits >> 1]
                theirs += 1
            else:
                assert row[4] == 0
    assert theirs > 0


def test_class_counts_of_a_mixture_are_its_expected_draws(mixable):
    """What class weights (and multi-label positive weights) of a mixed run come from: each
    class's expected images in as many draws as the first dataset's train split holds."""
    from chute.read.mixture import mixture_of

    mixture = mixture_of([mixable["a"], mixable["b"]], [0.75, 0.25])
    counts, examples = mixture.class_counts("train")
    # a: 90 train images, 30 a class; b: 36, 18 a class; 90 draws: 67.5 of a, 22.5 of b
    assert examples == 90
    np.testing.assert_allclose(counts, [22.5, 22.5 + 11.25, 22.5, 11.25])


@pytest.mark.parametrize("engine", ["grain", "tf"])
def test_a_dataset_in_a_bucket_mixes_with_a_local_one(mixable, s3_endpoint, tmp_path, engine):
    """b in S3 (moto on 127.0.0.1), read through the verified shard cache, mixed with a
    local a: the same batches as with both local."""
    import os

    from object_stores import new_s3_bucket

    from chute.format import storage

    bucket = new_s3_bucket(s3_endpoint) + "/b"
    for top, _, files in os.walk(mixable["b"]):
        for name in files:
            relative = os.path.relpath(os.path.join(top, name), mixable["b"])
            storage.copy(os.path.join(top, name), f"{bucket}/{relative}")
    reading = GRAIN if engine == "grain" else {"engine": "tf"}
    options = dict(weights=[0.75, 0.25], batch_size=8, seed=6, **reading)
    remote = _batches(
        chute.load([mixable["a"], bucket], cache_dir=str(tmp_path / "cache"), **options)
    )
    here = _batches(chute.load([mixable["a"], mixable["b"]], **options))
    assert len(remote) == len(here) == 15
    for (images, labels), (local_images, local_labels) in zip(remote, here, strict=True):
        np.testing.assert_array_equal(images, local_images)
        np.testing.assert_array_equal(labels, local_labels)


def test_an_input_pipeline_that_holds_none_of_a_dataset_is_named(mixable):
    # 40 tf.data input pipelines: b's 36 training images leave the last ones none
    context = types.SimpleNamespace(
        num_input_pipelines=40, input_pipeline_id=39, num_replicas_in_sync=40
    )
    from chute.read.tf.engine import CACHE_BUDGET

    held = CACHE_BUDGET.used
    with pytest.raises(ChuteError, match=r"mixable/b has no examples to read here"):
        chute.load([mixable["a"], mixable["b"]], batch_size=2, input_context=context)
    assert CACHE_BUDGET.used == held  # a's in-memory cache, reserved in its plan, given back
    # each of 4 holds a share (b: 9 images, 20 of them a batch), read in batches of what
    # it holds at most
    context = types.SimpleNamespace(
        num_input_pipelines=4, input_pipeline_id=3, num_replicas_in_sync=4
    )
    train = chute.load([mixable["a"], mixable["b"]], weights=[0.5, 0.5], batch_size=40,
                       input_context=context)  # fmt: skip
    assert len(train) == 2 and len(_batches(train)) == 2
