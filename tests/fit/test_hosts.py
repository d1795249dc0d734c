"""Per-host input: how many hosts a strategy spans, and Keras's fit fed one distributed
dataset per host (the TPU pod path), run here on one host with the decision forced.

Several worker processes reading their shares are in test_distributed.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image

import chute
from chute.fit import strategy as strategy_lib
from chute.fit import train as train_module
from chute.fit.devices import Devices
from chute.lazy import keras, tf


class _Resolver:
    def __init__(self, cluster: dict):
        self.cluster = cluster

    def cluster_spec(self):
        return tf.train.ClusterSpec(self.cluster)


@pytest.mark.parametrize(
    ("cluster", "hosts"),
    [
        ({"worker": ["t0:8470", "t1:8470", "t2:8470", "t3:8470"]}, 4),  # a v4-32 slice
        ({"worker": ["t0:8470"]}, 1),  # a TPU VM
        ({}, 1),  # a local TPU: the resolver names no cluster
    ],
)
def test_a_tpu_slice_has_as_many_hosts_as_its_resolver_names_workers(cluster, hosts):
    assert strategy_lib.count_hosts("tpu", _Resolver(cluster)) == hosts


def test_several_workers_are_hosts_and_one_machine_is_one(monkeypatch):
    cluster = {"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker"}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    assert strategy_lib.count_hosts("multiworker") == 3
    for kind in ("cpu", "gpu", "multi-gpu"):
        assert strategy_lib.count_hosts(kind) == 1
    assert Devices("multiworker", hosts=3).per_host
    assert not Devices("multi-gpu", replicas=2).per_host
    two = strategy_lib.count_hosts("tpu", _Resolver({"worker": ["t0:8470", "t1:8470"]}))
    assert Devices("tpu", hosts=two).per_host


@pytest.fixture(scope="module")
def levels(tmp_path_factory) -> Path:
    """3 classes told apart by brightness, 4 shards per split."""
    root = tmp_path_factory.mktemp("hosts")
    rng = np.random.default_rng(1)
    for k, name in enumerate(("dark", "mid", "light")):
        for i in range(30):
            pixels = np.clip(rng.normal(40 + 85 * k, 12, (16, 16)), 0, 255).astype(np.uint8)
            write_image(root / "src" / name / f"{i:03d}.png", pixels)
    chute.convert(root / "src", root / "out", workers=1, val_fraction=0.3, min_shards=4)
    return root / "out"


def test_keras_fit_on_per_host_datasets_validates_every_example_once(
    levels, tmp_path, monkeypatch, caplog
):
    # What a TPU pod slice runs: train and val as distributed datasets (one pipeline per
    # host, repeated), fit told its steps, val padded to full batches with weight 0.
    real_devices = strategy_lib.tensorflow_devices

    def on_two_hosts(kind, *, tpu=None):  # this host, as one of a slice's two
        return dataclasses.replace(real_devices(kind, tpu=tpu), hosts=2)

    monkeypatch.setattr(strategy_lib, "tensorflow_devices", on_two_hosts)
    loaded = []
    real_load = train_module.load

    def spy(*args, **kwargs):
        options = args[2]  # chute.fit.reading's LoadOptions for the split
        loaded.append((args[1], kwargs.get("strategy") is not None, options.repeat))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(train_module, "load", spy)
    with caplog.at_level("INFO", logger="chute.read.tf.engine"):
        # integer labels (no label smoothing): the model evaluates chute.load's val as is
        result = chute.train(
            levels, tmp_path / "run", model="kannada-cnn", epochs=2, batch_size=8, verbose=0,
            label_smoothing=0.0,
        )  # fmt: skip
    assert ("train", True, True) in loaded and ("val", True, True) in loaded
    assert "input pipeline 0 of 1 reads 4 shard(s)" in caplog.text
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert len(history["val_accuracy"]) == result.epochs_run == 2
    # Validation over the padded, repeated val data equals evaluating the last epoch's
    # model on the val split once: every example counted once, the padding not at all.
    model = keras.models.load_model(tmp_path / "run" / "checkpoints" / "last.keras")
    val = chute.load(levels, "val", batch_size=8, training=False)
    once = model.evaluate(val, return_dict=True, verbose=0)
    assert math.isclose(history["val_accuracy"][-1], once["accuracy"], abs_tol=1e-6)
    assert math.isclose(history["val_loss"][-1], once["loss"], rel_tol=1e-4)
