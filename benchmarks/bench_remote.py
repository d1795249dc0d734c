"""Benchmark: photo shards read from a bucket 20 ms away against local disk, and against
MosaicML Streaming reading the same images from the same bucket (issue #28 item 6).

    python benchmarks/bench_remote.py --rounds 2 --json benchmarks/results/remote.json
    make bench-remote

Data (generated once under --work-dir, no download): --images photo-like JPEGs
(bench_service.py's generator: 640-1024 px wide, 4:3 either way, quality 90, 4
classes) converted with ``chute.convert(src, out, shorter_side=256, encoding="jpeg",
min_shards=--shards)``: every image in the train split, ~16 KB a record.

The bucket: moto's S3 server (``moto.server.ThreadedMotoServer``) on 127.0.0.1, and in
front of it a small threaded HTTP proxy (``LatencyProxy`` below) that waits --latency-ms
(20) before forwarding each request, so that time to first byte decides, as on a real
bucket; it counts requests and the bytes of GET responses. Server and proxy run in a
process of their own: their CPU is reported apart, never charged to a reader. The
shards are uploaded as they are (straight to moto); MosaicML Streaming's ``MDSWriter``
writes the same JPEG bytes and labels (columns ``image: bytes``, ``class: int``, shards
of the same size, no compression) into the same bucket.

Rows (the same images, batch 128, 2 workers, random-resized crop to 224 with scale
0.08-1 and ratio 3/4-4/3, and a horizontal flip, for all):

* chute, local disk: ``chute.load(shards, engine="grain", workers=2, batch_size=128,
  image_size=224, augment="crop,flip", repeat=True, seed=0)``.
* chute, bucket: the same call on ``s3://...`` through the proxy
  (``AWS_ENDPOINT_URL``), with ``cache_dir=`` a fresh temporary folder when
  ``LoadOptions`` has that field (the verified shard cache of #28 item 2).
* MosaicML Streaming, bucket: ``StreamingDataset(remote="s3://...", local=<fresh
  temporary folder>, shuffle=True, batch_size=128)`` through the proxy
  (``S3_ENDPOINT_URL``), whose ``__getitem__`` decodes with Pillow and crops and flips
  as torchvision's ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()`` do (their
  window sampling, then one bilinear ``resize`` of the window with Pillow), in a
  ``torch.utils.data.DataLoader(batch_size=128, num_workers=2, drop_last=True,
  persistent_workers=True)``. It runs in a virtualenv of its own (--peer-venv, made
  when missing: ``python -m venv`` + ``pip install`` --peer-packages), never in chute's;
  ``import_streaming`` below says why torchvision itself is not imported.
* with --peer-local, MosaicML Streaming from the MDS files on local disk too.

Each row is one fresh process per round (imports done before timing); the rows take
turns, order reversed every other round. The *first pass* is the first epoch, cold
cache, timed from building the loader to its last batch (start-up included, as a run
sees it; capped at --first-cap seconds: a loader still in its first epoch then is
reported at the rate it reached). The *later passes* are the batches after it, read for
at least --seconds. Per pass: images/s; images per CPU-second of the reader's process
tree (psutil: the process and its workers; bench_grain.py's ``Cpu``); the bytes of GET
responses at the proxy in the first epoch against the split's bytes (its shard files);
requests; and the later passes' cache hit rate, ``1 - bytes fetched during them / bytes
they read`` (the split's bytes times the epochs read).

Worker processes are spawned: they import this file as a module, so everything here that
is not a definition stays under ``if __name__ == "__main__"``, and chute, moto and the
peer's packages are imported inside the functions (the peer's process has no chute).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import http.client
import io
import itertools
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, WORKERS, SIZE, SEED = 128, 2, 224, 0
BUCKET = "chute-bench"
PEER_PACKAGES = ["mosaicml-streaming", "psutil"]  # torch and torchvision come with it
CONTROL = "/__bench__/"  # the proxy's own paths (counts), never forwarded
LOCAL, BUCKET_ROW, PEER, PEER_LOCAL = (
    "chute, local disk",
    "chute, bucket",
    "MosaicML Streaming, bucket",
    "MosaicML Streaming, local disk",
)


# -- the bucket: moto's S3 server behind a proxy that adds latency -----------------------------

# headers of one connection, not of the request (RFC 9110 7.6.1)
HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
     "upgrade"}
)  # fmt: skip


class LatencyProxy(ThreadingHTTPServer):
    """Forwards every HTTP request to ``upstream`` after ``latency`` seconds (a thread and
    a connection each way per request) and counts what passes."""

    daemon_threads = True

    def __init__(self, upstream: tuple[str, int], latency: float):
        self.upstream, self.latency = upstream, latency
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        super().__init__(("127.0.0.1", 0), _Forward)

    def count(self, amounts: dict) -> None:
        with self.lock:
            self.counts.update(amounts)


class _Forward(BaseHTTPRequestHandler):
    # One request per connection, as moto's server behind it does ("Connection: close"):
    # a client's pooled connection inherited by forked workers (MosaicML's DataLoader
    # workers inherit the main process's S3 client) would otherwise be shared by two
    # processes, and one of them waits for its download's 60 s timeout. A new connection
    # on 127.0.0.1 costs ~0.1 ms, nothing beside the 20 ms.
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # the server's line per request: not wanted
        pass

    def handle(self):
        with contextlib.suppress(ConnectionError):  # a client that went away
            super().handle()

    def do_GET(self):
        if self.path.startswith(CONTROL):
            self._counts()
        else:
            self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _counts(self) -> None:
        with self.server.lock:
            body = json.dumps(dict(self.server.counts)).encode()
        self.send_response_only(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _forward(self) -> None:
        self.close_connection = True
        body = self._body()
        time.sleep(self.server.latency)  # the bucket's time to first byte
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=120)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            sent = self._relay(response)
        except (http.client.HTTPException, OSError):
            self.send_error(502)
            return
        finally:
            upstream.close()
        counts = {f"{self.command} requests": 1, f"{self.command} bytes": sent}
        if "Range" in self.headers:
            counts[f"{self.command} ranged requests"] = 1
        self.server.count(counts)

    def _relay(self, response: http.client.HTTPResponse) -> int:
        """Sends ``response`` on to the client; returns the body's bytes."""
        bodiless = self.command == "HEAD" or response.status in (204, 304)
        whole = None  # an upstream body without a length is read whole, then sent with one
        if not bodiless and response.getheader("Content-Length") is None:
            whole = response.read()
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            lower = name.lower()
            if lower not in HOP and not (whole is not None and lower == "content-length"):
                self.send_header(name, value)
        if whole is not None:
            self.send_header("Content-Length", str(len(whole)))
        self.send_header("Connection", "close")
        self.end_headers()
        if whole is not None:
            self.wfile.write(whole)
            return len(whole)
        sent = 0
        while not bodiless and (chunk := response.read(1 << 20)):
            self.wfile.write(chunk)
            sent += len(chunk)
        return sent


