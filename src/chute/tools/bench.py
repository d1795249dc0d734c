"""``chute bench``: how fast each way of feeding images runs, side by side, on the same data.

Loaders measured in one run: ``chute.load`` from shards (a first pass, and a
pass from its in-memory cache), ``chute.image_dataset_from_directory``,
Keras's ``image_dataset_from_directory``, ``ImageDataGenerator.flow_from_directory``
(when ``tf_keras`` is installed), and an in-memory
``Dataset.from_tensor_slices`` baseline with the same batching. Every loader
is timed in rounds (create the dataset, pass 1, pass 2) until it has run for
at least ``min_seconds`` (10 s by default: short passes let set-up time and
the noise of a shared machine decide the ratio); its figures are the mean
pass of its rounds. Ratios compare chute's passes with each baseline's faster
pass. With ``model``, the model's training step is timed on synthetic
batches, to tell which side (input or compute) is the bottleneck.

Every argument (the model included) is checked before anything is converted or timed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np

from chute import checks, collector
from chute.errors import ChuteError
from chute.fit import models
from chute.ingest.convert import convert
from chute.lazy import extra, keras, tf
from chute.read import dropin
from chute.read.load import load
from chute.tools import samples

log = logging.getLogger(__name__)

MIN_SECONDS = 10.0
"""How long each loader is timed, at least (``--min-seconds``)."""
COLOR_MODES = ("grayscale", "rgb")


@dataclasses.dataclass
class Row:
    """One loader's passes: images per pass, seconds per pass (pass 1 includes
    ``build``, the seconds spent creating the dataset) and CPU-seconds per pass (of
    every thread of this process: what reading cost the host), each the mean of
    ``rounds`` rounds."""

    name: str
    images: int
    seconds: list[float]
    build: float = 0.0
    rounds: int = 1
    cpu: list[float] = dataclasses.field(default_factory=list)

    @property
    def per_cpu_second(self) -> list[float]:
        """Images per CPU-second of each pass: steady on a busy machine, where images
        per second are not, and what a small host feeding an accelerator runs out of."""
        return [self.images / c if c > 0 else 0.0 for c in self.cpu]

    @property
    def rates(self) -> list[float]:
        """Images per second of each pass."""
        return [self.images / s for s in self.seconds]

    @property
    def best(self) -> float:
        """The faster pass, in images per second."""
        return max(self.rates)


def _cpu() -> float:
    """CPU-seconds of this process (every thread) and of its children that ended, to the
    microsecond (``os.times`` counts 10 ms ticks: a short pass would read 0)."""
    try:
        import resource
    except ImportError:  # Windows: no children's figure, and the process's at its resolution
        return time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _timed_passes(make: Callable, passes: int = 2) -> tuple[int, list[float], float, list[float]]:
    """Creates the dataset (timed with the first pass, and on its own) and
    iterates it ``passes`` times: ``(images, seconds per pass, build, CPU per pass)``."""
    with collector.paused(collect_first=True):  # as timeit does
        started, cpu_started = time.perf_counter(), _cpu()
        dataset = make()
        build = time.perf_counter() - started
        seconds, cpu, images = [], [], 0
        for _ in range(passes):
            images = 0
            for batch in dataset:
                # Counted from the batches: a short last batch counts as it is.
                images += int(batch[0].shape[0])
            seconds.append(time.perf_counter() - started)
            cpu.append(_cpu() - cpu_started)
            started, cpu_started = time.perf_counter(), _cpu()
    return images, seconds, build, cpu


def _rounds(
    one_round: Callable, min_seconds: float
) -> tuple[int, list[float], float, int, list[float]]:
    """``one_round()`` (``(images, seconds per pass, build, CPU per pass)``) repeated
    until the passes took ``min_seconds`` in all: ``(images, mean seconds per pass, mean
    build, rounds, mean CPU-seconds per pass)``."""
    totals: list[float] = []
    cpu_totals: list[float] = []
    builds, rounds, spent = 0.0, 0, 0.0
    while True:
        images, seconds, build, cpu = one_round()
        # Whole rounds until min_seconds: one round alone is at the mercy of a busy machine.
        totals = [t + s for t, s in zip(totals, seconds, strict=True)] if totals else seconds
        cpu_totals = [t + c for t, c in zip(cpu_totals, cpu, strict=True)] if cpu_totals else cpu
        builds, rounds, spent = builds + build, rounds + 1, spent + sum(seconds)
        if spent >= min_seconds:
            means = [t / rounds for t in totals]
            return images, means, builds / rounds, rounds, [c / rounds for c in cpu_totals]


def _idg_class():
    """tf_keras's ``ImageDataGenerator``, or None when it (or SciPy) is not installed."""
    try:
        import scipy  # noqa: F401  (ImageDataGenerator's transforms need it)
        from tf_keras.preprocessing.image import ImageDataGenerator
    except ImportError:
        return None
    return ImageDataGenerator


