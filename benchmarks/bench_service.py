"""Benchmark: chute.load through the tf.data service (local workers) against chute.load
directly, same shards, same run: the cost of the hop.

    python benchmarks/bench_service.py --rounds 3 --json benchmarks/results/service.json

Data (generated once into --data, no download, shards kept there too):

* photos: photo-like JPEGs (640-1024 px wide, 4:3 either way, quality 90:
  gradients, shapes, sensor-like noise) in 4 classes, converted with
  ``chute.convert(src, out, shorter_side=256, encoding="jpeg")`` and read the way
  photos are trained: ``image_size=224, augment=["crop", "flip"]``, batch 64.
* glyphs: the 657-class set of bench_convert.py (26,280 grayscale PNGs)
  converted to 75x75 raw records, batch 256.

What runs: for each --workers count N, a cluster of one dispatcher and N workers
started as ``chute data-service`` processes on 127.0.0.1 (all clusters at once;
the idle ones only send heartbeats). Then, for --rounds rounds, timed passes take
turns (the order reversed every other round): ``chute.load`` in this process, and
``chute.load(..., data_service=...)`` through each cluster. A pass builds the
dataset and iterates it epoch after epoch, whole epochs only, until at least
--seconds have passed; every epoch through the service is a new job, and the
time from ``iter()`` to an epoch's first batch (the job's start, for the service)
is reported on its own. Both sides read with ``cache=None`` (the service path
keeps no cache). CPU seconds of this process and of the servers are read from
/proc around each pass.

This measures the hop on ONE machine: the workers run on the same cores as this
process (the trainer), so the service cannot be faster here; the ratio is what
sending the batches through the service costs, not what spare machines gain.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {  # batch size and chute.load options per case
    "photos": (64, {"image_size": 224, "augment": ["crop", "flip"]}),
    "glyphs": (256, {}),
}
HONEST = (
    "one machine: the service's workers share this machine's cores with the trainer "
    "process, so service/direct is the cost of the hop here, not the gain of spare machines"
)


# -- data ---------------------------------------------------------------------------------------


def _photo(args: tuple[str, int]) -> None:
    from PIL import Image, ImageDraw

    root, number = args
    rng = np.random.default_rng(number)
    width = int(rng.integers(640, 1025))
    height = width * 3 // 4
    if number % 3 == 0:
        width, height = height, width
    y, x = np.mgrid[0:height:4, 0:width:4].astype(np.float32)
    small = np.stack(
        [120 + 90 * np.sin(x / rng.uniform(20, 60) + y / rng.uniform(25, 75) + p)
         for p in rng.uniform(0, 6.3, 3)], -1,
    )  # fmt: skip
    image = Image.fromarray(np.clip(small, 0, 255).astype(np.uint8)).resize((width, height))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        box = sorted(rng.integers(0, width, 2)), sorted(rng.integers(0, height, 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.ellipse((box[0][0], box[1][0], box[0][1], box[1][1]), fill=colour)
    noise = rng.integers(-8, 9, (height, width, 3), dtype=np.int16)
    pixels = np.clip(np.asarray(image, np.int16) + noise, 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(
        os.path.join(root, f"class{number % 4}", f"{number:05d}.jpg"), quality=90
    )


def photo_shards(data: str, count: int) -> str:
    """``count`` photo-like JPEGs and their shards (shorter side 256, JPEG), made once."""
    import chute

    src = os.path.join(data, f"service-photos{count}")
    out = os.path.join(data, f"service-photos{count}-shards256")
    if not os.path.exists(os.path.join(src, ".done")):
        shutil.rmtree(src, ignore_errors=True)
        for k in range(4):
            os.makedirs(os.path.join(src, f"class{k}"))
        with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(_photo, [(src, n) for n in range(count)], chunksize=32))
        open(os.path.join(src, ".done"), "w").close()
    if not os.path.exists(os.path.join(out, ".done")):
        chute.convert(src, out, shorter_side=256, encoding="jpeg", overwrite=True)
        open(os.path.join(out, ".done"), "w").close()
    return out


def glyph_shards(data: str) -> str:
    """bench_convert.py's 26,280 glyph PNGs as 75x75 raw shards, made once."""
    import chute

    sys.path.insert(0, HERE)
    from bench_convert import make_data

    src = make_data(os.path.join(data, "kn40"), 657, 40, 100)
    out = os.path.join(data, "service-kn40-shards75")
    if not os.path.exists(os.path.join(out, ".done")):
        chute.convert(
            src, out, image_size=75, color_mode="grayscale", encoding="raw", overwrite=True
        )
        open(os.path.join(out, ".done"), "w").close()
    return out


