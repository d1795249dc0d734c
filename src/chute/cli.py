"""The ``chute`` command: parse, call the library, print.

    chute demo                              # the whole job on a built-in sample
    chute convert ./Images_with_noise ./kn-shards --image-size 75 \\
        --color-mode grayscale --val-fraction 0.01
    chute inspect ./kn-shards --grid grid.png
    chute verify ./kn-shards
    chute index ./old-shards                # record indexes for a dataset converted without

TensorFlow is imported only by the commands that need it, so ``chute --help``
is instant.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from chute import __version__
from chute.errors import ChuteError
from chute.fit.config import LOAD_TABLE, TrainConfig
from chute.ingest.beam import RUNNERS as BEAM_RUNNERS
from chute.ingest.options import ConvertOptions
from chute.read.options import LoadOptions


def _add_options(
    parser: argparse.ArgumentParser, options: type, names: Collection[str] | None = None
) -> None:
    """One flag per field of an options dataclass (``image_size`` -> ``--image-size``),
    with the help, type and choices its field declares (see :func:`chute.settings.option`);
    only the fields in ``names`` when given.

    Every flag defaults to None, meaning "not given": the dataclass's default
    (or a config file's value) applies.
    """
    for field in dataclasses.fields(options):
        meta = field.metadata
        if not meta.get("flag", True) or (names is not None and field.name not in names):
            continue
        help_text = meta["help"]
        if field.default not in (None, (), False):
            default = field.default
            if isinstance(default, tuple):  # as the flag is written: (0.75, 1.333...) -> 0.75,1.333
                default = ",".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in default)
            help_text += f" (default: {default})"
        # default None: a flag left out must not override a config file's value.
        kwargs: dict = {"dest": field.name, "default": None, "help": help_text}
        if isinstance(field.default, bool) or meta.get("type") is bool:
            # --flag and --no-flag: a config file's True can be turned off on the command line.
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = meta.get("type") or type(field.default)
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            metavar = meta.get("metavar") or {int: "N", float: "X"}.get(kwargs["type"])
            if metavar and not meta.get("choices"):
                kwargs["metavar"] = metavar
        parser.add_argument("--" + field.name.replace("_", "-"), **kwargs)


def _given(args: argparse.Namespace, options: type) -> dict:
    """The options a command line gave (flags left out are not in the dict)."""
    names = (field.name for field in dataclasses.fields(options))
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chute",
        description="Keep TPUs and GPUs fed: image datasets -> verified TFRecord shards.",
    )
    parser.add_argument("--version", action="version", version=f"chute {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log chute's details, other libraries' notes and TensorFlow's native log too",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # the order `chute --help` lists them in: a dataset's life, then the tools around it
    _add_convert(commands)
    _add_inspect(commands)
    _add_verify(commands)
    _add_index(commands)
    _add_train(commands)
    _add_evaluate(commands)
    _add_predict(commands)
    _add_export(commands)
    _add_bench(commands)
    _add_data_service(commands)
    _add_demo(commands)
    return parser


def _add_convert(commands) -> None:
    convert = commands.add_parser(
        "convert",
        help="convert an image dataset into TFRecord shards with a manifest",
        description="Convert a class-per-folder tree, a pre-split tree, a .zip or .tar(.gz) "
        "of one, WebDataset .tar shards ('shard-{000000..000099}.tar'), a CSV/JSONL list, "
        "a .npz file or keras:cifar10|cifar100|mnist|fashion_mnist into sharded TFRecords.",
    )
    convert.add_argument("source", metavar="SRC")
    convert.add_argument("output", metavar="OUT")
    _add_options(convert, ConvertOptions)
    convert.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    convert.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing conversion made with other options",
    )
    convert.add_argument(
        "--append",
        action="store_true",
        help="add SRC's images to the dataset in OUT as its next version: new shards only, "
        "OUT's options and classes kept, copies of its images skipped",
    )
    convert.add_argument(
        "--allow-outside",
        action="store_true",
        help="let a CSV/JSONL list name files outside its folder",
    )
    convert.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars (default: when stderr is a terminal)",
    )
    convert.add_argument(
        "--runner",
        choices=BEAM_RUNNERS,
        metavar="RUNNER",
        help=f"encode and write on Apache Beam: {', '.join(BEAM_RUNNERS)} (chute's beam "
        "extra); flags chute does not know, after SRC OUT, are Beam pipeline options "
        "(--project=P --region=R --temp_location=gs://... --requirements_file=FILE)",
    )


def _add_inspect(commands) -> None:
    inspect = commands.add_parser("inspect", help="summarise a converted dataset")
    inspect.add_argument("path", metavar="OUT")
    inspect.add_argument("--grid", metavar="FILE.png", help="also draw sample images per class")
    inspect.add_argument("--split", default="train", help="split for --grid (default train)")
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")


def _add_verify(commands) -> None:
    verify = commands.add_parser(
        "verify", help="re-read every shard and check it against the manifest"
    )
    verify.add_argument("path", metavar="OUT")
    verify.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    verify.add_argument(
        "--cache-dir",
        nargs="?",
        const="",
        metavar="DIR",
        help="also hash the copies of this dataset's files that the shard cache DIR holds "
        "(default: the default shard cache), deleting the damaged ones",
    )


def _add_index(commands) -> None:
    index = commands.add_parser(
        "index",
        help="add record indexes (random access) to a dataset converted without them",
        description="Read each shard that has no record index once (every record's CRCs "
        "checked), write its index beside it and add it to the manifest; the shards stay "
        "as they are. A dataset indexed already is left alone.",
    )
    index.add_argument("path", metavar="OUT")
    index.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)


def _add_train(commands) -> None:
    train = commands.add_parser("train", help="train a Keras model on converted shards")
    train.add_argument(
        "data", metavar="DATA", help="a folder written by chute convert (not the images)"
    )
    train.add_argument("--run-dir", help="where the model and reports go (default: runs/MODEL)")
    train.add_argument("--config", metavar="FILE.toml", help="options from a TOML file; flags win")
    _add_options(train, TrainConfig)
    _add_options(train, LoadOptions, LOAD_TABLE)  # how the data are read: the [load] table
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a run_dir holding a finished or an interrupted run of other options",
    )
    train.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Keras's progress bar, redrawn every step (default: when stdout is a terminal; "
        "else one line per epoch, for a log file)",
    )


def _add_evaluate(commands) -> None:
    evaluate = commands.add_parser(
        "evaluate",
        help="loss, accuracy, top-5, per-class, confusion (multi-label: mAP, per-label AP, F1)",
    )
    evaluate.add_argument("model", metavar="RUN_OR_MODEL")
    evaluate.add_argument("data", metavar="DATA")
    evaluate.add_argument("--split", default="val")
    evaluate.add_argument("--out", metavar="DIR", help="write the reports here (default: none)")
    _add_options(evaluate, LoadOptions, ("cache_dir", "cache_limit"))  # data in a bucket


def _add_predict(commands) -> None:
    predict = commands.add_parser(
        "predict",
        help="classify image files (on the CPU)",
        description="Classify image files with a model bundle, on the CPU. Inputs that "
        "cannot be classified are listed on stderr. Exit status: 0 when at least one image "
        "was classified (even if others failed), 1 when none was.",
    )
    predict.add_argument("model", metavar="MODEL", help="a run folder or model bundle")
    predict.add_argument("images", metavar="IMAGES", nargs="+", help="files, folders, globs")
    predict.add_argument(
        "--top-k",
        type=int,
        help="classes shown (default: 5 or all; a multi-label model: the labels at or above "
        "their thresholds, or with --top-k the K highest scores)",
    )
    predict.add_argument(
        "--threshold",
        type=float,
        help="a multi-label model: one threshold (0 to 1) for every label (default: the "
        "bundle's tuned ones)",
    )
    output = predict.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true")
    output.add_argument("--csv", action="store_true")


def _add_export(commands) -> None:
    export = commands.add_parser("export", help="write a model for TF Serving or reloading")
    export.add_argument(
        "run", metavar="RUN", help="a chute train run folder, or a model bundle (its folder)"
    )
    export.add_argument(
        "--format",
        choices=("savedmodel", "keras"),
        default="savedmodel",
        help="savedmodel: a TensorFlow SavedModel for TF Serving (uint8 images in, class "
        "probabilities out); keras: the bundle's model.keras, to reload with Keras or chute "
        "predict; either with chute.json (class names, image spec) beside it "
        "(default: %(default)s)",
    )
    export.add_argument("--output", required=True, metavar="DIR", help="the folder to write")
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier chute export in DIR (a folder of other files never is)",
    )


def _add_bench(commands) -> None:
    bench = commands.add_parser(
        "bench", help="time chute.load against Keras's loaders on the same images"
    )
    bench.add_argument("source", metavar="SRC", nargs="?", help="image folder (default: generated)")
    bench.add_argument("--image-size", type=int, default=75, help="(default: %(default)s)")
    bench.add_argument("--color-mode", choices=("grayscale", "rgb"), default="grayscale")
    bench.add_argument("--batch-size", type=int, default=256, help="(default: %(default)s)")
    bench.add_argument(
        "--model",
        help="also time this model's training step: any model chute train takes "
        "(chute.available_models() or a keras.applications name)",
    )
    bench.add_argument(
        "--min-seconds",
        type=float,
        metavar="SECONDS",
        help="time each loader for at least this long, in rounds of two passes (default: 10; "
        "short passes let set-up time and noise decide the ratios)",
    )
    bench.add_argument(
        "--work-dir", help="where generated data and shards go (default: a temp dir)"
    )
    bench.add_argument("--json", metavar="FILE", help="also write the figures as JSON")


def _add_data_service(commands) -> None:
    service = commands.add_parser(
        "data-service",
        help="run a tf.data service dispatcher or worker (preprocessing on spare machines)",
        description="Start a tf.data service server and keep it running until stopped "
        "(Ctrl-C or SIGTERM). Trainers read through it with `chute train --data-service "
        "grpc://HOST:PORT` or chute.load(..., data_service=...). The servers listen on every "
        "network interface with no authentication (TensorFlow offers none): whoever reaches "
        "them can run dataset graphs that read any file the workers can read. Run them on a "
        "private network, or let a firewall admit only the trainers and workers.",
    )
    role = service.add_subparsers(dest="role", required=True, metavar="ROLE")
    dispatcher = role.add_parser("dispatcher", help="the one server that hands out work")
    dispatcher.add_argument("--port", type=int, default=5050, help="(default: %(default)s)")
    dispatcher.add_argument(
        "--work-dir", help="keep its state here, so a restarted dispatcher resumes its jobs"
    )
    worker = role.add_parser("worker", help="a server that runs chute's pipeline for trainers")
    worker.add_argument("--dispatcher", required=True, metavar="HOST:PORT")
    worker.add_argument("--port", type=int, default=0, help="(default: any free port)")
    worker.add_argument(
        "--address",
        metavar="HOST",
        help="the name trainers reach this worker at "
        "(default: localhost with a local dispatcher, else this machine's name)",
    )


def _add_demo(commands) -> None:
    demo = commands.add_parser("demo", help="run the whole job on a built-in sample (no download)")
    demo.add_argument(
        "directory",
        nargs="?",
        default="chute-demo",
        help="where to put the demo's files (default ./chute-demo)",
    )
    demo.add_argument("--classes", type=int, default=24, help="glyph classes (default 24)")
    demo.add_argument("--per-class", type=int, default=60, help="images per class (default 60)")
    demo.add_argument(
        "--epochs", type=int, default=8, help="training epochs, 0 to skip (default 8)"
    )


class _Bars:
    """tqdm progress bars, one per phase, fed by the library's progress callback."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bars: dict = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self.bars.get(phase)
        if bar is None:
            # Unpacking reports bytes (a compressed tar), every other phase images.
            unit = {"unit": "B", "unit_scale": True} if phase == "unpack" else {"unit": "img"}
            bar = self.bars[phase] = tqdm(total=total, desc=phase, leave=False, **unit)
        # The callback gives a running total; tqdm wants the step since its last update.
        bar.update(done - bar.n)
        if done >= total:  # finished: closed now, not left standing at its last redraw
            self.bars.pop(phase).close()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


class _AboveBars:
    """A stream for the log handler while bars are drawn: each line goes through
    ``tqdm.write``, which clears the bars, writes the line and draws them again below it
    (a plain write would land inside a bar's line)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> None:
        from tqdm import tqdm

        tqdm.write(text, file=self.stream, end="")

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def _progress_bars(flag: bool | None) -> Iterator[_Bars]:
    """The bars of one command, closed however it ends (a bar left open garbles the
    error printed after it); ``--progress`` unset: only when stderr is a terminal, so a
    log file gets no carriage-return redraws."""
    bars = _Bars(sys.stderr.isatty() if flag is None else flag)
    # the log lines printed on the bars' stream go above them while they are drawn
    routed = [
        handler
        for handler in logging.getLogger().handlers
        if bars.enabled
        and isinstance(handler, logging.StreamHandler)
        and getattr(handler, "stream", None) is sys.stderr
    ]
    for handler in routed:
        handler.setStream(_AboveBars(sys.stderr))
    try:
        yield bars
    finally:
        bars.close()
        for handler in routed:
            handler.setStream(sys.stderr)


def _convert(args: argparse.Namespace) -> int:
    from chute.ingest.convert import convert

    with _progress_bars(args.progress) as bars:
        result = convert(
            args.source,
            args.output,
            workers=args.workers,
            overwrite=args.overwrite,
            allow_outside=args.allow_outside,
            progress=bars,
            runner=args.runner,
            pipeline_args=args.pipeline_args if args.runner else None,
            append=args.append,
            **_given(args, ConvertOptions),
        )
    manifest = result.manifest
    if result.already_done:
        held = "these images" if args.append else "this conversion (same source and options)"
        print(f"{_shown(args.output)} already holds {held}: nothing to do.")
        return 0
    total = sum(result.num_written.values())
    if args.append:  # this run's images, not the dataset's
        total = (
            sum(manifest.versions[-1]["added"].values()) + manifest.versions[-1]["copies_skipped"]
        )
    rate = total / result.seconds if result.seconds else 0.0
    on = f" on Beam's {args.runner}" if args.runner else ""
    print(
        f"converted {_shown(args.source)} -> {_shown(args.output)}{on} in {result.seconds:.1f} s "
        f"({rate:,.0f} images/s)"
    )
    print(f"  {_labels_headline(manifest)}, {manifest.image.describe()}")
    for name, split in manifest.splits.items():
        print(
            f"  {name:<5} {split.examples:>8} images in {len(split.shards)} shard(s)"
            + (_val_note(args, manifest, split) if name == "val" else "")
        )
    if result.resumed_shards:
        print(f"  resumed: {result.resumed_shards} shard(s) kept from the interrupted run")
    if args.append:
        entry = manifest.versions[-1]
        added = ", ".join(f"{name} +{count}" for name, count in entry["added"].items())
        print(
            f"  version {manifest.version}: {added or 'no image'}; "
            f"{entry['copies_skipped']} cop(ies) of images it held skipped"
        )
    print(
        f"  rejected {result.num_rejected} input(s) (listed in {_shown(args.output)}/rejects.csv); "
        f"{len(manifest.duplicates)} duplicate group(s)"
    )
    return 0


def _val_note(args: argparse.Namespace, manifest: Any, split: Any) -> str:
    """What the summary adds to the val split's line: that it was carved from train by
    default, and how many classes it has no image of."""
    note = ""
    fraction = manifest.options.get("val_fraction")
    if args.val_fraction is None and fraction:
        note += f", {fraction:g} of train by default (the source has no val split)"
    missing = sum(count == 0 for count in split.class_counts)
    if missing:
        note += f"; {missing} of {manifest.num_classes} classes have none"
    return note


def _shown(text: str) -> str:
    """``text`` (a location, a summary, an error) as printed: URLs without credentials."""
    from chute.format.storage import redact_text

    return redact_text(text)


# Images: above, reading every label back to count the negatives would hold the summary up.
_COUNT_NEGATIVES_UP_TO = 200_000


def _labels_headline(manifest: Any) -> str:
    """The classes ("4 classes"), or a multi-label dataset's labels with its negatives,
    counted from the records (the manifest does not hold them) when local and few enough."""
    from chute.format import storage
    from chute.tools import labels

    stats = None
    images = sum(split.examples for split in manifest.splits.values())
    if manifest.multi_label and storage.is_local(manifest.location):
        stats = labels.label_stats(manifest) if images <= _COUNT_NEGATIVES_UP_TO else None
    return labels.headline(manifest, stats)


def _looks_like_images(folder: str, *, levels: int = 2, budget: int = 64) -> bool:
    """Whether a local folder holds image files at its top or in sub-folders up to
    ``levels`` down (class folders, or split folders of them); it stops at the first
    image and lists at most ``budget`` folders, so a large tree costs no time."""
    from chute.image.files import is_image

    pending = [(folder, 0)]
    while pending and budget > 0:
        path, level = pending.pop(0)
        # A bounded look: a huge tree or a slow network folder must not hold the command up.
        budget -= 1
        try:
            entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir() and level < levels:
                    pending.append((entry.path, level + 1))
                elif is_image(entry.name) and entry.is_file():
                    return True
            except OSError:
                continue
    return False


def _refuse_image_folder(path: str, name: str, command: str) -> None:
    """Refuses a folder of images where a converted dataset belongs, with the command
    that converts it (the manifest's own error only says it is not a chute dataset).

    Raises:
        ChuteError: ``path`` is a local folder with images and no manifest.
    """
    from chute.format.manifest import MANIFEST_NAME

    if not os.path.isdir(path) or os.path.exists(os.path.join(path, MANIFEST_NAME)):
        return
    if not _looks_like_images(path):
        return
    folder = os.path.normpath(path)
    # "." or ".." would give the suggested output a useless name: the absolute path instead.
    if os.path.basename(folder) in ("", ".", ".."):
        folder = os.path.abspath(folder)
    out = shlex.quote(folder + "-shards")
    raise ChuteError(
        f"`{name}` must be a folder written by chute convert (with its {MANIFEST_NAME}); "
        f"Received: {name}={path!r}, a folder of images. Convert it first: chute convert "
        f"{shlex.quote(path)} {out} (with --image-size, --val-fraction as you need), then "
        f"chute {command} {out}"
    )


def _inspect(args: argparse.Namespace) -> int:
    _refuse_image_folder(args.path, "OUT", "inspect")
    grid = None
    if args.grid:  # first: whatever makes it fail (a path, TensorFlow) fails before the report
        from chute.tools.grid import draw_grid

        grid = draw_grid(args.path, args.grid, split=args.split)
    if args.json:
        from chute.format.manifest import load

        print(_shown(load(args.path).to_json()), end="")  # a manifest from an older chute
    else:
        from chute.tools.inspect import inspect

        print(inspect(args.path))
    if grid:
        print(f"grid of sample images: {grid}")
    return 0


def _over_dataset(tool: Callable[..., Any], args: argparse.Namespace, command: str) -> Any:
    """``tool(OUT, progress=bars)`` for the commands that read every shard of a converted
    dataset once (verify, index), after refusing a folder of images in its place."""
    _refuse_image_folder(args.path, "OUT", command)
    with _progress_bars(args.progress) as bars:
        return tool(args.path, progress=bars)


def _verify(args: argparse.Namespace) -> int:
    from chute.read.cache import default_directory
    from chute.tools.verify import verify

    cache_dir = None if args.cache_dir is None else args.cache_dir or default_directory()
    report = _over_dataset(lambda *a, **k: verify(*a, cache_dir=cache_dir, **k), args, "verify")
    if report.cache_dir is not None:  # the cache's damaged copies are gone: not the dataset's
        print(
            f"shard cache {report.cache_dir}: {report.cached_copies} cached copies of "
            f"{args.path}'s files checked, {len(report.evicted)} damaged (deleted, fetched "
            "again when read)"
        )
        for name, copy in report.evicted:
            print(f"  DAMAGED copy of {name}: {copy} (deleted)")
    if report.ok:
        print(
            f"ok: {report.num_shards} shards, {report.num_records} records match the manifest "
            f"of {args.path}"
        )
        if report.num_indexes < report.num_shards:
            print(
                f"  {report.num_shards - report.num_indexes} shard(s) have no record index "
                f"(random access, Grain): `chute index {args.path}` adds them"
            )
        if report.old_layout_indexes:
            print(
                f"  {report.old_layout_indexes} record index(es) lie beside the shards, where "
                f"shard globs (train-*) read them: `chute index {args.path}` moves them"
            )
        return 0
    for shard, problem in report.problems:
        print(f"BAD {shard}: {problem}", file=sys.stderr)
    bad = len({shard for shard, _ in report.problems})
    print(f"verify failed: {bad} of {report.num_shards} shard(s) are bad", file=sys.stderr)
    return 1


def _index(args: argparse.Namespace) -> int:
    from chute.tools.index import index

    report = _over_dataset(index, args, "index")
    if report.moved:
        print(
            f"moved {len(report.moved)} record index(es) of {args.path} from beside the shards "
            "(where shard globs such as train-* read them) into its index/ folder"
        )
    if report.already_indexed:
        print(
            f"{args.path} already has the record indexes of its {report.num_shards} shard(s): "
            "nothing to do."
        )
    elif report.written:
        print(
            f"indexed {len(report.written)} of {report.num_shards} shard(s) of {args.path}; "
            "the manifest names their indexes"
        )
    return 0


def _train(args: argparse.Namespace) -> int:
    from chute.fit.train import train

    flags = _given(args, TrainConfig)
    # Reading flags go in the config's [load] table, where a config file keeps them too.
    reading = {k: v for k, v in _given(args, LoadOptions).items() if k in LOAD_TABLE}
    if reading:
        flags["load"] = reading
    config = TrainConfig.from_toml(args.config, **flags) if args.config else TrainConfig(**flags)
    _refuse_image_folder(args.data, "DATA", "train")
    from chute.fit.recipe import default_model

    model = default_model(config)  # "auto" named as the model it is
    run_dir = args.run_dir or os.path.join("runs", model)
    # Keras's bar is redrawn with carriage returns and ANSI codes every step: in a log
    # file (stdout not a terminal) one line per epoch (verbose=2) says the same
    bar = sys.stdout.isatty() if args.progress is None else args.progress
    result = train(
        args.data, run_dir, config=config, overwrite=args.overwrite, verbose=1 if bar else 2
    )
    # a multi-label run reports its mAP estimate (per-label thresholds are in the bundle)
    name, value = (
        ("val mAP", result.best_val_map)
        if result.best_val_map is not None
        else ("val accuracy", result.best_val_accuracy)
    )
    best = "n/a (no val split)" if value is None else f"{value:.4f}"
    print(f"trained {model} on {_shown(args.data)} -> {_shown(result.run_dir)}")
    print(
        f"  best {name} {best}; {result.epochs_run} epoch(s), "
        f"{result.seconds_per_epoch:.1f} s/epoch, {result.images_per_second:,.0f} images/s"
    )
    devices = f"{result.strategy}: {result.replicas} replica(s)"  # tf.distribute's
    if result.backend != "tensorflow":
        devices = f"{result.backend} {result.strategy}: {result.replicas} device(s)"
    print(
        # the batch chute chose when none was given (TrainConfig.batch_size None)
        f"  {devices}, global batch {result.global_batch_size} = "
        f"{result.global_batch_size // result.replicas} x "
        f"{result.replicas}, {result.precision}"
    )
    if result.processes > 1:
        print(f"  {result.processes} JAX processes; process 0, the chief, writes the run directory")
    if result.resumed:
        print("  resumed an interrupted run")
    print(f"  model bundle: {result.bundle}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from chute.fit.evaluate import MultiLabelReport, evaluate

    _refuse_image_folder(args.data, "DATA", "evaluate")
    shard_cache = _given(args, LoadOptions)  # --cache-dir, --cache-limit
    report = evaluate(args.model, args.data, split=args.split, out_dir=args.out, **shard_cache)
    if isinstance(report, MultiLabelReport):
        _print_label_report(report, args.out)
        return 0
    print(
        f"{args.split}: {report.examples} images, loss {report.loss:.4f}, "
        f"accuracy {report.accuracy:.4f}, top-5 {report.top5:.4f}"
    )
    print(_weakest_classes(report.per_class))
    for true, predicted, times in report.most_confused(5):
        print(f"  {true} taken for {predicted} x{times}")
    if args.out:
        print(f"reports in {args.out}")
    return 0


def _weakest_classes(per_class: list[dict], most: int = 5) -> str:
    """The line naming the ``most`` classes of lowest accuracy below 1, or saying there are
    none: a class that scored every image right is no weak class."""
    below = [c for c in per_class if c["accuracy"] is not None and c["accuracy"] < 1.0]
    if not below:
        return "weakest classes: none (every class with images scored 1.00)"
    worst = sorted(below, key=lambda c: c["accuracy"])[:most]
    # Rounded down: a class below perfect never reads 1.00.
    shown = (f"{c['class']} {math.floor(c['accuracy'] * 100) / 100:.2f}" for c in worst)
    return "weakest classes: " + ", ".join(shown)


def _print_label_report(report: Any, out: str | None) -> None:
    """A multi-label evaluation: the summary line, then the per-label table (the
    weakest labels of a long one)."""
    from chute.fit.evaluate_labels import REPORT_ROWS

    many = len(report.labels) > REPORT_ROWS
    print(report.table(most=REPORT_ROWS if many else None))
    if many:
        where = f" (every label in {out})" if out else " (--out DIR writes every label)"
        print(f"{REPORT_ROWS} of {len(report.labels)} labels shown, lowest AP first{where}")
    if out:
        print(f"reports in {out}")


def _predict(args: argparse.Namespace) -> int:
    from chute.fit.predict import predict

    result = predict(args.model, args.images, top_k=args.top_k, threshold=args.threshold)
    # A multi-label model shows the labels it predicts, unless --top-k asks for the top scores.
    labels = result.multi_label and args.top_k is None
    if args.json:
        print(result.to_json())
    elif args.csv:
        print(result.to_csv(top=not labels), end="")
    else:
        for item in result.predictions:
            shown = item.labels if labels else item.top
            top = ", ".join(f"{name} {p:.3f}" for name, p in shown)
            print(f"{item.text_path}: {top or 'no label at or above its threshold'}")
    for path, reason in result.text_failures:  # names not UTF-8: as their keys, \xNN
        print(f"could not classify {path}: {reason}", file=sys.stderr)
    if not result.predictions:  # a partial success is a success; nothing classified is not
        print(
            f"chute predict: error: none of the {len(result.failures)} input(s) could be "
            "classified",
            file=sys.stderr,
        )
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    from chute.fit.export import export

    path = export(args.run, args.output, format=args.format, overwrite=args.overwrite)
    print(f"exported ({args.format}) to {path}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from chute.tools.bench import run, table

    figures = run(
        args.source,
        work_dir=args.work_dir,
        image_size=args.image_size,
        color_mode=args.color_mode,
        batch_size=args.batch_size,
        model=args.model,
        # Left out when not given, so bench.run's own default applies.
        **({} if args.min_seconds is None else {"min_seconds": args.min_seconds}),
        say=lambda line: print(line, file=sys.stderr),
    )
    print(table(figures))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)
    return 0


def _data_service(args: argparse.Namespace) -> int:
    from chute.read.tf import service

    if args.role == "dispatcher":
        server = service.serve_dispatcher(args.port, work_dir=args.work_dir)
        print(f"tf.data service dispatcher on port {args.port}; Ctrl-C stops it", flush=True)
    else:
        server = service.serve_worker(args.dispatcher, port=args.port, address=args.address)
        print(f"tf.data service worker for {args.dispatcher}; Ctrl-C stops it", flush=True)
    service.wait(server)
    # Ended at once: TF 2.21's servers can crash while shutting down (tensorflow#113163),
    # and a dispatcher's state, if any, is in its --work-dir already.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _demo(args: argparse.Namespace) -> int:
    from chute.tools.demo import run

    paths = run(
        args.directory,
        num_classes=args.classes,
        images_per_class=args.per_class,
        epochs=args.epochs,
        say=print,
    )
    print("\nartefacts:\n" + json.dumps(paths, indent=2))
    return 0


# Beam's own flags are snake_case (--temp_location, --num_workers) or one of these words;
# chute's are kebab-case
_BEAM_OPTION = re.compile(r"--([a-z0-9]+_[a-z0-9_]+|project|region|zone|streaming)(=|$)")


class _OwnNotes(logging.Filter):
    """Passes chute's records, and other libraries' warnings and errors (their notes
    too when ``verbose``)."""

    def __init__(self, verbose: bool):
        super().__init__()
        self.lowest = logging.INFO if verbose else logging.WARNING

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name == "chute" or record.name.startswith("chute.")
        return own or record.levelno >= self.lowest


def _quiet_tensorflow(verbose: bool) -> None:
    """TensorFlow's native log (start-up notes, "failed call to cuInit" on a machine
    without a GPU) left out, unless ``verbose`` or the user set TF_CPP_MIN_LOG_LEVEL."""
    if verbose or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    from chute.lazy import quiet_native_start

    # Before TensorFlow is imported: it reads the level once. 3: errors too (what fails
    # reaches chute as a Python exception, shown in its one line)
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    quiet_native_start()  # what it prints while loading, before it reads the level


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``chute`` command; returns the exit code."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)  # with convert --runner: Beam's options
    if extra and not (args.command == "convert" and args.runner):
        # Beam's hint only for what reads as one of its options: a typo is just a typo
        beam = args.command == "convert" and any(_BEAM_OPTION.match(arg) for arg in extra)
        hint = " (Beam pipeline options need --runner)" if beam else ""
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    args.pipeline_args = extra
    _quiet_tensorflow(args.verbose)
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="chute: %(message)s")
    from chute.format.storage import LOG_FILTER

    # every line shown, any library's: a URL's credentials never reach the terminal
    for shown in logging.getLogger().handlers:
        shown.addFilter(LOG_FILTER)
        # "chute: " lines are chute's: another library's notes (botocore's "Found
        # credentials in environment variables") only with -v, its warnings always
        shown.addFilter(_OwnNotes(args.verbose))
    # JAX's own start-up notes (e.g. "Unable to initialize backend 'tpu'" on a machine
    # without one) are not chute's to show
    logging.getLogger("jax").setLevel(logging.WARNING)
    handler = {
        "convert": _convert,
        "inspect": _inspect,
        "verify": _verify,
        "index": _index,
        "train": _train,
        "evaluate": _evaluate,
        "predict": _predict,
        "export": _export,
        "bench": _bench,
        "data-service": _data_service,
        "demo": _demo,
    }[args.command]
    try:
        return handler(args)
    except ChuteError as error:
        print(f"chute {args.command}: error: {_shown(str(error))}", file=sys.stderr)
        return 2
    except OSError as error:  # a path the user gave cannot be read or written
        print(f"chute {args.command}: error: {_shown(str(error))}", file=sys.stderr)
        return 1
    except Exception as error:
        # TensorFlow's file errors (tf.errors.NotFoundError, PermissionDeniedError, ...)
        # are not OSErrors; they too are about a path the user gave.
        if type(error).__module__.startswith("tensorflow") and hasattr(error, "message"):
            print(f"chute {args.command}: error: {_shown(error.message)}", file=sys.stderr)
            return 1
        raise
    # 130 = 128 + SIGINT, the status a shell gives a command stopped by Ctrl-C.
    except KeyboardInterrupt:
        print("\ninterrupted; run the same command again to resume", file=sys.stderr)
        return 130