def serve_store(latency_ms: float) -> None:
    """The store process: moto's S3 server and the proxy in front of it, until stdin closes.
    Prints one JSON line: ``{"moto": URL, "proxy": URL}``."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = LatencyProxy((host, port), latency_ms / 1000)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    print(json.dumps({"moto": f"http://{host}:{port}",
                      "proxy": f"http://127.0.0.1:{proxy.server_port}"}), flush=True)  # fmt: skip
    sys.stdin.read()
    proxy.shutdown()
    server.stop()


class Store:
    """The store process, seen from the benchmark: its endpoints, counts and CPU."""

    def __init__(self, latency_ms: float):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-store", "--latency-ms", str(latency_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        urls = json.loads(self.process.stdout.readline())
        self.moto, self.proxy = urls["moto"], urls["proxy"]

    def cpu_s(self) -> float:
        import psutil

        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def proxy_counts(proxy: str | None) -> dict:
    if not proxy:
        return {}
    host, port = proxy.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", CONTROL + "counts")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def aws_environment(endpoint: str) -> dict:
    """Dummy credentials and the endpoint: nothing read from this machine's AWS files."""
    nothing = os.path.join(tempfile.gettempdir(), "chute-bench-no-aws-config")
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "not-a-real-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,  # boto3 and s3fs (chute)
        "S3_ENDPOINT_URL": endpoint,  # MosaicML Streaming
        "AWS_SHARED_CREDENTIALS_FILE": nothing,
        "AWS_CONFIG_FILE": nothing,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def upload(folder: str, moto: str, prefix: str) -> None:
    """Every file under ``folder`` (dotfiles excepted) to ``s3://BUCKET/prefix/``."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto, region_name="us-east-1",
                          aws_access_key_id="testing",
                          aws_secret_access_key="not-a-real-secret-key")  # fmt: skip
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    for directory, _, files in os.walk(folder):
        for name in files:
            if not name.startswith("."):
                path = os.path.join(directory, name)
                key = f"{prefix}/{os.path.relpath(path, folder)}"
                client.upload_file(path, BUCKET, key)


def probe_downloads(store: Store, keys: list[str], parallel: int) -> dict:
    """``keys`` fetched whole through the proxy (boto3, ``parallel`` at a time), nothing
    else: what downloading alone costs, the floor of a cold first pass."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    client = boto3.client("s3", endpoint_url=store.proxy, region_name="us-east-1",
                          aws_access_key_id="testing",
                          aws_secret_access_key="not-a-real-secret-key")  # fmt: skip

    def fetch(key: str) -> int:
        return len(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        total = sum(pool.map(fetch, keys))
    seconds = time.perf_counter() - started
    return {"parallel": parallel, "seconds": seconds, "mb_per_s": total / seconds / 1e6}


# -- data -----------------------------------------------------------------------------------------


def photo_shards(work: str, count: int, shards: int) -> str:
    """``count`` photo-like JPEGs (bench_service.py's generator) as train shards at shorter
    side 256, JPEG, made once."""
    from concurrent.futures import ProcessPoolExecutor

    sys.path.insert(0, HERE)
    from bench_service import _photo

    import chute

    src = os.path.join(work, f"remote-photos{count}")
    out = os.path.join(work, f"remote-photos{count}-shards256-{shards}")
    if not os.path.exists(os.path.join(src, ".done")):
        shutil.rmtree(src, ignore_errors=True)
        for k in range(4):
            os.makedirs(os.path.join(src, f"class{k}"))
        started = time.perf_counter()
        with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(_photo, [(src, n) for n in range(count)], chunksize=32))
        open(os.path.join(src, ".done"), "w").close()
        print(f"made {count} photos in {time.perf_counter() - started:.0f} s", flush=True)
    if not os.path.exists(os.path.join(out, ".done")):
        started = time.perf_counter()
        chute.convert(src, out, shorter_side=256, encoding="jpeg", min_shards=shards,
                      overwrite=True)  # fmt: skip
        open(os.path.join(out, ".done"), "w").close()
        print(f"converted them in {time.perf_counter() - started:.0f} s", flush=True)
    return out