# -- servers ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Cluster:
    """A dispatcher and ``workers`` workers (``chute data-service``) on 127.0.0.1."""

    def __init__(self, workers: int, logs: str):
        self.workers, self.logs, self.procs = workers, logs, []
        self.port = _free_port()
        self.address = f"grpc://127.0.0.1:{self.port}"

    def start(self) -> Cluster:
        commands = [["dispatcher", "--port", str(self.port)]] + [
            ["worker", "--dispatcher", f"127.0.0.1:{self.port}", "--address", "127.0.0.1"]
        ] * self.workers
        for i, command in enumerate(commands):
            with open(self.log(i), "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "chute", "data-service", *command],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            if i == 0:
                deadline = time.monotonic() + 120
                while not _listening(self.port):
                    if time.monotonic() > deadline or self.procs[0].poll() is not None:
                        raise RuntimeError(f"no dispatcher on {self.port}: {self.tail(0)}")
                    time.sleep(0.2)
        return self

    def log(self, i: int) -> str:
        return os.path.join(self.logs, f"n{self.workers}-{'worker' if i else 'dispatcher'}{i}.log")

    def tail(self, i: int, chars: int = 3000) -> str:
        with open(self.log(i)) as handle:
            return handle.read()[-chars:]

    def check(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise RuntimeError(f"server {i} exited ({proc.returncode}): {self.tail(i)}")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the servers so far (Linux /proc; 0 elsewhere)."""
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(OSError):
                with open(f"/proc/{proc.pid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        return [proc.returncode for proc in self.procs]


# -- timing -------------------------------------------------------------------------------------


@contextlib.contextmanager
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def timed(make, seconds: float, servers: Cluster | None) -> dict:
    """Builds a dataset and iterates it, whole epochs, until ``seconds`` have passed."""
    firsts, epoch_s, images, batches = [], [], 0, 0
    server_cpu = servers.cpu_seconds() if servers else 0.0
    cpu = time.process_time()
    with collector_off():
        started = time.perf_counter()
        dataset = make()
        built = time.perf_counter() - started
        while True:
            begun = time.perf_counter()
            iterator = iter(dataset)
            first = next(iterator)
            firsts.append(time.perf_counter() - begun)
            images, batches = images + int(first[0].shape[0]), batches + 1
            for batch in iterator:
                images, batches = images + int(batch[0].shape[0]), batches + 1
            epoch_s.append(time.perf_counter() - begun)
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
    cpu = time.process_time() - cpu
    server_cpu = (servers.cpu_seconds() - server_cpu) if servers else 0.0
    return {
        "images_per_s": images / elapsed,
        "batches_per_s": batches / elapsed,
        "seconds": elapsed,
        "epochs": len(epoch_s),
        "images": images,
        "build_s": built,
        "epoch_s": statistics.median(epoch_s),
        "epoch_start_s": statistics.median(firsts),
        "trainer_cpu_ms_per_1k": 1e6 * cpu / images,
        "server_cpu_ms_per_1k": 1e6 * server_cpu / images,
    }


def run_case(name: str, shards: str, clusters: list[Cluster], rounds: int, seconds: float):
    import chute

    batch, options = CASES[name]

    def maker(cluster: Cluster | None):
        service = {"data_service": cluster.address} if cluster else {}
        return lambda: chute.load(
            shards, batch_size=batch, training=True, cache=None, **options, **service
        )

    sides = {"direct": (maker(None), None)}
    for cluster in clusters:
        sides[f"service, {cluster.workers} worker(s)"] = (maker(cluster), cluster)
    for make, _ in sides.values():  # warm-up: one whole epoch each, twice
        for _ in range(2):
            for _ in make():
                pass
    per_round = []
    for number in range(rounds):
        order = list(sides) if number % 2 == 0 else list(reversed(sides))
        row = {}
        for side in order:
            make, cluster = sides[side]
            row[side] = timed(make, seconds, cluster)
            if cluster:
                cluster.check()
        direct = row["direct"]["images_per_s"]
        for side in sides:
            row[side]["ratio_to_direct"] = row[side]["images_per_s"] / direct
        per_round.append(row)
        print(
            f"-- {name} round {number + 1} of {rounds}: "
            + ", ".join(
                f"{side} {row[side]['images_per_s']:,.0f} img/s "
                f"(x{row[side]['ratio_to_direct']:.2f}, start {row[side]['epoch_start_s']:.3f} s)"
                for side in sides
            ),
            flush=True,
        )
    summary = {}
    for side in sides:
        values = {key: [row[side][key] for row in per_round] for key in per_round[0][side]}
        summary[side] = {key: statistics.median(v) for key, v in values.items()}
        summary[side]["images_per_s_rounds"] = values["images_per_s"]
        summary[side]["ratio_rounds"] = values["ratio_to_direct"]
    direct = summary["direct"]["images_per_s"]
    for side in sides:
        summary[side]["ratio_of_medians"] = summary[side]["images_per_s"] / direct
    examples = chute.load_manifest(shards).num_examples("train")
    return {"batch_size": batch, "options": options, "train_examples": examples,
            "summary": summary, "rounds": per_round}  # fmt: skip


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "chute-bench-data"))
    parser.add_argument("--photos", type=int, default=4000, help="photo-like JPEGs")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="cluster sizes")
    parser.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="the shortest timed pass")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    shards = {}
    if "photos" in args.cases:
        shards["photos"] = photo_shards(args.data, args.photos)
    if "glyphs" in args.cases:
        shards["glyphs"] = glyph_shards(args.data)
    import tensorflow as tf

    logs = tempfile.mkdtemp(prefix="chute-service-")
    clusters = [Cluster(n, logs) for n in args.workers]
    results, exits = {}, {}
    try:
        for cluster in clusters:
            cluster.start()
        for name, path in shards.items():
            results[name] = run_case(name, path, clusters, args.rounds, args.seconds)
    except BaseException:
        for cluster in clusters:
            for i in range(len(cluster.procs)):
                print(f"-- log of {cluster.log(i)}:\n{cluster.tail(i)}", file=sys.stderr)
        raise
    finally:
        for cluster in clusters:
            exits[f"{cluster.workers} worker(s)"] = cluster.stop()
        shutil.rmtree(logs, ignore_errors=True)

    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores ({cpu_model()}), Python "
        f"{platform.python_version()}, TF {tf.__version__}"
    )
    print(f"\n{machine}\nNOTE: {HONEST}.")
    print("ratio: of the medians; r.med: median of the rounds' service/direct ratios")
    for name, result in results.items():
        print(
            f"\n{name}: {result['train_examples']:,} training examples, batch "
            f"{result['batch_size']}, options {result['options']}, cache=None; "
            f"medians of {args.rounds} rounds"
        )
        print(
            f"{'':<22}{'images/s':>10}{'batches/s':>10}{'ratio':>7}{'r.med':>7}{'epoch s':>9}"
            f"{'start s':>9}{'trainer CPU':>12}{'server CPU':>11}  (CPU: ms / 1k images)"
        )
        for side, row in result["summary"].items():
            print(
                f"{side:<22}{row['images_per_s']:>10,.0f}{row['batches_per_s']:>10.1f}"
                f"{row['ratio_of_medians']:>7.2f}{row['ratio_to_direct']:>7.2f}"
                f"{row['epoch_s']:>9.2f}{row['epoch_start_s']:>9.3f}"
                f"{row['trainer_cpu_ms_per_1k']:>12.0f}{row['server_cpu_ms_per_1k']:>11.0f}"
                "   per round: "
                + ", ".join(f"{v:,.0f}" for v in row["images_per_s_rounds"])
                + " (x"
                + ", ".join(f"{v:.2f}" for v in row["ratio_rounds"])
                + ")"
            )
    print(f"\nserver exit codes (SIGTERM): {exits}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"machine": machine, "note": HONEST, "seconds": args.seconds,
                 "rounds": args.rounds, "server_exit_codes": exits, "cases": results},
                handle, indent=1,
            )  # fmt: skip


if __name__ == "__main__":
    main()
