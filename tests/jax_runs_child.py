"""Every JAX run of tests/fit/test_jax.py, in one child process (see the comment above
``jax_runs`` there): ``python jax_runs_child.py DATA ROOT PER_DEVICE``, with
``KERAS_BACKEND=tensorflow`` in its environment (its first stage, the CLI, must choose JAX).

Each stage's stdout and stderr, down to the file descriptors, go to its own folder under
ROOT; ROOT/report.json holds what each stage found, its seconds, and the traceback of a
stage that failed (the others still run; only the tests reading it fail).
"""

# Keras and chute are imported after the CLI stage: that stage must be the first to import
# Keras, so that its --backend flag (not KERAS_BACKEND) chooses JAX.
# ruff: noqa: E402

import contextlib
import dataclasses
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

data, root, per_device = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
report = {"errors": {}, "seconds": {}}


@contextlib.contextmanager
def stage(name):
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(folder / "out.txt", "w") as out, open(folder / "err.txt", "w") as err:
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            yield folder
        except BaseException:  # SystemExit too: the stage failed, the others still run
            report["errors"][name] = traceback.format_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
    report["seconds"][name] = round(time.perf_counter() - start, 1)
    (root / "report.json").write_text(json.dumps(report))


def python_m_chute(*args):
    sys.argv = ["chute", *map(str, args)]
    try:
        runpy.run_module("chute", run_name="__main__", alter_sys=True)
        code = None
    except SystemExit as done:
        code = done.code
    assert code in (0, None), f"chute {args[0]} exited {code}"


assert "keras" not in sys.modules and os.environ["KERAS_BACKEND"] == "tensorflow"
cli = root / "cli"
with stage("cli-train"):
    python_m_chute(
        "train",
        data,
        "--run-dir",
        cli / "run",
        "--backend",
        "jax",
        "--strategy",
        "cpu",
        "--epochs",
        5,
        "--batch-size",
        per_device,
        "--early-stopping",
        1,
        "--augment",
        "contrast,mixup",
        "--augment-on",
        "device",
        "--class-weights",
        "balanced",
    )
with stage("cli-evaluate"):
    python_m_chute("evaluate", cli / "run", data, "--out", cli / "eval")

import keras
import numpy as np
import tensorflow as tf
from helpers import Killed, dying_epoch_timer

import chute
from chute.fit import train as training
from chute.fit.models import build_model
from chute.fit.trainable import backbone_of, with_augmentation
from chute.read.augment import DeviceAugmentation

with stage("seeds"):
    with keras.distribution.DataParallel(devices=keras.distribution.list_devices()).scope():
        inputs = keras.Input((8, 8, 1), dtype="uint8")
        flat = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(flat))
        trainer = with_augmentation(model, DeviceAugmentation(["contrast", "mixup"], seed=1))
        trainer.compile(optimizer="adam", loss="categorical_crossentropy")
        seeds = [v for v in trainer.non_trainable_variables if "seed" in v.path]
        before = [np.asarray(v.value).tolist() for v in seeds]
        images = np.random.default_rng(0).integers(0, 256, (24, 8, 8, 1), dtype=np.uint8)
        labels = np.eye(2)[np.arange(24) % 2]
        trainer.fit(images, labels, batch_size=8, epochs=1, verbose=0)  # 3 steps
        after = [np.asarray(v.value).tolist() for v in seeds]
    report["seeds"] = {"before": before, "after": after}

images = sorted(str(p) for p in (data.parent / "src").rglob("*.png"))
with stage("resumed") as folder:
    run = folder / "run"
    options = dict(
        model="kannada-cnn",
        epochs=4,
        batch_size=per_device,
        class_weights="balanced",
        label_smoothing=0.0,  # val_loss is compared with evaluate's plain cross-entropy
        verbose=0,
    )
    real_timer = training._epoch_timer
    training._epoch_timer = dying_epoch_timer(training, lambda epoch: epoch == 1)
    with contextlib.suppress(Killed):
        chute.train(data, run, **options)
    training._epoch_timer = real_timer
    left = {"backup": (run / "backup").exists(), "bundle": (run / "bundle").exists()}
    result = chute.train(data, run, **options)
    predicted = chute.predict(run, images, top_k=3)
    chute.export(run, folder / "savedmodel")
    report["resumed"] = {
        "left": left,
        "result": dataclasses.asdict(result),
        "backend": keras.backend.backend(),
        "tensorflow_devices": sorted({d.device_type for d in tf.config.get_visible_devices()}),
        "predictions": [[p.path, p.top] for p in predicted.predictions],
    }

with stage("fine-tuned") as folder:
    weights = folder / "start.weights.h5"
    start = build_model("MobileNet", input_shape=(32, 32, 1), num_classes=3)
    rng = np.random.default_rng(0)  # "pretrained": weights whose features are not all 0
    start.set_weights(
        [
            np.abs(rng.normal(0, 0.05, w.shape)) + 1
            if "variance" in w.path
            else rng.normal(0, 0.05, w.shape)
            for w in start.weights
        ]
    )
    start.save_weights(weights)
    result = chute.train(
        data,
        folder / "run",
        model="MobileNet",
        image_size=32,
        weights=str(weights),
        fine_tune="7",  # the top two convolutions, their BatchNorm and ReLU layers, the pooling
        epochs=2,
        batch_size=per_device,
        verbose=0,
    )
    end = keras.models.load_model(folder / "run" / "checkpoints" / "last.keras")  # after both
    changed = {"conv": [], "batchnorm": []}
    for before, after in zip(backbone_of(start).layers, backbone_of(end).layers, strict=True):
        kind = "batchnorm" if "BatchNormalization" in type(after).__name__ else "conv"
        for old, new in zip(before.get_weights(), after.get_weights(), strict=True):
            changed[kind].append(bool(np.any(old != new)))
    report["fine-tuned"] = {"epochs": result.epochs_run, "changed": changed}

with stage("multi-label") as folder:
    from helpers import write_multi_label_list

    listed = write_multi_label_list(folder / "src", 96)
    chute.convert(listed, folder / "data", val_fraction=0.25, allow_empty_labels=True, workers=1)
    result = chute.train(
        folder / "data", folder / "run", model="kannada-cnn", epochs=2,
        batch_size=per_device, positive_weights="balanced", verbose=0,
    )  # fmt: skip
    bundle = chute.load_bundle(folder / "run")
    predicted = chute.predict(
        folder / "run", sorted(str(p) for p in (folder / "src").rglob("*.png"))[:3]
    )
    report["multi-label"] = {
        "result": dataclasses.asdict(result),
        "thresholds": bundle.thresholds,
        "output": list(bundle.model.output_shape),
        "activation": bundle.model.get_layer("predictions").get_config()["activation"],
        "predictions": len(predicted.predictions),
    }
(root / "report.json").write_text(json.dumps(report))
