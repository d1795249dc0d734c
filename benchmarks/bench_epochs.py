"""Per-epoch cost of a user's own ``model.fit`` on chute's datasets, quiet and under load.

Issue #38 item 2: ``model.fit(train, validation_data=val, epochs=N)`` with
``engine="grain"`` paid for worker processes started again at every epoch and every
validation (seconds each: a spawned process imports the script's modules again, TensorFlow
and Keras among them), 14-21 s an epoch on 540 tiny images on a loaded machine. This runs
that fit in a fresh process per configuration (the Grain engine with worker processes, with
threads, and the tf.data engine), on a quiet machine and while a load job (one busy process
per core) runs, and reports each epoch's wall time: the first (workers start, graphs trace)
apart from the rest, whose median and maximum are the per-epoch overhead (the model is
tiny: its own compute is a few milliseconds an epoch).

    .venv/bin/python benchmarks/bench_epochs.py --epochs 8 --json benchmarks/results/epochs.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FIT = """
import json, sys, time
import chute, keras

class Times(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        TIMES.append(time.perf_counter() - self.started)

TIMES = []
if __name__ == "__main__":
    data, engine, workers, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    options = {"engine": engine, **({"workers": workers} if engine == "grain" else {})}
    train = chute.load(data, batch_size=32, seed=0, **options)
    val = chute.load(data, "val", batch_size=32, **options)
    model = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Rescaling(1 / 255),
                              keras.layers.Flatten(), keras.layers.Dense(6)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(train, validation_data=val, epochs=epochs, verbose=0, callbacks=[Times()])
    print("TIMES", json.dumps(TIMES))
"""


def _busy() -> None:
    while True:
        pass


def _dataset(root: Path) -> Path:
    import numpy as np

    import chute

    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (600, 16, 16, 1), dtype=np.uint8)
    np.savez(root / "arrays.npz", x=images, y=np.arange(600) % 6)
    chute.convert(root / "arrays.npz", root / "shards", val_fraction=0.1, min_shards=4)
    return root / "shards"  # train 540, val 60


def _fit(data: Path, script: Path, engine: str, workers: int, epochs: int) -> list[float]:
    done = subprocess.run(
        [sys.executable, str(script), str(data), engine, str(workers), str(epochs)],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.split("TIMES", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    configs = [("grain", 2), ("grain", 0), ("tf", 0)]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        data = _dataset(Path(work))
        script = Path(work) / "fit.py"
        script.write_text(FIT)
        for loaded in (False, True):
            load = []
            if loaded:  # one busy process per core: a machine another job keeps busy
                load = [
                    multiprocessing.Process(target=_busy, daemon=True)
                    for _ in range(os.cpu_count() or 2)
                ]
                for process in load:
                    process.start()
            try:
                for engine, workers in configs:
                    times = _fit(data, script, engine, workers, args.epochs)
                    rest = times[1:]
                    rows.append({
                        "engine": engine, "workers": workers, "loaded": loaded,
                        "first_s": round(times[0], 3),
                        "median_after_s": round(statistics.median(rest), 3),
                        "max_after_s": round(max(rest), 3),
                    })  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                for process in load:
                    process.terminate()
    print("\n| engine | workers | machine | first epoch s | later epochs: median s | max s |")
    print("|---|---:|---|---:|---:|---:|")
    for row in rows:
        machine = "loaded (a busy process per core)" if row["loaded"] else "quiet"
        print(f"| {row['engine']} | {row['workers']} | {machine} | {row['first_s']:.2f} | "
              f"{row['median_after_s']:.3f} | {row['max_after_s']:.3f} |")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"epochs": args.epochs, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
