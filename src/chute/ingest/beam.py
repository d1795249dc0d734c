"""``chute convert --runner``: a conversion's per-image work on Apache Beam.

The launching process runs the local converter's own steps wherever one view
of the whole dataset is needed: scan the source, read headers when an option
is ``auto``, fix the image spec, split, plan every shard (see
:mod:`chute.ingest.convert`), and at the end add up the shards' notes into
``rejects.csv`` and the manifest. Beam does the work that grows with the
images, on as many machines as the runner gives it::

    shard names -> each shard's items (a task file) -> spread -> read, hash, encode each image
      |-> (sha256, split) -> group by sha256 -> kept, or dropped as a leak ----------------+
      '-> (shard, record) ---------------------------------------------------------------- +-> group
          by shard -> write_shard (the shard, then its note)

The encoder (:func:`chute.ingest.encode.encode_chunk`), the leak rule (a copy
of an image already in a higher split is dropped, as
:class:`~chute.ingest.split.LeakGuard` decides), the record order and the
shard-writing core (:func:`chute.ingest.writer.write_shard`) are the local
converter's, so the shards, ``rejects.csv`` and the manifest are the same
bytes as ``chute convert`` without a runner writes.

Beam retries a failed bundle (and may run one twice), so every write is
idempotent: the core writes a shard under a temporary name of the attempt's
own and renames it into place, then its note; two attempts write the same
bytes. Shards whose note an earlier, killed run left are not written again
(their hashes still take part in the leak rule).

``apache_beam`` is imported only when a runner is asked for; without it the
error names the extra to install.

Example:
    >>> import chute
    >>> chute.convert("gs://my-bucket/flowers", "gs://my-bucket/flowers-shards",
    ...               image_size=224, encoding="jpeg", runner="DataflowRunner",
    ...               pipeline_args=["--project=my-project", "--region=us-central1",
    ...                              "--temp_location=gs://my-bucket/tmp",
    ...                              "--requirements_file=requirements.txt"])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.format import records, storage
from chute.lazy import extra

log = logging.getLogger(__name__)

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")
_TASK = ".task.json"  # OUT/.chute-work/<shard>.task.json: the items of a shard to write
_IO_THREADS = 16  # task files and notes on a bucket are written and read in parallel


def import_beam(runner: str) -> Any:
    """The ``apache_beam`` module, or a ChuteError naming the extra that installs it."""
    try:
        import apache_beam
    except ImportError:
        raise ChuteError(
            f"`runner` needs Apache Beam, which is not installed. Received: runner={runner!r}; "
            f"install it with: {extra('beam', instead='apache-beam')}; or drop the runner to "
            "convert with local processes"
        ) from None
    return apache_beam


class BeamJob:
    """The Beam side of a conversion: runner and options checked at once, then
    :meth:`write_shards` runs the pipeline on the shards left to write.

    Args:
        runner: one of :data:`RUNNERS`.
        pipeline_args: Beam pipeline options as flags (``["--project=p"]``), a
            ``PipelineOptions``, or None.

    Raises:
        ChuteError: an unknown runner, Beam missing, or options Beam refuses
            (with Beam's own message).

    Example:
        >>> job = BeamJob("DirectRunner", ["--direct_num_workers=2"])  # doctest: +SKIP
    """

    def __init__(self, runner: str | None, pipeline_args: Sequence[str] | Any = None):
        # Beam options mean nothing without a runner to run them.
        if runner is None:
            raise ChuteError(
                "`pipeline_args` are Beam pipeline options: they need a `runner` (one of "
                f"{', '.join(RUNNERS)}). Received: pipeline_args={pipeline_args!r}, runner=None"
            )
        self.runner = checks.one_of("runner", runner, RUNNERS)
        self._beam = import_beam(runner)
        self.options = _pipeline_options(runner, pipeline_args)
        self._check_options()  # what Beam checks when a pipeline is made: before any work

    def _archive(self, source: str) -> ChuteError:
        return ChuteError(
            "`runner` converts image files (a folder, or a CSV/JSONL list of paths); an "
            "archive, WebDataset or Parquet source is read by local worker processes. Received: "
            f"runner={self.runner!r}, source={source!r}; drop the runner, or extract the "
            "archive where the workers can read it"
        )

    def check_paths(self, source: str, output: str) -> None:
        """Refuses, before the source is scanned, what the workers could not read or write."""
        from chute.ingest.sources import archives, webdataset

        if archives.is_archive(source) or (
            # A pattern that is no file names WebDataset shards, which local workers read.
            webdataset.is_pattern(source) and not storage.exists(source)
        ):
            raise self._archive(source)
        if source.startswith("keras:") or source.lower().endswith(".npz"):
            raise ChuteError(
                "`runner` converts image files (a folder, or a CSV/JSONL list of paths); an "
                "array source converts in seconds without it. Received: "
                f"runner={self.runner!r}, source={source!r}; drop the runner"
            )
        # Dataflow's workers run on other machines: a local output would land on theirs.
        if self.runner == "DataflowRunner" and not _shared(output):
            raise ChuteError(
                "`output` must be where Dataflow's workers can write it (gs://...). Received: "
                f"output={output!r}, runner='DataflowRunner'"
            )

    def check_source(self, found: Any) -> None:
        """Refuses a scanned source whose images Beam's workers could not read."""
        from chute.ingest.sources import FileSource, MemberSource

        if isinstance(found, MemberSource):
            raise self._archive(found.location)
        if not isinstance(found, FileSource):  # pixel arrays: nothing for a worker to read
            raise ChuteError(
                "`runner` converts image files (a folder, or a CSV/JSONL list of paths); an "
                "array source converts in seconds without it. Received: "
                f"runner={self.runner!r}, source={found.location!r}; drop the runner"
            )
        if self.runner != "DataflowRunner":
            return
        local = next((item.path for item in found.items if not _shared(item.path)), None)
        if local is not None:
            raise ChuteError(
                "`source` must be where Dataflow's workers can read it (gs://...). Received: "
                f"source={found.location!r}, which holds {local!r}, runner='DataflowRunner'"
            )

    def write_shards(
        self,
        found: Any,
        plan: list,
        notes: dict[str, dict | None],
        spec: Any,
        output: str,
        options: Any,
    ) -> dict[str, dict]:
        """Runs the pipeline on the shards without a note; returns every shard's note.

        Args:
            found: the scanned :class:`~chute.ingest.sources.Source`.
            plan: every :class:`~chute.ingest.layout.Shard`, in plan order.
            notes: each shard's note from an earlier run, or None (to write).
            spec: the :class:`~chute.format.spec.ImageSpec`.
            output: the output folder (its work folder exists).
            options: the :class:`~chute.ingest.options.ConvertOptions`.
        """
        from chute.ingest import writer

        todo = [shard for shard in plan if notes[shard.name] is None]
        if not todo:
            return notes
        _write_tasks(found, todo, output)
        done = [name for name, note in notes.items() if note is not None]
        log.info(
            "Beam %s: %d images into %d shard(s)%s",
            self.runner,
            sum(len(shard.indices) for shard in todo),
            len(todo),
            f" ({len(done)} kept from an earlier run)" if done else "",
        )
        pipeline = self._pipeline()
        _build(self._beam, pipeline, [shard.name for shard in todo], done, spec, output, options)
        state = pipeline.run().wait_until_finish()
        # The state's last word: runners spell it "PipelineState.DONE" or "DONE".
        if str(state).rsplit(".", 1)[-1] != "DONE":
            raise ChuteError(
                f"The Beam job ended in state {state} (runner={self.runner!r}); run the same "
                "command again: shards it finished are kept"
            )

        def load(name: str) -> dict | None:
            return writer.load_note(output, name, check_sha256=False)

        names = [shard.name for shard in todo]
        with ThreadPoolExecutor(_threads(output)) as pool:
            written = dict(zip(names, pool.map(load, names), strict=True))
        missing = [name for name, note in written.items() if note is None]
        if missing:
            raise ChuteError(
                f"The Beam job finished without writing {len(missing)} shard(s) "
                f"({', '.join(missing[:5])}) into {output!r}; run the same command again"
            )
        return {**notes, **written}

    def _check_options(self) -> None:
        from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
        from apache_beam.runners import create_runner

        validator = PipelineOptionsValidator(self.options, create_runner(self.runner))
        problems = validator.validate()
        if problems:
            raise ChuteError(
                f"Beam refused the pipeline options for {self.runner}: {' '.join(problems)} "
                f"Received: pipeline_args={_flags(self.options)}"
            )

    def _pipeline(self) -> Any:
        runner = _local_runner(self.options) if self.runner == "DirectRunner" else self.runner
        return self._beam.Pipeline(runner=runner, options=self.options)


def _pipeline_options(runner: str, pipeline_args: Sequence[str] | Any) -> Any:
    """A ``PipelineOptions`` from flags, parsed now: a bad flag is Beam's message, no traceback."""
    from apache_beam.options.pipeline_options import PipelineOptions

    if isinstance(pipeline_args, PipelineOptions):
        options = pipeline_args
    elif pipeline_args is None:
        options = PipelineOptions([])
    elif isinstance(pipeline_args, list | tuple) and all(isinstance(a, str) for a in pipeline_args):
        options = PipelineOptions(list(pipeline_args))
    else:
        raise checks.bad_value(
            "pipeline_args",
            pipeline_args,
            "a list of Beam flags (['--project=my-project', '--region=us-central1']) or a "
            "PipelineOptions",
        )
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):  # argparse prints its usage, then exits
            options.get_all_options()
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1:] or ["cannot parse them"]
        raise ChuteError(
            f"Beam cannot parse the pipeline options: {message[0].split('error: ', 1)[-1]}. "
            f"Received: pipeline_args={pipeline_args!r}"
        ) from None
    named = options.get_all_options().get("runner")  # Beam warns here about unknown flags
    if named is not None and named != runner:
        raise ChuteError(
            "Name the runner once, as `runner` (--runner on the command line), not in the "
            f"pipeline options too. Received: runner={runner!r}, pipeline_args naming {named!r}"
        )
    return options