def split_bytes(shards: str) -> tuple[int, int, int]:
    """(bytes of the train split's shard files, shards, records)."""
    import chute

    manifest = chute.load_manifest(shards)
    paths = manifest.shard_paths("train")
    return sum(os.path.getsize(p) for p in paths), len(paths), manifest.num_examples("train")


def export_records(shards: str, path: str) -> None:
    """The train split's JPEG bytes and labels, in record order, framed for the peer's
    writer (whose virtualenv has no chute): ``<label int32><length uint32><bytes>``."""
    import chute

    source = chute.grain_source(shards, "train")
    with open(path, "wb") as handle:
        for i in range(len(source)):
            record = source[i]
            image = bytes(record["image"])
            handle.write(struct.pack("<iI", int(record["class"]), len(image)) + image)


def peer_python(venv: str, packages: list[str]) -> str:
    """The peer's interpreter: ``venv``, made and installed when it cannot import the peer."""
    python = os.path.join(venv, "bin", "python")
    check = [python, __file__, "--check-peer"]
    if os.path.exists(python) and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"installing {' '.join(packages)} into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *packages], check=True)
    subprocess.run(check, check=True)
    return python


def import_streaming():
    """``streaming``, without its ``streaming.vision`` (torchvision datasets, unused here):
    a torchvision wheel built for CUDA does not import beside a CPU-only torch."""
    import types

    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def peer_versions() -> dict:
    """In the peer's virtualenv: the versions that run there (and a check that they import)."""
    from importlib import metadata

    import_streaming()
    import PIL
    import psutil  # noqa: F401
    import torch

    return {"mosaicml-streaming": metadata.version("mosaicml-streaming"),
            "torch": torch.__version__, "Pillow": PIL.__version__}  # fmt: skip


