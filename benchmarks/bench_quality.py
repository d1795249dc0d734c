"""Benchmark: does chute's own CNN learn at least as well as a plain Keras CNN?

    python benchmarks/bench_quality.py --json benchmarks/results/quality.json

On the same shards, epochs and batch size, chute's built-in model trained by
``chute train`` (``kannada-cnn`` on 75x75 grayscale glyphs, ``cifar-cnn`` on a
CIFAR-shaped ``.npz`` of 32x32 RGB glyphs) against the plain CNN of the Keras
tutorials (Conv2D 32/64/64 with MaxPool, Flatten, Dense 128, Adam at 1e-3),
fed by ``chute.load``: the best validation accuracy of each, and the test
accuracy of each one's best epoch (chute's bundle; the plain model's weights of
its best validation epoch). ``--before`` adds chute's model as
``chute.build_model`` builds it when not told the steps of an epoch (BatchNorm
momentum 0.9, as ``chute train`` built it before the momentum followed the
steps), trained like the plain CNN.

The glyphs (``chute.make_sample_folder``'s: characters at random angles,
offsets and scales, with noise) are generated once into ``--work-dir``; every
model is seeded with ``--seed`` (its weights and its data order).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The dataset of each model: a folder of grayscale glyphs (the Kannada case) or an .npz
# of RGB glyph arrays (the CIFAR case); --sizes gives its training images per class.
DATASETS = {
    "kannada-cnn": {"kind": "folder", "size": 75, "classes": 20},
    "cifar-cnn": {"kind": "npz", "size": 32, "classes": 10},
}
SIZES = "kannada-cnn=30,60 cifar-cnn=100,300"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-quality"))
    parser.add_argument(
        "--sizes", default=SIZES, help="MODEL=N,N,...: training images per class of each run"
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--before", action="store_true", help="add chute's model at momentum 0.9")
    parser.add_argument("--json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    rows = []
    for item in args.sizes.split():
        name, counts = item.split("=")
        for per_class in (int(n) for n in counts.split(",")):
            shards = _dataset(args.work_dir, name, per_class)
            rows.append(_compare(shards, name, per_class, args))
            print(_table(rows[-1:], header=not rows[:-1]), flush=True)
    print()
    print(_table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=1)


def _dataset(work_dir: str, name: str, per_class: int) -> str:
    """Converted shards of ``per_class`` training images per class, a tenth as many for
    validation and a fifth for testing; made once."""
    import numpy as np

    import chute
    from chute.tools.samples import class_text, render_glyph

    spec = DATASETS[name]
    shards = os.path.join(work_dir, f"{name}-{per_class}")
    if os.path.exists(os.path.join(shards, "manifest.json")):
        return shards
    if spec["kind"] == "folder":  # the Kannada case: a folder of grayscale images
        images = os.path.join(work_dir, f"glyphs-{per_class}")
        chute.make_sample_folder(
            images,
            num_classes=spec["classes"],
            images_per_class=round(per_class / 0.7),
            seed=per_class,
        )
        chute.convert(
            images,
            shards,
            image_size=spec["size"],
            color_mode="grayscale",
            val_fraction=0.1,
            test_fraction=0.2,
            overwrite=True,
        )
        return shards
    # The CIFAR case: an .npz of uint8 RGB arrays, one pair per split
    rng = np.random.default_rng(per_class)
    size = (spec["size"], spec["size"])

    def arrays(count: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.repeat(np.arange(spec["classes"]), count)
        rng.shuffle(labels)
        pixels = [np.asarray(render_glyph(class_text(y), size, rng, rgb=True)) for y in labels]
        return np.stack(pixels), labels.astype(np.uint8)

    splits = {"train": per_class, "val": max(1, per_class // 10), "test": max(1, per_class // 5)}
    named = {}
    for split, count in splits.items():
        named[f"x_{split}"], named[f"y_{split}"] = arrays(count)
    source = os.path.join(work_dir, f"glyphs-rgb-{per_class}.npz")
    os.makedirs(work_dir, exist_ok=True)
    np.savez(source, **named)
    chute.convert(source, shards, overwrite=True)
    return shards


def _plain_cnn(input_shape, num_classes: int):
    """The Keras tutorials' CNN: no BatchNorm, no Dropout."""
    import keras

    return keras.Sequential(
        [
            keras.Input(input_shape, dtype="uint8"),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ],
        name="plain_cnn",
    )