def _local_runner(options: Any) -> Any:
    """What Beam's DirectRunner runs a batch pipeline on, minus its first try: Prism, a
    binary it downloads from GitHub (no network needed here; same results)."""
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(provision))


def _flags(options: Any) -> list[str]:
    return [f"--{k}={v}" for k, v in sorted(options.get_all_options(drop_default=True).items())]


def _shared(path: str) -> bool:
    """Whether other machines can reach ``path``: not a local or an in-process (ram://) one."""
    return not storage.is_local(path) and not path.startswith("ram://")


def _threads(output: str) -> int:
    # A local disk gains nothing from threads; a bucket's latency is what they hide.
    return 1 if storage.is_local(output) else _IO_THREADS


def _task_path(output: str, name: str) -> str:
    from chute.ingest.resume import WORK_DIR

    return storage.join(output, WORK_DIR, name + _TASK)


def _write_tasks(found: Any, todo: list, output: str) -> None:
    """One task file per shard to write: its items' keys, labels and paths, in record order.

    The pipeline carries only shard names; workers read their items from here (a
    pipeline holding millions of paths would exceed what a runner accepts).
    """

    def write(shard: Any) -> None:
        items = [found.items[i] for i in shard.indices]
        body = {
            "items": [
                [item.key, records.target_of(item.label, item.labels, item.weight), item.path]
                for item in items
            ]
        }
        storage.write_atomic(_task_path(output, shard.name), json.dumps(body).encode())

    with ThreadPoolExecutor(_threads(output)) as pool:
        list(pool.map(write, todo))