def peer_write(spec: dict) -> dict:
    """In the peer's virtualenv: MDSWriter writes the exported records to ``spec["remote"]``
    (and keeps its local copy in ``spec["local"]``)."""
    MDSWriter = import_streaming().MDSWriter

    columns = {"image": "bytes", "class": "int"}
    written = 0
    with open(spec["records"], "rb") as handle, MDSWriter(
        out=(spec["local"], spec["remote"]), columns=columns, size_limit=spec["shard_bytes"],
        compression=None, progress_bar=False, keep_local=True,
    ) as writer:  # fmt: skip
        while head := handle.read(8):
            label, length = struct.unpack("<iI", head)
            writer.write({"image": handle.read(length), "class": label})
            written += 1
    files = [n for n in os.listdir(spec["local"]) if n.endswith(".mds")]
    total = sum(os.path.getsize(os.path.join(spec["local"], n)) for n in files)
    return {"records": written, "shards": len(files), "split_bytes": total}


# -- one pass (in a fresh process) ---------------------------------------------------------------


def chute_loader(spec: dict):
    """chute's Grain engine: ``(make, batches per epoch of the made dataset, cache used)``."""
    import chute

    options = {"batch_size": BATCH, "engine": "grain", "workers": WORKERS, "image_size": SIZE,
               "augment": "crop,flip", "repeat": True, "seed": SEED}  # fmt: skip
    fields = {field.name for field in dataclasses.fields(chute.LoadOptions)}
    cache = spec.get("cache_dir") is not None and "cache_dir" in fields
    if cache:
        options["cache_dir"] = spec["cache_dir"]

    def make():
        dataset = chute.load(spec["path"], **options)
        return dataset, iter(dataset)

    return make, lambda dataset: dataset.chute.steps, cache


def random_resized_crop(image, rng):
    """torchvision's ``RandomResizedCrop(224)`` window (scale 0.08-1, ratio 3/4-4/3, 10
    tries, then the centre at the nearest allowed ratio), resized bilinearly (Pillow)."""
    import math

    from PIL import Image

    width, height = image.size
    for _ in range(10):
        area = width * height * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            top, left = rng.randint(0, height - h), rng.randint(0, width - w)
            break
    else:
        w, h = width, height
        if width / height < 3 / 4:
            h = round(w / (3 / 4))
        elif width / height > 4 / 3:
            w = round(h * 4 / 3)
        top, left = (height - h) // 2, (width - w) // 2
    box = (left, top, left + w, top + h)
    return image.resize((SIZE, SIZE), Image.BILINEAR, box=box)