def _idg_passes(generator, src: str, size: tuple[int, int], color_mode: str, batch: int):
    """One round of ``flow_from_directory``: ``(images, seconds per pass, 0.0, CPU per
    pass)``; its creation counts in pass 1, as before."""
    with collector.paused(collect_first=True):  # as timeit does
        started, cpu_started = time.perf_counter(), _cpu()
        flow = generator().flow_from_directory(
            src, target_size=size, color_mode=color_mode, batch_size=batch, class_mode="sparse"
        )
        seconds, cpu = [], []
        for _ in range(2):
            for _ in range(len(flow)):
                next(flow)
            seconds.append(time.perf_counter() - started)
            cpu.append(_cpu() - cpu_started)
            started, cpu_started = time.perf_counter(), _cpu()
    return flow.samples, seconds, 0.0, cpu


def run(
    source: str | None = None,
    *,
    work_dir: str | None = None,
    image_size: int = 75,
    color_mode: str = "grayscale",
    batch_size: int = 256,
    model: str | None = None,
    min_seconds: float = MIN_SECONDS,
    say: Callable[[str], None] = lambda line: None,
) -> dict:
    """Runs the benchmark; returns its figures (also what ``--json`` writes).

    Args:
        source: a class-per-folder image tree; default: generate the 657-class
            glyph set of the convert benchmark (26,280 100x100 PNGs).
        work_dir: where generated data and shards go (default: a temp dir).
        image_size: square size every loader resizes to.
        color_mode: ``"grayscale"`` or ``"rgb"``.
        batch_size: batch size of every loader, at most the number of images.
        model: also time this model's training step: any name ``chute train``
            accepts (``chute.available_models()`` or a ``keras.applications`` name).
        min_seconds: how long each loader (and the model's step) is timed, at
            least: rounds of two passes are repeated until then.
        say: receives progress lines.

    Raises:
        ChuteError: a bad argument (named), checked before any work; a model
            that cannot take ``image_size`` images; fewer images than ``batch_size``.

    Example:
        >>> figures = run(say=print)  # doctest: +SKIP
    """
    image_size = checks.positive_int("image_size", image_size)
    checks.one_of("color_mode", color_mode, COLOR_MODES)
    batch_size = checks.positive_int("batch_size", batch_size)
    min_seconds = checks.positive_number("min_seconds", min_seconds, "a positive number of seconds")
    if source is not None and not os.path.isdir(source):
        raise ChuteError(f"`source` must be a folder of class folders. Received: source={source!r}")
    size = (image_size, image_size)
    channels = 1 if color_mode == "grayscale" else 3
    # Built before anything is timed: a name chute train would refuse, or an image size
    # the model cannot take, fails now rather than after every loader was timed.
    keras_model = _model(model, size, channels) if model else None
    work_dir = work_dir or os.path.join(tempfile.gettempdir(), "chute-bench")
    if source is None:
        # The convert benchmark's glyph set: the two benchmarks measure the same images.
        source = os.path.join(work_dir, "glyphs-657")
        # .complete is written last: an interrupted generation is made again, not timed half-made.
        if not os.path.exists(os.path.join(source, ".complete")):
            say(f"generating the benchmark images in {source} (once)")
            samples.make_sample_folder(
                source, num_classes=657, images_per_class=40, image_size=(100, 100)
            )
            open(os.path.join(source, ".complete"), "w").close()
    shards = os.path.join(work_dir, "shards")
    say(f"converting {source} to {shards}")
    converted = convert(
        source, shards, image_size=image_size, color_mode=color_mode, encoding="raw", overwrite=True
    )
    found = converted.manifest.num_examples("train")
    if found < batch_size:  # training drops the short batch: chute.load would yield nothing
        raise ChuteError(
            f"`batch_size` must be at most the number of images read from {source} "
            f"({found}): chute.load drops a training split's short last batch, so it would "
            f"time no image. Received: batch_size={batch_size}"
        )
    if hasattr(os, "sync"):
        os.sync()  # the new shards written back now, not by the kernel during a timed pass
    say(
        f"each loader is timed for at least {min_seconds:g} s "
        "(rounds of: create, pass 1, pass 2; --min-seconds)"
    )
    rows = _measure(source, shards, size, color_mode, batch_size, min_seconds, say)
    n = rows[0].images
    ratios = _ratios(rows)
    figures = {
        "source": source,
        "images": n,
        "image_size": list(size),
        "color_mode": color_mode,
        "batch_size": batch_size,
        "cores": os.cpu_count(),
        "min_seconds": min_seconds,
        "loaders": [
            {
                "name": r.name,
                "images": r.images,
                "seconds": [round(s, 6) for s in r.seconds],
                "build_seconds": round(r.build, 6),
                "images_per_s": [round(x) for x in r.rates],
                "cpu_seconds": [round(c, 6) for c in r.cpu],
                "images_per_cpu_s": [round(x) for x in r.per_cpu_second],
                "rounds": r.rounds,
            }
            for r in rows
        ],
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
    }
    if keras_model is not None:
        first, cached = rows[0].rates[0], rows[0].rates[1]
        rate = _train_rate(keras_model, size, channels, batch_size, min_seconds)
        figures["model"] = _feed_figures(model, rate, first, cached)
    return figures


