"""Benchmark: test accuracy against training CPU-seconds, chute's defaults vs the tutorial CNN.

    make bench-accuracy            # or: python benchmarks/bench_accuracy.py

On real and realistic data this machine has, each split into train and a
held-out test set (chute converts the same arrays; its val split is a
stratified tenth of train, as a train/test source gets):

* ``glyphs``: 36 classes of characters drawn at random angles, offsets and
  scales with noise (``chute.tools.samples.render_glyph``), 28x28 grayscale,
  20,000 train / 4,000 test; ``glyphs-small``: 4,000 train of the same kind
  (111 a class), the same 4,000 test;
* ``digits``: scikit-learn's 1,797 handwritten digits (8x8, 10 classes)
  upsampled to 28x28, 1,437 train / 360 test;
* ``photos``: 32x32 RGB crops of 16 scenes from scikit-image's bundled
  pictures (the astronaut, the coffee cup, the rocket, ...; each crop at a random
  place, scale and brightness, grayscale pictures as RGB), 8,000 train / 2,000 test.

Runs (5 epochs at batch 128, each in a fresh process, seeds ``--seeds``):

* ``tutorial``: the TensorFlow tutorial's 2-conv CNN (5x5 convs 32/64 with max
  pooling, Dense 1024, dropout 0.4, Adam 1e-3) by plain ``model.fit`` on the
  in-memory arrays;
* ``chute``: ``chute.train`` with every default (the recipe chosen from the data);
* ablations (``--ablate``, first seed): chute's defaults with one choice turned
  the other way: ``augment-on`` (translations, and flips for the colour photos),
  ``no-smoothing`` (label smoothing 0), ``constant`` (Adam 1e-3, no schedule) and
  ``kannada-cnn`` (the model that was the default before the recipe). A run with
  flips is scored with flip test-time augmentation, as its bundle is, and without
  (``... no-tta``).

After every epoch a callback evaluates the test split (its CPU time is taken
out) and records the run's CPU-seconds (user + system of the process since
``fit`` began: training, and chute's validation) and wall seconds. The
``budget`` column is each run's best test accuracy within the tutorial's total
CPU-seconds of the same seed. Results: a table (mean and spread over seeds),
``--json`` and curves as a PNG (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DATASETS = ("glyphs", "glyphs-small", "digits", "photos")


def _ablations(dataset: str) -> dict[str, dict]:
    """chute's defaults with one choice turned the other way, as chute.train options."""
    return {
        "augment-on": {"augment": "flip,translation" if dataset == "photos" else "translation"},
        "no-smoothing": {"label_smoothing": 0.0},
        "constant": {"schedule": "constant", "learning_rate": 1e-3},
        "kannada-cnn": {"model": "kannada-cnn"},
    }


PICTURES = (
    "astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
    "retina", "colorwheel", "brick", "camera", "coins", "grass", "gravel", "moon", "clock",
    "cell",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-accuracy"))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--ablate", action="store_true", help="also undo each recipe choice")
    parser.add_argument("--json", default="benchmarks/results/accuracy.json")
    parser.add_argument("--plot", default="benchmarks/figures/accuracy.png")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a single run, in its own process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(json.loads(args.one), args)), flush=True)
        return
    runs = []
    seeds = [int(s) for s in args.seeds.split(",")]
    for name in args.datasets.split(","):
        data = _dataset(args.work_dir, name)
        for seed in seeds:
            for kind in ("tutorial", "chute"):
                runs.append(_spawn({"data": data, "dataset": name, "kind": kind, "seed": seed}))
        if args.ablate:
            for kind in _ablations(name):
                runs.append(_spawn({"data": data, "dataset": name, "kind": kind, "seed": seeds[0]}))
        _save(runs, args)
    print()
    print(_table(runs))


def _spawn(job: dict) -> dict:
    """One run in a fresh process (its own CPU clock, no state left by another)."""
    started = time.time()
    argv = [sys.executable, __file__, "--one", json.dumps(job), *_passed()]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{job}: failed\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.time() - started
    curve = result["curve"]
    print(
        f"{job['dataset']:7} {job['kind']:13} seed {job['seed']}: test accuracy "
        f"{curve[-1]['accuracy']:.4f} after {len(curve)} epochs, {curve[-1]['cpu']:.0f} CPU-s, "
        f"{curve[-1]['wall']:.0f} s",
        flush=True,
    )
    return result