def peer_loader(spec: dict):
    """MosaicML Streaming + torch DataLoader, the same crop and flip (Pillow)."""
    import random

    import numpy as np
    import torch
    from PIL import Image

    streaming = import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    class Photos(streaming.StreamingDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            image = Image.open(io.BytesIO(sample["image"]))
            image = random_resized_crop(image.convert("RGB"), random)  # seeded per worker
            if random.random() < 0.5:
                image = image.transpose(Image.FLIP_LEFT_RIGHT)
            return np.array(image), sample["class"]

    def make():
        where = {"local": spec["path"]}
        if not spec.get("local_only"):
            where = {"remote": spec["path"], "local": spec["cache_dir"]}
        dataset = Photos(**where, shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=BATCH, num_workers=WORKERS, drop_last=True,
            persistent_workers=True,
        )  # fmt: skip
        return loader, itertools.chain.from_iterable(itertools.repeat(loader))

    return make, len, not spec.get("local_only")


def run_pass(spec: dict) -> dict:
    """One row's passes in this process: the first epoch, then at least ``seconds`` more."""
    sys.path.insert(0, HERE)
    from bench_grain import Cpu, close, collector_off

    make, steps_of, cache = (peer_loader if spec["kind"] == "peer" else chute_loader)(spec)
    proxy = spec.get("proxy")
    before = proxy_counts(proxy)
    with collector_off():
        cpu = Cpu()
        started = time.perf_counter()
        dataset, batches = make()
        build_s = time.perf_counter() - started
        images = int(next(batches)[0].shape[0])
        start_s = time.perf_counter() - started
        at_first_batch = proxy_counts(proxy)  # what had to be fetched before it (~1 ms)
        steps, done = steps_of(dataset), 1
        while done < steps and time.perf_counter() - started < spec["first_cap"]:
            images += int(next(batches)[0].shape[0])
            done += 1
        first_s = time.perf_counter() - started
        first_cpu = cpu.used(first_s)
        after_first = proxy_counts(proxy)
        result = {
            "cache": cache, "build_s": build_s, "start_s": start_s, "steps": steps,
            "bytes_before_first_batch": _delta(at_first_batch, before).get("GET bytes"),
            "first": {"images_per_s": images / first_s, "seconds": first_s, "images": images,
                      "epoch_share": done / steps, "counts": _delta(after_first, before),
                      "images_per_cpu_s": images / max(first_cpu["cpu_s"], 1e-9), **first_cpu},
        }  # fmt: skip
        if done < steps:  # the first epoch did not end within the cap: no later passes
            close(batches)
            return result
        cpu, started, images, later_batches = Cpu(), time.perf_counter(), 0, 0
        while (elapsed := time.perf_counter() - started) < spec["seconds"]:
            images += int(next(batches)[0].shape[0])
            later_batches += 1
        later_cpu = cpu.used(elapsed)
    result["later"] = {
        "images_per_s": images / elapsed, "seconds": elapsed, "images": images,
        "epochs": later_batches / steps, "counts": _delta(proxy_counts(proxy), after_first),
        "images_per_cpu_s": images / max(later_cpu["cpu_s"], 1e-9), **later_cpu,
    }  # fmt: skip
    close(batches)
    return result


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def in_fresh_process(python: str, spec: dict, env: dict, store: Store | None) -> dict:
    """Runs ``spec`` with ``--pass`` in a fresh process of ``python``; adds the store's CPU."""
    with tempfile.TemporaryDirectory(prefix="chute-bench-pass-") as scratch:
        spec = {**spec, "out": os.path.join(scratch, "result.json")}
        if spec.get("cache_dir") == "fresh":
            spec["cache_dir"] = os.path.join(scratch, "cache")
        with open(os.path.join(scratch, "spec.json"), "w") as handle:
            json.dump(spec, handle)
        store_before = store.cpu_s() if store else 0.0
        subprocess.run([python, __file__, "--pass", os.path.join(scratch, "spec.json")],
                       env={**os.environ, **env}, check=True)  # fmt: skip
        with open(spec["out"]) as handle:
            result = json.load(handle)
        if store:
            result["store_cpu_s"] = store.cpu_s() - store_before
        if spec["kind"] == "peer" and spec.get("cache_dir"):
            result["cache_bytes"] = _folder_bytes(spec["cache_dir"])
    return result


def _folder_bytes(folder: str) -> int:
    return sum(
        os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder) for n in names
    )