def _ratios(rows: list[Row]) -> dict[str, float]:
    """chute's passes against each baseline's faster pass."""
    # Names without their "(...)" notes, so the baselines are found by their plain names.
    by_name = {row.name.split(" (")[0]: row for row in rows}
    load_row = rows[0]
    first, cached = load_row.rates[0], load_row.rates[1]
    ratios = {}
    for baseline in (
        "keras image_dataset_from_directory",
        "tf_keras ImageDataGenerator.flow_from_directory",
    ):
        if baseline in by_name:
            ratios[f"chute.load first pass / {baseline}"] = first / by_name[baseline].best
            # cache=None: the pipeline for splits that do not fit in memory
            ratios[f"chute.load first pass, no cache / {baseline}"] = (
                by_name["chute.load, no cache"].rates[0] / by_name[baseline].best
            )
    # The same first pass without the one-time building of the dataset (tracing
    # its functions): the reading itself, which is what grows with the data.
    reading = load_row.images / (load_row.seconds[0] - load_row.build)
    for baseline in (
        "keras image_dataset_from_directory",
        "tf_keras ImageDataGenerator.flow_from_directory",
    ):
        if baseline in by_name:
            name = f"chute.load first pass without building the dataset / {baseline}"
            ratios[name] = reading / by_name[baseline].best
    # Per CPU-second: the host's cost of an image, whatever else the machine runs.
    for baseline in (
        "keras image_dataset_from_directory",
        "tf_keras ImageDataGenerator.flow_from_directory",
    ):
        if baseline in by_name and max(by_name[baseline].per_cpu_second, default=0) > 0:
            ratios[f"chute.load first pass per CPU-second / {baseline}"] = by_name[
                "chute.load, no cache"
            ].per_cpu_second[0] / max(by_name[baseline].per_cpu_second)
    ratios["chute.load cached pass / from_tensor_slices"] = (
        cached / by_name["in-memory Dataset.from_tensor_slices"].best
    )
    ratios["chute drop-in / keras image_dataset_from_directory"] = (
        by_name["chute.image_dataset_from_directory"].best
        / by_name["keras image_dataset_from_directory"].best
    )
    return ratios