def _passed() -> list[str]:
    """The epochs and batch flags of this run, for the child."""
    keep = []
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg in ("--epochs", "--batch-size"):
            keep += [arg, argv[i + 1]]
    return keep


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _one(job: dict, args) -> dict:
    import numpy as np

    arrays = np.load(job["data"] + ".npz")
    x_test, y_test = arrays["x_test"], arrays["y_test"]
    curve: list[dict] = []
    clock = {"cpu": 0.0, "wall": 0.0, "taken": 0.0, "taken_wall": 0.0}
    flips = "flip" in _ablations(job["dataset"]).get(job["kind"], {}).get("augment", "")

    import keras

    class Curve(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            clock.update(cpu=_cpu(), wall=time.monotonic())

        def on_epoch_end(self, epoch, logs=None):
            cpu, wall = _cpu(), time.monotonic()
            scores = self.model.predict(x_test, batch_size=500, verbose=0)
            point = {
                "epoch": epoch + 1,
                "cpu": cpu - clock["cpu"] - clock["taken"],
                "wall": wall - clock["wall"] - clock["taken_wall"],
                "accuracy": float((scores.argmax(1) == y_test).mean()),
            }
            if flips:
                mirrored = self.model.predict(x_test[:, :, ::-1], batch_size=500, verbose=0)
                point["accuracy_no_tta"] = point["accuracy"]
                point["accuracy"] = float(((scores + mirrored).argmax(1) == y_test).mean())
            curve.append(point)
            clock["taken"] += _cpu() - cpu
            clock["taken_wall"] += time.monotonic() - wall

    if job["kind"] == "tutorial":
        _tutorial(arrays, job["seed"], args, Curve())
    else:
        _chute(job, args, Curve())
    return {**job, "curve": curve}


def _tutorial(arrays, seed: int, args, callback) -> None:
    """The TensorFlow tutorial's CNN (tensorflow.org's "Build a Convolutional Neural
    Network using Estimators" layers, as Keras layers) on the in-memory arrays."""
    import keras
    import numpy as np

    x, y = arrays["x_train"], arrays["y_train"]
    classes = int(max(y.max(), arrays["y_test"].max())) + 1
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input(x.shape[1:], dtype="uint8"),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(32, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dropout(0.4),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    model.fit(
        x, y.astype(np.int32), batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
        verbose=0, callbacks=[callback],
    )  # fmt: skip


def _chute(job: dict, args, callback) -> None:
    import chute

    options = {"epochs": args.epochs, "batch_size": args.batch_size, "seed": job["seed"]}
    options.update(_ablations(job["dataset"]).get(job["kind"], {}))
    run = os.path.join(os.path.dirname(job["data"]), "runs", f"{job['kind']}-{job['seed']}")
    chute.train(job["data"], run, overwrite=True, verbose=0, callbacks=[callback], **options)


def _dataset(work_dir: str, name: str) -> str:
    """``WORK/NAME``: the converted shards, beside ``WORK/NAME.npz`` (the arrays); made once."""
    import numpy as np

    import chute

    path = os.path.join(work_dir, name)
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    os.makedirs(work_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    (x_train, y_train), (x_test, y_test) = {
        "glyphs": _glyphs, "glyphs-small": _glyphs_small, "digits": _digits, "photos": _photos
    }[name](rng)  # fmt: skip
    np.savez(path + ".npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    # chute converts the train and test arrays (and cuts its val split from train)
    source = os.path.join(work_dir, f"{name}-source.npz")
    np.savez(source, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    chute.convert(source, path, overwrite=True)
    return path


def _glyphs(rng, train: int = 20_000, test: int = 4_000):
    from chute.tools.samples import class_text, render_glyph

    def make(count: int):
        labels = rng.integers(0, 36, count)
        pixels = [np.asarray(render_glyph(class_text(int(c)), (28, 28), rng)) for c in labels]
        return np.stack(pixels)[..., None] if count else np.zeros((0, 28, 28, 1)), labels.astype(
            np.uint8
        )

    return make(train), make(test)


def _glyphs_small(rng):
    """4,000 train images of the glyphs' kind (111 a class); the glyphs' own test split."""
    train, _ = _glyphs(rng, 4_000, 0)
    _, test = _glyphs(np.random.default_rng(0), 20_000, 4_000)
    return train, test


def _digits(rng):
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = [
        np.asarray(
            Image.fromarray((image * 255 / 16).astype(np.uint8)).resize(
                (28, 28), Image.Resampling.BILINEAR
            )
        )
        for image in digits.images
    ]
    x = np.stack(pixels)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target.astype(np.uint8), test_size=0.2, stratify=digits.target, random_state=0
    )
    return (x_train, y_train), (x_test, y_test)


def _photos(rng):
    import numpy as np
    import skimage.data
    from PIL import Image

    pictures = []
    for name in PICTURES:
        image = np.asarray(getattr(skimage.data, name)())
        if image.ndim == 2:
            image = np.repeat(image[..., None], 3, axis=2)
        pictures.append(Image.fromarray(image[..., :3].astype(np.uint8)))

    def make(count: int):
        labels = rng.integers(0, len(pictures), count)
        out = []
        for label in labels:
            picture = pictures[int(label)]
            width, height = picture.size
            side = rng.uniform(0.2, 0.5) * min(width, height)
            left = rng.uniform(0, width - side)
            top = rng.uniform(0, height - side)
            crop = picture.resize(
                (32, 32), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side)
            )
            pixels = np.asarray(crop, np.float32) * rng.uniform(0.6, 1.4)
            pixels += rng.normal(0, 8, pixels.shape)
            out.append(np.clip(pixels, 0, 255).astype(np.uint8))
        return np.stack(out), labels.astype(np.uint8)

    return make(8_000), make(2_000)


def _budget_accuracy(run: dict, budget: float) -> float | None:
    """The best test accuracy of ``run``'s epochs within ``budget`` CPU-seconds."""
    within = [p["accuracy"] for p in run["curve"] if p["cpu"] <= budget * 1.0001]
    return max(within) if within else None


def _table(runs: list[dict]) -> str:
    lines = [
        "| dataset | run | test accuracy (mean, min-max) | vs tutorial | training CPU-s | "
        "images/CPU-s | x tutorial | wall s | within tutorial's CPU-s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    for dataset in datasets:
        here = [r for r in runs if r["dataset"] == dataset]
        tutorial = {r["seed"]: r for r in here if r["kind"] == "tutorial"}
        base_acc = statistics.mean(t["curve"][-1]["accuracy"] for t in tutorial.values())
        base_speed = statistics.mean(_speed(t) for t in tutorial.values())
        kinds = list(dict.fromkeys(r["kind"] for r in here))
        kinds = [
            shown
            for kind in kinds
            for shown in (kind, f"{kind} no-tta")
            if not shown.endswith(" no-tta")
            or any("accuracy_no_tta" in r["curve"][-1] for r in here if r["kind"] == kind)
        ]
        for kind in kinds:
            plain = kind.removesuffix(" no-tta")
            chosen = [r for r in here if r["kind"] == plain]
            if kind != plain:
                chosen = chosen[:1]
                accs = [r["curve"][-1]["accuracy_no_tta"] for r in chosen]
            else:
                accs = [r["curve"][-1]["accuracy"] for r in chosen]
            mean = statistics.mean(accs)
            spread = f"{min(accs):.4f}-{max(accs):.4f}" if len(accs) > 1 else "1 seed"
            cpu = statistics.mean(r["curve"][-1]["cpu"] for r in chosen)
            wall = statistics.mean(r["curve"][-1]["wall"] for r in chosen)
            speed = statistics.mean(_speed(r) for r in chosen)
            within = [
                _budget_accuracy(r, tutorial[r["seed"]]["curve"][-1]["cpu"])
                for r in chosen
                if r["seed"] in tutorial
            ]
            within = [w for w in within if w is not None]
            budget = f"{statistics.mean(within):.4f}" if within and kind == plain else "-"
            lines.append(
                f"| {dataset} | {kind} | {mean:.4f} ({spread}) | {100 * (mean - base_acc):+.1f} pt "
                f"| {cpu:.0f} | {speed:,.0f} | {speed / base_speed:.2f} | {wall:.0f} | {budget} |"
            )
    return "\n".join(lines)


def _speed(run: dict) -> float:
    """Training images per CPU-second over the run."""
    return run["images"] / run["curve"][-1]["cpu"]


def _save(runs: list[dict], args) -> None:
    import numpy as np

    for run in runs:  # the training images each run went through
        if "images" not in run:
            arrays = np.load(run["data"] + ".npz")
            train = len(arrays["y_train"])
            if run["kind"] != "tutorial":  # chute trains on train less its val tenth
                import chute

                train = chute.load_manifest(run["data"]).num_examples("train")
            run["images"] = train // args.batch_size * args.batch_size * args.epochs
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "runs": runs}, handle, indent=1)
    if args.plot:
        _plot(runs, args.plot)


def _plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    columns = 2 if len(datasets) > 2 else len(datasets)
    rows = -(-len(datasets) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 4.6 * rows), squeeze=False)
    colours = {"tutorial": "tab:gray", "chute": "tab:blue"}
    others = {
        "augment-on": "tab:purple", "no-smoothing": "tab:orange", "constant": "tab:green",
        "kannada-cnn": "tab:red",
    }  # fmt: skip
    for axis in axes.flat[len(datasets) :]:
        axis.set_visible(False)
    for axis, dataset in zip(axes.flat, datasets, strict=False):
        for run in (r for r in runs if r["dataset"] == dataset):
            cpu = [p["cpu"] for p in run["curve"]]
            accuracy = [100 * p["accuracy"] for p in run["curve"]]
            colour = colours.get(run["kind"], others.get(run["kind"]))
            main = run["kind"] in colours
            label = run["kind"] if run["seed"] == min(
                r["seed"] for r in runs if r["kind"] == run["kind"]
            ) else None  # fmt: skip
            axis.plot(
                cpu, accuracy, marker="o" if main else ".", color=colour, alpha=0.9 if main else
                0.6, linewidth=2 if main else 1, linestyle="-" if main else "--", label=label,
            )  # fmt: skip
        axis.set_title(f"{dataset}: test accuracy per epoch")
        axis.set_xlabel("training CPU-seconds (2-core machine)")
        axis.set_ylabel("test accuracy (%)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