# -- the run ----------------------------------------------------------------------------------


def rows_of(args, data: dict, store: Store, peer: str | None) -> dict:
    """Row name -> (python, spec, environment, split bytes)."""
    common = {"seconds": args.seconds, "first_cap": args.first_cap}
    remote = aws_environment(store.proxy)
    bucket = {"cache_dir": "fresh", "proxy": store.proxy, **common}
    rows = {
        LOCAL: (sys.executable, {"kind": "chute", "path": data["local"], **common}, {}),
        BUCKET_ROW: (sys.executable, {"kind": "chute", "path": f"s3://{BUCKET}/photos", **bucket},
                     remote),
    }  # fmt: skip
    rows = {name: (*row, data["split_bytes"]) for name, row in rows.items()}
    if peer:
        mds = f"s3://{BUCKET}/mds"
        rows[PEER] = (peer, {"kind": "peer", "path": mds, **bucket}, remote, data["mds_bytes"])
        if args.peer_local:
            spec = {"kind": "peer", "path": data["mds_local"], "local_only": True, **common}
            rows[PEER_LOCAL] = (peer, spec, {}, data["mds_bytes"])
    return rows


def derived(row: dict, split: int) -> dict:
    """The first epoch's bytes against the split's, and the later passes' cache hit rate."""
    first, later = row["first"], row.get("later")
    out = {}
    got = first["counts"].get("GET bytes")
    if got is not None:
        out["first_bytes_over_split"] = got / (split * first["epoch_share"])
        out["first_gets"] = first["counts"].get("GET requests", 0)
        out["before_first_batch_over_split"] = (row["bytes_before_first_batch"] or 0) / split
    if later is not None and "proxy" in row:
        read = split * later["epochs"]
        out["later_hit_rate"] = 1 - later["counts"].get("GET bytes", 0) / read
    return out


def ratios_of(measured: dict) -> dict:
    rate = {
        (name, phase): row[phase]["images_per_s"]
        for name, row in measured.items()
        for phase in ("first", "later")
        if phase in row
    }
    wanted = {
        "first pass: bucket / local (target >= 0.8)": ((BUCKET_ROW, "first"), (LOCAL, "first")),
        "later passes: bucket / local (target >= 0.95)": ((BUCKET_ROW, "later"), (LOCAL, "later")),
        "first pass: chute / MosaicML Streaming, bucket (target >= 1.0)": (
            (BUCKET_ROW, "first"), (PEER, "first")),
        "later passes: chute / MosaicML Streaming, bucket": (
            (BUCKET_ROW, "later"), (PEER, "later")),
        "local: chute / MosaicML Streaming": ((LOCAL, "later"), (PEER_LOCAL, "later")),
    }  # fmt: skip
    ratios = {name: rate[a] / rate[b] for name, (a, b) in wanted.items() if a in rate and b in rate}
    for name in (BUCKET_ROW, PEER):
        value = measured.get(name, {}).get("derived", {}).get("first_bytes_over_split")
        if value is not None:
            target = " (target <= 1.05)" if name == BUCKET_ROW else ""
            ratios[f"{name}: first-epoch bytes / split bytes{target}"] = value
    return ratios


