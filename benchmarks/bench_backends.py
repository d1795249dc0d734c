"""Benchmark: Keras on JAX against Keras on TensorFlow, fed by the same chute.load pipeline.

    python benchmarks/bench_backends.py --repeats 3 --json benchmarks/results/backends.json

Keras's backend is fixed when Keras is imported, so each measurement is a fresh
process (``KERAS_BACKEND=tensorflow`` or ``jax``, one CPU device each, as
``chute train`` runs on this machine), and rounds alternate the two. Each child
measures, on 75x75 grayscale glyph shards (``cache="memory"``, batches of 128):

1. ``input``: batches/s of the pipeline alone, iterated as NumPy arrays (what
   Keras's JAX trainer takes from tf.data; the same pipeline on both backends);
2. ``hand-over``: batches/s of ``model.fit`` with a trivial model (rescale,
   global average pool, one dense layer): the step costs ~nothing, so this is
   Keras's tf.data -> backend hand-over plus the training loop, with chute's
   own set-up on JAX (``DataParallel`` over the local devices);
3. ``train``: ``chute.train`` of ``kannada-cnn``, images/s (the median epoch
   of three; the first holds the compiles).

Every timed pass lasts at least ``--seconds``. Reported: medians per backend,
JAX / TensorFlow for each figure, and each backend's hand-over as a share of
its input alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

BACKENDS = ("tensorflow", "jax")

CHILD = """
import json, os, sys, time
shards, run_dir, seconds, batch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
import keras
import chute
from chute.fit import backend as backend_lib

backend = keras.backend.backend()
if backend == "jax":
    backend_lib.keep_tensorflow_off_accelerators()
manifest = chute.load_manifest(shards)
load = dict(batch_size=batch, cache="memory", repeat=True, seed=0, label_mode="int")


def rate(step, warm=20):
    # batches/s of `step(n)` over a pass of at least `seconds`, after a warm-up
    step(warm)
    started, n = time.perf_counter(), 50
    step(n)
    took = time.perf_counter() - started
    n = max(n, int(n * seconds / max(took, 1e-6)))
    started = time.perf_counter()
    step(n)
    return n / (time.perf_counter() - started)


dataset = chute.load(shards, "train", **load)
batches = dataset.as_numpy_iterator()
def pull(n):
    for _ in range(n):
        next(batches)
figures = {"input": rate(pull)}

scope = backend_lib.devices("jax").scope() if backend == "jax" else None
import contextlib
with scope or contextlib.nullcontext():
    inputs = keras.Input((75, 75, 1), dtype="uint8")
    pooled = keras.layers.GlobalAveragePooling2D()(keras.layers.Rescaling(1 / 255)(inputs))
    outputs = keras.layers.Dense(manifest.num_classes, activation="softmax")(pooled)
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy")
    train = chute.load(shards, "train", **load)
    figures["hand-over"] = rate(lambda n: model.fit(train, steps_per_epoch=n, epochs=1, verbose=0))

result = chute.train(shards, run_dir, model="kannada-cnn", epochs=3, batch_size=batch,
                     load={"cache": "memory"}, overwrite=True, verbose=0)
figures["train"] = result.images_per_second
figures["train_replicas"] = result.replicas
print("BENCH " + json.dumps(figures), flush=True)
os._exit(0)
"""


def child(backend: str, shards: str, work: str, seconds: float, batch: int) -> dict:
    """One backend's figures, measured in a fresh process."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    run_dir = os.path.join(work, f"run-{backend}")
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time, never a resume
    args = [sys.executable, "-c", CHILD, shards, run_dir, str(seconds), str(batch)]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{backend} child failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("BENCH ") :])


def make_shards(work: str, classes: int, per_class: int) -> str:
    """75x75 grayscale raw shards of generated glyphs (made once per size)."""
    import chute

    src = os.path.join(work, f"glyphs-{classes}x{per_class}")
    if not os.path.exists(os.path.join(src, ".complete")):
        chute.make_sample_folder(
            src, num_classes=classes, images_per_class=per_class, image_size=(100, 100)
        )
        open(os.path.join(src, ".complete"), "w").close()
    shards = src + "-shards"
    if not os.path.exists(os.path.join(shards, "manifest.json")):
        chute.convert(
            src, shards, image_size=75, color_mode="grayscale", encoding="raw", overwrite=True
        )
    return shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", help="a converted 75x75 grayscale dataset")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--per-class", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=10.0, help="least length of a pass")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()

    os.makedirs(args.work_dir, exist_ok=True)
    shards = args.shards or make_shards(args.work_dir, args.classes, args.per_class)
    runs: dict[str, list[dict]] = {backend: [] for backend in BACKENDS}
    for number in range(args.repeats):
        order = BACKENDS if number % 2 == 0 else BACKENDS[::-1]
        for backend in order:
            runs[backend].append(
                child(backend, shards, args.work_dir, args.seconds, args.batch_size)
            )
            print(f"round {number + 1} {backend}: {runs[backend][-1]}", flush=True)

    names = ("input", "hand-over", "train")
    median = {b: {n: statistics.median(r[n] for r in runs[b]) for n in names} for b in BACKENDS}
    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "batch_size": args.batch_size,
        "median": {b: {n: round(v, 1) for n, v in m.items()} for b, m in median.items()},
        "jax_over_tensorflow": {
            n: round(median["jax"][n] / median["tensorflow"][n], 3) for n in names
        },
        "hand_over_share_of_input": {
            b: round(median[b]["hand-over"] / median[b]["input"], 3) for b in BACKENDS
        },
        "replicas": {b: runs[b][-1]["train_replicas"] for b in BACKENDS},
        "all": runs,
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "all"}, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)


if __name__ == "__main__":
    main()
