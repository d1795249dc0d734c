"""chute at the scale its users train at: ImageNet's shape, 21,841 classes, 10,000 labels.

Issue #39. Tests use tens to thousands of images; this measures what only a real shape
shows, with tiny payloads so that it runs on a 2-core machine in about 20 minutes:

- ``imagenet``: 1,281,167 training records over 1,000 classes of 732-1,300 images (as
  uneven as ImageNet's), a 50,000-record val split (50 a class), 8x8 grayscale raw
  pixels, ``--min-shards 1024``, from a ``.npz`` made in memory (no million files);
- ``21k``: ``--records`` (default 300,000) over 21,841 classes, long-tailed (Zipf), at
  least 3 images a class, 5% val;
- ``multilabel``: 100,000 images with 10,000 labels (1-5 a image, Zipf), from a Parquet
  file of tiny PNGs, 10% val.

For each, every stage runs in a process of its own (so its peak memory is its own):
convert (wall, CPU, peak RSS) beside a bare ``TFRecordWriter`` loop writing the same
records; manifest and record-index bytes and their load time; ``chute verify`` beside
reading and hashing the same bytes; then each engine reads 3 epochs under ``ulimit -n
256``: time to the first batch, each epoch's images/s and images per CPU-second (the
process and its workers), the pause at each epoch's start, open descriptors and the
process tree's RSS after each epoch; the Grain engine's state at step 5,000 of epoch 2,
its size and the time a new process takes to its next batch from it; an elastic resume
from 2 input pipelines to 3 (the same global batches). The 21k-class and multi-label
shapes also train one epoch of a tiny model and evaluate it (the report files' bytes).

    .venv/bin/python benchmarks/bench_scale.py --json benchmarks/results/scale.json
    .venv/bin/python benchmarks/bench_scale.py --shapes imagenet --scale 0.05   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_remote, bench_service
PYTHON = sys.executable
CHUTE = str(Path(PYTHON).with_name("chute"))
NOFILE = 256  # the descriptor limit every reading stage runs under


def _child(code: str, *args: str, env: dict | None = None) -> dict:
    """Runs ``code`` (Python, its result printed as ``RESULT <json>`` on one line) in a
    process of its own: that result, with the wall seconds, CPU seconds (the process and
    the processes it waited for) and the peak RSS in MB of the largest of them."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen([PYTHON, "-c", textwrap.dedent(code), *args], stdout=out,
                                   stderr=err, text=True, env=env)  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)  # this child's own resource usage
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"stage failed:\n{stderr[-4000:]}")
    line = next(line for line in stdout.splitlines()[::-1] if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    return {**result, "wall_s": round(wall, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}  # fmt: skip


# --- sources -------------------------------------------------------------------------

MAKE_IMAGENET = """
import sys, numpy as np
scale, out = float(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
sizes = np.full(1000, 1300)
low = rng.choice(1000, 104, replace=False)  # ImageNet: 104 classes under 1,300
need = 1300 * 1000 - 1281167
cut = np.minimum(np.concatenate([[568], rng.multinomial(need - 568, np.ones(103) / 103)]), 568)
cut[1] += need - cut.sum()
sizes[low] -= cut
sizes = np.maximum(1, np.round(sizes * scale)).astype(int)
y_train = np.repeat(np.arange(1000), sizes)
y_val = np.repeat(np.arange(1000), max(1, round(50 * scale)))
x = rng.integers(0, 255, (len(y_train) + len(y_val), 8, 8, 1), dtype=np.uint8)
np.savez(out, x_train=x[: len(y_train)], y_train=y_train, x_val=x[len(y_train):], y_val=y_val)
print("RESULT", {"train": len(y_train), "val": len(y_val), "min": int(sizes.min()),
                 "max": int(sizes.max())}.__repr__().replace("'", '"'))
"""

MAKE_21K = """
import sys, numpy as np
records, out = int(sys.argv[1]), sys.argv[2]
classes = 21841
rng = np.random.default_rng(0)
weights = 1 / np.arange(1, classes + 1) ** 0.8  # long-tailed, as ImageNet-21k's
sizes = 3 + rng.multinomial(records - 3 * classes, weights / weights.sum())
y = rng.permutation(np.repeat(np.arange(classes), sizes))
x = rng.integers(0, 255, (len(y), 8, 8, 1), dtype=np.uint8)
np.savez(out, x=x, y=y)
print("RESULT", {"records": len(y), "min": int(sizes.min()), "max": int(sizes.max())}
      .__repr__().replace("'", '"'))
"""

MAKE_MULTILABEL = """
import sys, cv2, numpy as np, pyarrow as pa, pyarrow.parquet as pq
records, out = int(sys.argv[1]), sys.argv[2]
labels = 10000
rng = np.random.default_rng(0)
weights = 1 / np.arange(1, labels + 1) ** 0.9
weights /= weights.sum()
images, rows = [], []
for i in range(records):
    pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8)
    pixels[0, :4] = np.frombuffer(i.to_bytes(4, "little"), np.uint8)  # no two alike
    images.append({"bytes": cv2.imencode(".png", pixels)[1].tobytes(), "path": None})
    rows.append(sorted(set(rng.choice(labels, rng.integers(1, 6), p=weights).tolist())))
rows[: labels] = [[label] for label in range(labels)]  # every label has an image
table = pa.table({"image": images, "labels": rows})
pq.write_table(table, out)
print("RESULT", {"records": records, "labels": labels}.__repr__().replace("'", '"'))
"""

# --- stages --------------------------------------------------------------------------

CONVERT = """
import sys, json, chute
source, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
chute.convert(source, out, **options)
m = chute.load_manifest(out)
print("RESULT", json.dumps({name: {"records": s.examples, "shards": len(s.shards)}
                            for name, s in m.splits.items()}))
"""

BARE_WRITER = """
import sys, json, os, time
import numpy as np
import tensorflow as tf
source, out, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = np.load(source)
x = data["x_train"] if "x_train" in data.files else data["x"]
y = data["y_train"] if "y_train" in data.files else data["y"]
os.makedirs(out, exist_ok=True)
started = time.perf_counter()
per = -(-len(y) // shards)
for shard in range(shards):
    with tf.io.TFRecordWriter(f"{out}/train-{shard:05d}-of-{shards:05d}.tfrecord") as writer:
        for i in range(shard * per, min(len(y), (shard + 1) * per)):
            image = x[i]
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])),
                "size": tf.train.Feature(int64_list=tf.train.Int64List(value=image.shape[:2])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
print("RESULT", json.dumps({"records": int(len(y)), "write_s": time.perf_counter() - started}))
"""

MAKE_APPEND = """
import sys, numpy as np
source, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(5)
x = rng.integers(0, 255, (count, 8, 8, 1), dtype=np.uint8)
copies = count // 13
x[:copies] = np.load(source)["x_train"][:copies]  # images the dataset holds already
np.savez(out, x=x, y=rng.integers(0, 1000, count))
print("RESULT", {"records": count, "copies": copies}.__repr__().replace("'", '"'))
"""

APPEND = """
import sys, json, time, chute
started = time.perf_counter()
manifest = chute.convert(sys.argv[1], sys.argv[2], append=True).manifest
entry = manifest.versions[-1]
print("RESULT", json.dumps({"append_s": time.perf_counter() - started, "version": manifest.version,
                            "added": entry["added"], "copies_skipped": entry["copies_skipped"]}))
"""

LOAD_INDEX = """
import sys, json, os, time
started = time.perf_counter()
import chute
imported = time.perf_counter()
m = chute.load_manifest(sys.argv[1])
manifest_s = time.perf_counter() - imported
source = chute.grain_source(m, "train")
print("RESULT", json.dumps({"manifest_s": manifest_s, "manifest_and_indexes_s":
                            time.perf_counter() - imported, "records": len(source)}))
"""

VERIFY = """
import sys, json, time, chute
started = time.perf_counter()
report = chute.verify(sys.argv[1])
seconds = time.perf_counter() - started
print("RESULT", json.dumps({"verify_s": seconds, "ok": not report.problems,
                            "records": report.num_records}))
"""

HASH_FILES = """
import sys, json, hashlib, os, time
started, total = time.perf_counter(), 0
for name in sorted(os.listdir(sys.argv[1])):
    if name.endswith(".tfrecord"):
        with open(os.path.join(sys.argv[1], name), "rb") as f:
            data = f.read()
        total += len(data)
        hashlib.sha256(data).hexdigest()
print("RESULT", json.dumps({"hash_s": time.perf_counter() - started, "bytes": total}))
"""

READ_EPOCHS = """
import json, os, resource, sys, time
limit = int(sys.argv[3])  # as `ulimit -n` sets it: soft and hard
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
import chute

def tree(pid):
    found = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found += tree(int(entry))
    return found

def measure():
    # RSS of the process tree, of this process, of its largest worker; most descriptors open
    rss = main = worker = fds = 0
    for pid in tree(os.getpid()):
        try:
            size = int(open(f"/proc/{pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            fds = max(fds, len(os.listdir(f"/proc/{pid}/fd")))
        except OSError:
            continue
        rss += size
        if pid == os.getpid():
            main = size
        else:
            worker = max(worker, size)
    return rss / 2**20, main / 2**20, worker / 2**20, fds

def tree_cpu():  # workers still running are not in RUSAGE_CHILDREN: read /proc for them
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in tree(os.getpid()):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / ticks
        except OSError:
            pass
    return total

if __name__ == "__main__":
    data, engine, epochs = sys.argv[1], sys.argv[2], int(sys.argv[4])
    options = {"workers": 2} if engine == "grain" else {}
    started = time.perf_counter()
    train = chute.load(data, batch_size=256, seed=0, engine=engine, **options)
    steps = len(train)
    rows, first_batch = [], None
    for epoch in range(epochs):
        iterator = iter(train if engine == "grain" else train.as_numpy_iterator())
        epoch_started, cpu_started = time.perf_counter(), tree_cpu()
        next(iterator)
        first = time.perf_counter() - epoch_started
        if first_batch is None:
            first_batch = time.perf_counter() - started
        n = 1
        for _ in iterator:
            n += 1
            if n == steps:
                break
        seconds = time.perf_counter() - epoch_started
        rss, main, worker, fds = measure()
        rows.append({"epoch": epoch + 1, "s": seconds, "first_batch_s": first,
                     "images_per_s": steps * 256 / seconds,
                     "images_per_cpu_s": steps * 256 / max(1e-9, tree_cpu() - cpu_started),
                     "rss_mb": rss, "main_rss_mb": main, "worker_rss_mb": worker,
                     "fds": fds})
    print("RESULT", json.dumps({"steps": steps, "first_batch_s": first_batch, "epochs": rows}))
"""

GRAIN_STATE = """
import json, sys, time
import chute
if __name__ == "__main__":
    data, step = sys.argv[1], int(sys.argv[2])
    train = chute.load(data, batch_size=256, seed=0, engine="grain", workers=2)
    iterator = iter(train)
    iterator.set_state({"epoch": 1, "batch": step})
    state = iterator.get_state()
    started = time.perf_counter()
    images, labels = next(iterator)
    print("RESULT", json.dumps({"state_bytes": len(json.dumps(state)),
                                "resume_to_batch_s": time.perf_counter() - started,
                                "labels": labels[:8].tolist()}))
"""

GRAIN_STREAM = """
import json, sys, time
started = time.perf_counter()
import chute
from chute.read.stream import StreamPosition
if __name__ == "__main__":
    data, step = sys.argv[1], int(sys.argv[2])
    train = chute.load(data, batch_size=256, seed=0, engine="grain", workers=2)
    direct = train.batches[1 * len(train) + step][1][:8].tolist()  # batch 5,000 of epoch 2
    images, labels = next(iter(train.stream(StreamPosition(epoch=1, batch=step))))
    print("RESULT", json.dumps({"process_to_batch_s": time.perf_counter() - started,
                                "same_batch": labels[:8].tolist() == direct}))
"""

ELASTIC = """
import json, sys, time, types
import numpy as np
import chute
from chute.read.stream import StreamPosition
if __name__ == "__main__":
    data, step = sys.argv[1], int(sys.argv[2])
    def pipelines(n):
        return [chute.load(data, batch_size=768 // n, seed=0, engine="grain", workers=0,
                           input_context=types.SimpleNamespace(num_input_pipelines=n,
                                                               input_pipeline_id=i))
                for i in range(n)]
    two, three = pipelines(2), pipelines(3)
    step = min(step, len(two[0]) - 1)  # global batches of 768: fewer in an epoch
    position = StreamPosition(epoch=1, batch=step)
    started = time.perf_counter()
    from_two = np.concatenate([p.batches.records_of(len(p) + step) for p in two])
    resumed = [next(iter(p.stream(position))) for p in three]
    seconds = time.perf_counter() - started
    from_three = np.concatenate([p.batches.records_of(len(p) + step) for p in three])
    print("RESULT", json.dumps({"same_global_batch": bool(np.array_equal(from_two, from_three)),
                                "resume_3_pipelines_s": seconds}))
"""

BUCKET_EPOCH = """
import json, os, sys, time
import chute

if __name__ == "__main__":
    url, cache, passes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    started = time.perf_counter()
    train = chute.load(url, batch_size=256, seed=0, engine="grain", workers=2, cache_dir=cache,
                       cache_limit="8GB")
    rows = []
    for epoch in range(passes):
        begun = time.perf_counter()
        n = 0
        for n, _ in enumerate(train, 1):
            if n == 1 and epoch == 0:
                first = time.perf_counter() - started
        rows.append({"epoch": epoch + 1, "s": time.perf_counter() - begun,
                     "images_per_s": n * 256 / (time.perf_counter() - begun)})
    print("RESULT", json.dumps({"first_batch_s": first, "epochs": rows}))
"""

SERVICE = """
import json, sys, time
import chute

if __name__ == "__main__":
    data, address, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options = {"data_service": address} if address != "-" else {}
    train = chute.load(data, batch_size=256, seed=0, cache=None, repeat=True, **options)
    iterator = iter(train)
    started = time.perf_counter()
    next(iterator)
    first = time.perf_counter() - started
    for _ in range(200):  # warm: the workers' pipelines are running
        next(iterator)
    begun = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - begun
    print("RESULT", json.dumps({"first_batch_s": first, "images_per_s": batches * 256 / seconds}))
"""

TRAIN_EVAL = """
import json, os, sys, time
import chute
if __name__ == "__main__":
    data, run = sys.argv[1], sys.argv[2]
    started = time.perf_counter()
    chute.train(data, run, epochs=1, batch_size=256, verbose=0)
    trained = time.perf_counter() - started
    report = chute.evaluate(run, data, out_dir=os.path.join(run, "eval"))
    files = {}
    for root, _, names in os.walk(run):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, run)] = os.path.getsize(path)
    print("RESULT", json.dumps({"train_s": trained, "evaluate_s": time.perf_counter() - started
                                - trained, "files": files}))
"""


def _folder_bytes(folder: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in folder.rglob(f"*{suffix}") if p.is_file())


def _reading(data: Path, epochs: int, results: dict) -> None:
    for engine in ("tf", "grain"):
        results[f"read_{engine}"] = _child(READ_EPOCHS, str(data), engine, str(NOFILE), str(epochs))
        print(f"  read {engine}: {json.dumps(results[f'read_{engine}'])}", flush=True)


def run_imagenet(
    work: Path,
    scale: float,
    epochs: int,
    *,
    bucket: bool = True,
    service: bool = True,
    rounds: int = 2,
) -> dict:
    results: dict = {}
    source, data = work / "imagenet.npz", work / "imagenet"
    results["source"] = _child(MAKE_IMAGENET, str(scale), str(source))
    shards = max(1, round(1024 * scale))
    # Alternating rounds, each into a fresh folder: the disk's write-back varies from
    # minute to minute, so each conversion is compared with the bare loop beside it.
    for round_ in range(rounds):
        out = data if round_ == 0 else work / f"imagenet-{round_}"
        shutil.rmtree(work / "bare", ignore_errors=True)
        convert = _child(CONVERT, str(source), str(out), json.dumps({"min_shards": shards}))
        bare = _child(BARE_WRITER, str(source), str(work / "bare"), str(shards))
        ratio = round(convert["wall_s"] / bare["wall_s"], 2)
        results.setdefault("convert_rounds", []).append(convert)
        results.setdefault("bare_writer_rounds", []).append(bare)
        results.setdefault("convert_vs_bare", []).append(ratio)
        print(f"  convert: {json.dumps(convert)}", flush=True)
        print(f"  bare TFRecordWriter: {json.dumps(bare)}; chute/bare {ratio}", flush=True)
        if out != data:
            shutil.rmtree(out)
    results["convert"], results["bare_writer"] = results["convert_rounds"][0], bare
    # An append of 1% more images (a thirteenth of them copies) to a copy of the dataset.
    added, grown = work / "added.npz", work / "imagenet-grown"
    results["append_source"] = _child(MAKE_APPEND, str(source), str(added),
                                      str(max(13, round(12811 * scale))))  # fmt: skip
    shutil.copytree(data, grown)
    results["append"] = _child(APPEND, str(added), str(grown))
    shutil.rmtree(grown)
    print(f"  append: {json.dumps(results['append'])}", flush=True)
    results["bytes"] = {"manifest": (data / "manifest.json").stat().st_size,
                        "indexes": _folder_bytes(data / "index"),
                        "hashes": _folder_bytes(data / "hashes"),
                        "shards": _folder_bytes(data, ".tfrecord")}  # fmt: skip
    results["load_index"] = _child(LOAD_INDEX, str(data))
    results["verify"] = _child(VERIFY, str(data))
    results["hash"] = _child(HASH_FILES, str(data))
    shown = [results[k] for k in ("bytes", "load_index", "verify", "hash")]
    print(f"  index/verify: {json.dumps(shown)}", flush=True)
    _reading(data, epochs, results)
    step = min(5000, results["read_grain"]["steps"] - 1)
    results["grain_state"] = _child(GRAIN_STATE, str(data), str(step))
    results["grain_stream"] = _child(GRAIN_STREAM, str(data), str(step))
    results["elastic"] = _child(ELASTIC, str(data), str(min(step, 1500)))
    shown = [results[k] for k in ("grain_state", "grain_stream", "elastic")]
    print(f"  resume: {json.dumps(shown)}", flush=True)
    if bucket:
        results["bucket"] = _bucket(work, data)
        print(f"  bucket: {json.dumps(results['bucket'])}", flush=True)
    if service:
        results["service"] = _service(work, data)
        print(f"  service: {json.dumps(results['service'])}", flush=True)
    return results


def _bucket(work: Path, data: Path) -> dict:
    """The Grain engine's first pass (and a second, from the warm cache) of the split in an
    S3 bucket on 127.0.0.1 behind bench_remote.py's 20 ms latency proxy."""
    import bench_remote

    store = bench_remote.Store(latency_ms=20)
    try:
        started = time.perf_counter()
        bench_remote.upload(str(data), store.moto, "imagenet")
        uploaded = time.perf_counter() - started
        env = {**os.environ, **bench_remote.aws_environment(store.proxy)}
        url = f"s3://{bench_remote.BUCKET}/imagenet"
        result = _child(BUCKET_EPOCH, url, str(work / "cache"), "2", env=env)
        return {**result, "upload_s": round(uploaded, 1)}
    finally:
        store.close()


def _service(work: Path, data: Path) -> dict:
    """Training batches through the tf.data service with 2 workers (chute data-service, on
    127.0.0.1) against the same pipeline in this process, neither cached."""
    import bench_service

    cluster = bench_service.Cluster(2, str(work)).start()
    try:
        through = _child(SERVICE, str(data), cluster.address, "3000")
        cluster.check()
        server_cpu = cluster.cpu_seconds()
    finally:
        cluster.stop()
    direct = _child(SERVICE, str(data), "-", "3000")
    return {"service_2_workers": through, "direct": direct, "server_cpu_s": round(server_cpu, 1)}


def run_many_classes(work: Path, records: int, epochs: int) -> dict:
    results: dict = {}
    source, data = work / "21k.npz", work / "21k"
    results["source"] = _child(MAKE_21K, str(records), str(source))
    results["convert"] = _child(CONVERT, str(source), str(data), json.dumps({"val_fraction": 0.05}))
    print(f"  convert: {json.dumps(results['convert'])}", flush=True)
    results["bytes"] = {"manifest": (data / "manifest.json").stat().st_size,
                        "indexes": _folder_bytes(data / "index")}  # fmt: skip
    results["load_index"] = _child(LOAD_INDEX, str(data))
    _reading(data, epochs, results)
    results["train_eval"] = _child(TRAIN_EVAL, str(data), str(work / "21k-run"))
    print(f"  train/evaluate: {json.dumps(results['train_eval'])}", flush=True)
    return results


def run_multilabel(work: Path, records: int) -> dict:
    results: dict = {}
    source, data = work / "multilabel.parquet", work / "multilabel"
    results["source"] = _child(MAKE_MULTILABEL, str(records), str(source))
    options = {"val_fraction": 0.1, "label_column": "labels"}
    results["convert"] = _child(CONVERT, str(source), str(data), json.dumps(options))
    print(f"  convert: {json.dumps(results['convert'])}", flush=True)
    results["bytes"] = {"manifest": (data / "manifest.json").stat().st_size,
                        "indexes": _folder_bytes(data / "index")}  # fmt: skip
    results["train_eval"] = _child(TRAIN_EVAL, str(data), str(work / "multilabel-run"))
    print(f"  train/evaluate: {json.dumps(results['train_eval'])}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="imagenet,21k,multilabel")
    parser.add_argument("--scale", type=float, default=1.0, help="of the ImageNet shape")
    parser.add_argument("--records-21k", type=int, default=300_000)
    parser.add_argument("--records-multilabel", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="of convert beside the bare loop")
    parser.add_argument("--no-bucket", action="store_true", help="skip the S3 stage")
    parser.add_argument("--no-service", action="store_true", help="skip the tf.data service")
    parser.add_argument("--work-dir", type=Path, help="kept (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results: dict = {"machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]}}
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work_dir or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        for shape in args.shapes.split(","):
            print(f"{shape}:", flush=True)
            started = time.perf_counter()
            if shape == "imagenet":
                results[shape] = run_imagenet(work, args.scale, args.epochs,
                                              bucket=not args.no_bucket,
                                              service=not args.no_service,
                                              rounds=args.rounds)  # fmt: skip
            elif shape == "21k":
                results[shape] = run_many_classes(work, args.records_21k, args.epochs)
            elif shape == "multilabel":
                results[shape] = run_multilabel(work, args.records_multilabel)
            else:
                raise SystemExit(f"--shapes: unknown shape {shape!r}")
            results[shape]["total_s"] = round(time.perf_counter() - started, 1)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