def _build(
    beam: Any,
    pipeline: Any,
    todo: list[str],
    done: list[str],
    spec: Any,
    output: str,
    options: Any,
) -> None:
    """The pipeline's steps, each saying why it is there."""
    encoded = (
        pipeline
        | "Shards" >> beam.Create(todo)
        | "Items" >> beam.FlatMap(_task_items, output)
        # one worker lists a shard's items; every worker may encode them
        | "Spread" >> beam.Reshuffle()
        | "Encode" >> beam.Map(_encode, spec, options.max_pixels)
    )
    earlier = (
        pipeline
        | "KeptShards" >> beam.Create(done)
        | "KeptHashes" >> beam.FlatMap(_kept_hashes, output)
    )
    keep = (
        (encoded | "Hashes" >> beam.FlatMap(_hash_of), earlier)
        | "AllHashes" >> beam.Flatten()
        # the leak rule needs every copy of an image, wherever its shard is written
        | "ByHash" >> beam.GroupByKey()
        | "Leaks" >> beam.FlatMap(_decide)
    )
    (
        {"images": encoded | "ByShard" >> beam.Map(_by_shard), "keep": keep}
        # a shard is written by one worker, from all of its records
        | "Gather" >> beam.CoGroupByKey()
        | "Write" >> beam.Map(_write_shard, output)
    )