def _measure(source, shards, size, color_mode, batch_size, min_seconds, say) -> list[Row]:
    """Every loader's rounds of two passes, chute.load first."""
    rows: list[Row] = []

    def measure(name: str, make: Callable) -> None:
        say(f"timing {name}")
        rows.append(Row(name, *_rounds(lambda: _timed_passes(make), min_seconds)))

    # Warm-up passes so one-time costs are charged to nobody, as the baselines'
    # fall in their slower pass: TensorFlow's start-up (modules and kernels it
    # loads on first use). Two per chute.load configuration timed below.
    for cache in (None, "memory", None, "memory"):
        _timed_passes(lambda c=cache: load(shards, batch_size=batch_size, cache=c), 1)
    measure(
        "chute.load (pass 1: shards; pass 2: cache)",
        lambda: load(shards, batch_size=batch_size, cache="memory"),
    )
    measure("chute.load, no cache", lambda: load(shards, batch_size=batch_size, cache=None))
    measure(
        "chute.image_dataset_from_directory",
        lambda: dropin.image_dataset_from_directory(
            source, image_size=size, color_mode=color_mode, batch_size=batch_size, verbose=False
        ),
    )
    measure(
        "keras image_dataset_from_directory",
        lambda: keras.utils.image_dataset_from_directory(
            source, image_size=size, color_mode=color_mode, batch_size=batch_size, verbose=False
        ),
    )
    generator = _idg_class()
    if generator is not None:
        name = "tf_keras ImageDataGenerator.flow_from_directory"
        say(f"timing {name}")
        passes = functools.partial(_idg_passes, generator, source, size, color_mode, batch_size)
        rows.append(Row(name, *_rounds(passes, min_seconds)))
    else:
        say(f"ImageDataGenerator skipped: it needs tf-keras and scipy: {extra('bench')}")
    channels = 1 if color_mode == "grayscale" else 3
    # rows[1]: the uncached chute.load, whose image count is the dataset's.
    images = tf.zeros((rows[1].images, *size, channels), tf.uint8)
    labels = tf.zeros((rows[1].images,), tf.int32)
    measure(
        "in-memory Dataset.from_tensor_slices (baseline)",
        lambda: (
            tf.data.Dataset.from_tensor_slices((images, labels))
            # Shuffled, short batch dropped: as chute.load reads a training split.
            .shuffle(len(labels))
            .batch(batch_size, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        ),
    )

    return rows


def _model(name: str, size: tuple[int, int], channels: int):
    """The model ``chute train --model name`` trains (10 classes, random weights), compiled.
    An unknown name is a ChuteError naming ``model``; a size the model cannot take, one
    naming ``input_shape``."""
    models.check_model(name)
    model = models.build_model(name, input_shape=(*size, channels), num_classes=10)
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _train_rate(model, size, channels, batch_size: int, min_seconds: float) -> float:
    """Images per second of ``model``'s training step on a synthetic uint8 batch: at least
    5 steps and ``min_seconds``, after one step that compiles it."""
    x = np.random.default_rng(0).integers(0, 256, (batch_size, *size, channels), dtype=np.uint8)
    y = np.zeros((batch_size,), "int32")
    model.train_on_batch(x, y)  # compile the step
    steps, started = 0, time.perf_counter()
    # At least 5 steps: on a fast model min_seconds alone could time too few to average.
    while steps < 5 or time.perf_counter() - started < min_seconds:
        model.train_on_batch(x, y)
        steps += 1
    return steps * batch_size / (time.perf_counter() - started)


def _feed_figures(name: str, train_rate: float, first_rate: float, cached_rate: float) -> dict:
    """How many times the model's appetite the input feeds, and which side is slower."""
    feed = first_rate / train_rate
    return {
        "model": name,
        "train_images_per_s": round(train_rate),
        "feed_ratio_first_pass": round(feed, 2),
        "feed_ratio_cached": round(cached_rate / train_rate, 2),
        "bottleneck": "input pipeline" if feed < 1 else "model compute",
    }


def table(figures: dict) -> str:
    """The figures as a readable table."""
    lines = [
        f"{figures['images']} images, {figures['image_size'][0]}x{figures['image_size'][1]} "
        f"{figures['color_mode']}, batch {figures['batch_size']}, {figures['cores']} cores",
        f"each loader timed for at least {figures.get('min_seconds', 0):g} s: rounds of "
        "(create, pass 1, pass 2), each pass the mean of its rounds",
        "",
        f"{'loader':<52} {'pass 1 img/s':>13} {'pass 2 img/s':>13} {'img/CPU-s':>10} {'rounds':>7}",
    ]
    for row in figures["loaders"]:
        rates = row["images_per_s"]
        rounds = row.get("rounds", 1)
        # The pass without a cache's help: pass 1 (figures from before had none).
        per_cpu = (row.get("images_per_cpu_s") or [0])[0]
        lines.append(
            f"{row['name']:<52} {rates[0]:>13,} {rates[-1]:>13,} {per_cpu:>10,} {rounds:>7}"
        )
    lines.append("")
    lines += [f"{name}: {value}x" for name, value in figures["ratios"].items()]
    if "model" in figures:
        m = figures["model"]
        lines.append(
            f"{m['model']} trains at {m['train_images_per_s']:,} img/s; chute.load feeds "
            f"{m['feed_ratio_first_pass']}x that (cached: {m['feed_ratio_cached']}x): "
            f"the bottleneck is the {m['bottleneck']}"
        )
    return "\n".join(lines)