def prepare(args, store: Store) -> tuple[dict, str | None]:
    """Shards made (once), uploaded; the peer's MDS shards written into the bucket."""
    local = photo_shards(args.work_dir, args.images, args.shards)
    split, shards, records = split_bytes(local)
    upload(local, store.moto, "photos")
    data = {"local": local, "split_bytes": split, "shards": shards, "records": records}
    import chute

    paths = chute.load_manifest(local).shard_paths("train")
    keys = [f"photos/{os.path.basename(path)}" for path in paths]
    data["downloads"] = [probe_downloads(store, keys, n) for n in (1, WORKERS * 4)]
    peer = None if args.no_peer else peer_python(args.peer_venv, args.peer_packages)
    if peer:
        mds = os.path.join(args.work_dir, "remote-mds")
        shutil.rmtree(mds, ignore_errors=True)
        records_file = os.path.join(args.work_dir, "remote-records.bin")
        export_records(local, records_file)
        spec = {"kind": "write", "records": records_file, "local": mds,
                "remote": f"s3://{BUCKET}/mds", "shard_bytes": -(-split // shards)}  # fmt: skip
        written = in_fresh_process(peer, spec, aws_environment(store.moto), None)
        os.remove(records_file)
        data.update(mds_local=mds, mds_bytes=written["split_bytes"], mds_shards=written["shards"])
    return data, peer


def machine(peer: str | None) -> str:
    versions = []
    for module in ("chute", "grain", "moto", "cv2", "PIL"):
        with contextlib.suppress(Exception):
            from importlib import metadata

            versions.append(f"{module} {metadata.version(module)}")
    if peer:
        found = subprocess.run([peer, __file__, "--check-peer"], capture_output=True, text=True)
        if found.returncode == 0:
            peer_side = json.loads(found.stdout.strip().splitlines()[-1])
            versions.append(", ".join(f"{k} {v}" for k, v in peer_side.items()))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.machine()}, {cores} cores, Python {platform.python_version()}, " + ", ".join(
        versions
    )