# -- what the workers run -----------------------------------------------------------------
# Module-level functions (Beam pickles them by reference), without annotations: with
# postponed evaluation they are strings, which Beam's type-hint reader logs and ignores.


def _rank(name: str) -> int:
    """The split rank of a shard name: train 0, val 1, test 2 (lower outranks)."""
    from chute.ingest.layout import split_of
    from chute.ingest.sources.base import SPLITS

    return SPLITS.index(split_of(name))


def _task_items(name, output):
    """``(shard, position, key, label, path)`` of each item of a shard."""
    body = json.loads(storage.read_bytes(_task_path(output, name)))
    for position, (key, label, path) in enumerate(body["items"]):
        # a multi-label or weighted item's target comes back from JSON as a list
        yield name, position, key, records.from_json(label), path


def _encode(item, spec, max_pixels):
    """``(shard, position, label, sha256, record, reject)``: the local encoder's outcome."""
    from chute.ingest.encode import encode_chunk

    name, position, key, label, path = item
    digest, record, reject = encode_chunk([(key, label, path)], spec, max_pixels)[0]
    return name, position, label, digest, record, reject


def _hash_of(encoded):
    """``(sha256, (shard, position, rank))`` of an image that was encoded (not rejected)."""
    name, position, _, digest, _, reject = encoded
    return [] if reject is not None else [(digest, (name, position, _rank(name)))]


def _kept_hashes(name, output):
    """The hashes a shard finished by an earlier run holds, for the leak rule."""
    from chute.ingest import writer

    rank = _rank(name)
    for digest, fate in writer.outcomes(writer.read_note(output, name)):
        if not writer.rejected(fate):
            # No shard name: the copy takes part in the leak rule but is not written again.
            yield digest, ("", -1, rank)


def _decide(group):
    """``(shard, (position, kept))`` for each copy of one image: kept in the highest split
    that holds it (train, then val, then test), dropped elsewhere, as LeakGuard decides."""
    _, copies = group
    copies = list(copies)
    # Every copy in the best split is kept: duplicates within a split are no leak.
    best = min(rank for _, _, rank in copies)
    for name, position, rank in copies:
        if name:  # not a shard an earlier run wrote
            yield name, (position, rank <= best)


def _by_shard(encoded):
    name, position, label, digest, record, reject = encoded
    return name, (position, label, digest, record, reject)


def _write_shard(element, output):
    """Writes one shard from all of its records, in plan order, with the local converter's
    core (a temporary name of this attempt's own, renamed; then the shard's note)."""
    from chute.ingest import writer

    name, groups = element
    keep = dict(groups["keep"])  # position -> stays in its split (rejects have no entry)
    ordered = sorted(groups["images"], key=lambda r: r[0])  # every position, 0 to n - 1
    columns = tuple(list(column) for column in zip(*ordered, strict=True))[1:] or ([],) * 4

    def admit(start: int, digests: list[bytes | None]) -> list[bool]:
        # Every encoded record was decided (a rejected one has no digest here, and no entry).
        return [
            True if digest is None else keep[start + offset]
            for offset, digest in enumerate(digests)
        ]

    writer.write_shard(output, name, [columns], admit=admit)
    return name