def _fit_keras(model, shards: str, args) -> dict:
    """Trains ``model`` on ``chute.load``'s batches as chute train does (Adam at 1e-3, the
    same seed and order); the best validation accuracy and that epoch's test accuracy."""
    import keras

    import chute

    train = chute.load(shards, "train", batch_size=args.batch_size, seed=args.seed)
    val = chute.load(shards, "val", batch_size=args.batch_size, training=False)
    test = chute.load(shards, "test", batch_size=args.batch_size, training=False)
    model.compile(
        keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    best = {"val": -1.0, "weights": None}

    class KeepBest(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs["val_accuracy"] > best["val"]:
                best.update(val=float(logs["val_accuracy"]), weights=model.get_weights())

    started = time.perf_counter()
    model.fit(train, validation_data=val, epochs=args.epochs, callbacks=[KeepBest()], verbose=0)
    seconds = time.perf_counter() - started
    model.set_weights(best["weights"])
    test_accuracy = model.evaluate(test, verbose=0)[1]
    return {"val": best["val"], "test": float(test_accuracy), "seconds": round(seconds, 1)}


def _compare(shards: str, name: str, per_class: int, args) -> dict:
    import keras

    import chute

    manifest = chute.load_manifest(shards)
    shape = (manifest.image.height, manifest.image.width, manifest.image.channels)
    train_images = manifest.num_examples("train")
    row = {
        "model": name,
        "train_images": train_images,
        "val_images": manifest.num_examples("val"),
        "test_images": manifest.num_examples("test"),
        "steps": train_images // args.batch_size * args.epochs,
    }
    with tempfile.TemporaryDirectory() as run_dir:
        started = time.perf_counter()
        result = chute.train(
            shards,
            run_dir,
            model=name,
            epochs=args.epochs,
            batch_size=args.batch_size,
            seed=args.seed,
            overwrite=True,
            verbose=0,
        )
        seconds = time.perf_counter() - started
        test = chute.evaluate(result.bundle, shards, split="test")
    row["chute"] = {
        "val": result.best_val_accuracy,
        "test": test.accuracy,
        "seconds": round(seconds, 1),
    }
    keras.utils.set_random_seed(args.seed)
    row["plain"] = _fit_keras(_plain_cnn(shape, manifest.num_classes), shards, args)
    if args.before:
        keras.utils.set_random_seed(args.seed)
        # steps_per_epoch=None: every BatchNorm keeps momentum 0.9, as before
        before = chute.build_model(name, input_shape=shape, num_classes=manifest.num_classes)
        row["before"] = _fit_keras(before, shards, args)
    return row


def _table(rows: list[dict], header: bool = True) -> str:
    columns = ["chute", "plain", "before"]
    shown = [c for c in columns if any(c in row for row in rows)]
    lines = []
    if header:
        names = " | ".join(f"{c} val | {c} test" for c in shown)
        lines += [
            f"| model | train/val/test images | steps | {names} |",
            "|---|---|---|" + "---|---|" * len(shown),
        ]
    for row in rows:
        cells = " | ".join(
            f"{row[c]['val']:.3f} | {row[c]['test']:.3f}" if c in row else "- | -" for c in shown
        )
        sizes = f"{row['train_images']}/{row['val_images']}/{row['test_images']}"
        lines.append(f"| {row['model']} | {sizes} | {row['steps']} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