def summarise(runs: list[dict], names: list[str]) -> dict:
    def median(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    rows = {}
    for name in names:
        per_round = [run["rows"][name] for run in runs]
        row = {"cache": per_round[0]["cache"]}
        for phase in ("first", "later"):
            for key in ("images_per_s", "images_per_cpu_s", "cpu_pct", "seconds"):
                values = [r[phase][key] for r in per_round if phase in r]
                row[f"{phase}_{key}"] = median(values)
            row[f"{phase}_rounds"] = [r[phase]["images_per_s"] for r in per_round if phase in r]
        row["first_epoch_share"] = median([r["first"]["epoch_share"] for r in per_round])
        row["start_s"] = median([r["start_s"] for r in per_round])
        row["store_cpu_s"] = median([r.get("store_cpu_s") for r in per_round])
        keys = ("first_bytes_over_split", "first_gets", "later_hit_rate",
                "before_first_batch_over_split")  # fmt: skip
        for key in keys:
            row[key] = median([r["derived"].get(key) for r in per_round])
        rows[name] = row
    ratio_names = dict.fromkeys(name for run in runs for name in run["ratios"])
    ratios = {
        name: {
            "median": median([run["ratios"].get(name) for run in runs]),
            "rounds": [run["ratios"].get(name) for run in runs],
        }
        for name in ratio_names
    }
    return {"rows": rows, "ratios": ratios}


def table(summary: dict) -> str:
    def number(value, digits=0, suffix=""):
        return "-" if value is None else f"{value:,.{digits}f}{suffix}"

    lines = [
        "| row | first pass images/s (rounds) | images per CPU-s | later passes images/s "
        "(rounds) | images per CPU-s | first-epoch bytes / split | GETs, first epoch "
        "| later hit rate | start s | split fetched by then | store CPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary["rows"].items():
        first = ", ".join(f"{v:,.0f}" for v in row["first_rounds"])
        later = ", ".join(f"{v:,.0f}" for v in row["later_rounds"])
        share = row["first_epoch_share"]
        cap = "" if share is None or share >= 1 else f" [{share:.0%} of the epoch]"
        lines.append(
            f"| {name} | {number(row['first_images_per_s'])} ({first}){cap} | "
            f"{number(row['first_images_per_cpu_s'])} | {number(row['later_images_per_s'])} "
            f"({later}) | {number(row['later_images_per_cpu_s'])} | "
            f"{number(row['first_bytes_over_split'], 3)} | {number(row['first_gets'])} | "
            f"{number(row['later_hit_rate'], 3)} | {number(row['start_s'], 2)} | "
            f"{number(row['before_first_batch_over_split'], 2)} | "
            f"{number(row['store_cpu_s'], 1)} |"
        )
    lines += ["", "| ratio | median (per round) |", "|---|---:|"]
    for name, ratio in summary["ratios"].items():
        rounds = ", ".join(number(v, 2) for v in ratio["rounds"])
        lines.append(f"| {name} | **{number(ratio['median'], 2)}** ({rounds}) |")
    for probe in summary.get("downloads_alone", []):
        lines.append(
            f"\nThe train split's {summary['shards']} shards alone through the proxy, "
            f"{probe['parallel']} at a time: {probe['seconds']:.1f} s "
            f"({probe['mb_per_s']:.0f} MB/s)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--images", type=int, default=16000, help="photos in the split")
    parser.add_argument("--shards", type=int, default=16, help="train shards at least")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="later passes, at least")
    parser.add_argument("--first-cap", type=float, default=120.0,
                        help="the longest first pass, seconds")  # fmt: skip
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to each request")
    parser.add_argument("--peer-venv", help="default: WORK_DIR/venv-peers")
    parser.add_argument("--no-peer", action="store_true", help="no MosaicML Streaming rows")
    parser.add_argument("--peer-local", action="store_true",
                        help="MosaicML Streaming from local disk too")  # fmt: skip
    parser.add_argument("--peer-packages", nargs="+", default=PEER_PACKAGES,
                        help="what pip installs into a new --peer-venv")  # fmt: skip
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--check-peer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-store", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pass", dest="one_pass", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_store:
        return serve_store(args.latency_ms)
    if args.check_peer:
        return print(json.dumps(peer_versions()))
    if args.one_pass:
        with open(args.one_pass) as handle:
            spec = json.load(handle)
        result = peer_write(spec) if spec["kind"] == "write" else run_pass(spec)
        with open(spec["out"], "w") as handle:
            json.dump(result, handle)
        return None

    os.makedirs(args.work_dir, exist_ok=True)
    args.peer_venv = args.peer_venv or os.path.join(args.work_dir, "venv-peers")
    store = Store(args.latency_ms)
    try:
        data, peer = prepare(args, store)
        rows = rows_of(args, data, store, peer)
        names, runs = list(rows), []
        for number in range(args.rounds):
            measured = {}
            for name in names if number % 2 == 0 else names[::-1]:
                python, spec, env, split = rows[name]
                row = in_fresh_process(python, spec, env, store)
                if "proxy" in spec:
                    row["proxy"] = True
                row["derived"] = derived(row, split)
                measured[name] = row
                shown = {"first": {k: round(v, 3) if isinstance(v, float) else v
                                   for k, v in row["first"].items()}, **row["derived"]}  # fmt: skip
                print(f"round {number + 1}: {name}: {json.dumps(shown)}", flush=True)
            runs.append({"rows": measured, "ratios": ratios_of(measured)})
    finally:
        store.close()
    summary = {
        "machine": machine(peer),
        "images": data["records"], "shards": data["shards"], "split_bytes": data["split_bytes"],
        "mds_shards": data.get("mds_shards"), "mds_bytes": data.get("mds_bytes"),
        "latency_ms": args.latency_ms, "seconds_later_at_least": args.seconds,
        "downloads_alone": data["downloads"],
        "rounds": len(runs), **summarise(runs, names),
    }  # fmt: skip
    print(json.dumps(summary, indent=1, default=float))
    print(table(summary))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"summary": summary, "runs": runs}, handle, indent=1)
    return None


if __name__ == "__main__":
    main()
