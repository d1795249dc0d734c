"""JAX on several hosts: the same ``chute train`` on every host, one process on each.

The processes join through ``jax.distributed.initialize``, as
``keras.distribution.initialize`` does (:func:`join`): on a Cloud TPU slice JAX
finds the coordinator, the number of processes and this one's index by itself;
elsewhere they come from ``--coordinator HOST:PORT --num-processes N
--process-id I`` (the ``coordinator``, ``num_processes`` and ``process_id``
options) or from Keras's ``KERAS_DISTRIBUTION_JOB_ADDRESSES``,
``KERAS_DISTRIBUTION_NUM_PROCESSES`` and ``KERAS_DISTRIBUTION_PROCESS_ID``. When
all three are known, the processes first wait for each other on the
coordinator's port, at most ``process_timeout`` seconds (``--process-timeout``,
300 by default): one that does not come ends the others with one line naming it
(:mod:`chute.fit.rendezvous`), where JAX alone would abort them with a C++ stack.
One ``keras.distribution.DataParallel`` then spans every device of every process
(:mod:`chute.fit.backend`), and:

- each process reads its own part of each split with ``chute.load``, through
  the same input context as a ``tf.distribute`` host (its own shards when there
  are enough, else every N-th record), in batches of the per-device batch times
  its own devices; Keras assembles the processes' batches into each global batch
  (``jax.make_array_from_process_local_data``). Training runs the smallest part's
  steps on every process; validation the largest part's, the others padded with
  examples of weight 0, so every example counts once.
- process 0, the chief, writes the run directory. The others keep what Keras's
  callbacks need in a temporary folder of their own, filled before training with
  the chief's backup and progress (:func:`prepare_run`): a resumed run resumes
  from the chief's backup on every process, whatever each host's disk holds.
- what the chief does alone runs with the distribution set aside
  (:func:`alone`, :func:`chief_only`): under it, making or assigning a Keras
  variable is a collective every process must join (JAX checks that the value is
  the same everywhere), and Keras makes one whenever it saves a model.

Example:
    >>> processes = join(config)  # doctest: +SKIP
    >>> processes.count, processes.index, processes.chief  # doctest: +SKIP
    (2, 1, False)
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import inspect
import io
import logging
import math
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from chute import checks
from chute.errors import ChuteError
from chute.fit import rendezvous, rundir
from chute.fit import strategy as strategy_lib
from chute.fit.devices import Devices
from chute.format import storage
from chute.lazy import keras

if TYPE_CHECKING:
    from chute.fit.config import TrainConfig

log = logging.getLogger(__name__)

# Keras's own variables for keras.distribution.initialize (read when an option is not given)
ENVIRONMENT = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)
OPTIONS = ("coordinator", "num_processes", "process_id")
# An IPv6 host needs its brackets: without them its colons could not be told from the port's.
_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>\d{1,5})$")
_CHUNK = 64 << 20  # bytes sent from the chief per collective


def check_coordinator(value: Any) -> str | None:
    """None, or the coordinator's address as ``HOST:PORT`` (an IPv6 host in brackets).

    Example:
        >>> check_coordinator("10.0.0.2:1234")
        '10.0.0.2:1234'
    """
    # Not given: the cluster may still come from Keras's variables or a Cloud TPU slice.
    if value is None:
        return None
    match = _ADDRESS.match(value) if isinstance(value, str) else None
    if match is None or not 0 < int(match["port"]) < 65536:
        raise checks.bad_value(
            "coordinator", value, "HOST:PORT, the address of process 0 (e.g. 10.0.0.2:1234)"
        )
    return value


@dataclasses.dataclass(frozen=True)
class Processes:
    """The processes of a run, one per host: how many, and this one's index (0: the chief)."""

    count: int = 1
    index: int = 0

    @property
    def chief(self) -> bool:
        """Whether this process writes the run directory."""
        return self.index == 0


def join(config: TrainConfig) -> Processes:
    """Joins this process to the others of a JAX run on several hosts, and says where it stands.

    Joins (``jax.distributed.initialize``, as ``keras.distribution.initialize`` does) when
    an option (``coordinator``, ``num_processes``, ``process_id``) or one of Keras's
    variables (:data:`ENVIRONMENT`) asks, unless JAX's processes are already joined (by the
    caller, in Python); then reports JAX's own count and index. On another backend,
    touches nothing. With all three known, the processes first wait for each other, at
    most ``process_timeout`` seconds (:func:`chute.fit.rendezvous.wait_for_processes`).

    Raises:
        ChuteError: the options on a backend other than JAX, a process that did not
            come within ``process_timeout``, or JAX could not join.
    """
    asked = {name: getattr(config, name) for name in OPTIONS if getattr(config, name) is not None}
    # Only JAX joins processes here; TensorFlow's workers come from TF_CONFIG instead.
    if config.backend != "jax":
        if asked:
            given = ", ".join(f"{name}={value!r}" for name, value in asked.items())
            raise ChuteError(
                f"`coordinator`, `num_processes` and `process_id` join JAX processes "
                f"(keras.distribution.initialize); the {config.backend} backend does not use "
                f"them. Received: {given}, backend={config.backend!r}; use --backend jax, or "
                "for TensorFlow's workers set TF_CONFIG (--strategy multiworker)"
            )
        return Processes()
    import jax

    # Already joined by the caller: joining twice is an error in JAX, so report its count as it is.
    named = [name for name in ENVIRONMENT if os.environ.get(name)]
    if (asked or named) and not jax.distributed.is_initialized():
        # The same seed everywhere first (Keras's initialize would agree on one otherwise).
        keras.utils.set_random_seed(config.seed)
        coordinator, count, index = _cluster(config)
        # A rendezvous needs all three; with fewer (a Cloud TPU slice) JAX finds the rest itself.
        if (
            coordinator
            and _ADDRESS.match(coordinator)
            and count
            and count > 1
            and index is not None
        ):
            # JAX alone would wait in C++ and then abort (SIGABRT) for a process that never came
            rendezvous.wait_for_processes(
                coordinator, count=count, index=index, timeout=config.process_timeout
            )
        try:
            jax.distributed.initialize(
                coordinator, count, index, **_initialization_timeout(jax, config.process_timeout)
            )
        except (ValueError, TypeError, RuntimeError) as error:
            # JAX's message can be long and names no option: keep its head and list what was given.
            given = {**asked, **{name: os.environ[name] for name in named}}
            raise ChuteError(
                f"JAX's processes could not join ({str(error).strip()[:300]}). Received: "
                + ", ".join(f"{name}={value!r}" for name, value in given.items())
                + "; pass --coordinator HOST:PORT (process 0's address) --num-processes N "
                "--process-id I on every host (on a Cloud TPU slice JAX finds them itself)"
            ) from None
    processes = Processes(jax.process_count(), jax.process_index())
    if processes.count > 1:
        log.info(
            "JAX process %d of %d (%s), %d of %d devices here",
            processes.index,
            processes.count,
            "the chief: it writes the run directory" if processes.chief else "not the chief",
            jax.local_device_count(),
            jax.device_count(),
        )
    return processes


def _cluster(config: TrainConfig) -> tuple[str | None, int | None, int | None]:
    """The coordinator's address, the number of processes and this one's index: from the
    options, else from Keras's variables (read as ``keras.distribution.initialize`` reads
    them: the first of several addresses is the coordinator); None where neither says."""
    values: list[Any] = []
    for option, variable in zip(OPTIONS, ENVIRONMENT, strict=True):
        value = getattr(config, option)
        # An option given on the command line wins over Keras's variable.
        if value is None and os.environ.get(variable):
            value = os.environ[variable]
            if option != "coordinator":
                if not value.strip().isdigit():
                    raise checks.bad_value(variable, value, "a whole number")
                value = int(value)
        values.append(value)
    coordinator, count, index = values
    if coordinator and "," in coordinator:
        addresses = coordinator.split(",")
        if count is not None and count != len(addresses):
            raise ChuteError(
                f"{ENVIRONMENT[0]} lists {len(addresses)} addresses but there are {count} "
                f"processes: list one per process, or only process 0's. Received: "
                f"{ENVIRONMENT[0]}={coordinator!r}, num_processes={count}"
            )
        # Keras's convention: the first address of the list is the coordinator's.
        coordinator = addresses[0]
    return coordinator, count, index


def _initialization_timeout(jax: Any, seconds: float) -> dict[str, int]:
    """``jax.distributed.initialize``'s own wait, ``seconds`` rounded up, where this JAX
    takes it (an older one has its fixed wait)."""
    # Asked by signature, not version: an older JAX has no such parameter, only its fixed wait.
    if "initialization_timeout" in inspect.signature(jax.distributed.initialize).parameters:
        return {"initialization_timeout": max(1, math.ceil(seconds))}
    return {}


def prepare_run(
    run_dir: str | os.PathLike,
    *,
    overwrite: bool,
    processes: Processes,
    started: dict[str, Any] | None = None,
) -> rundir.RunDir:
    """The run folder this process writes (see :func:`chute.fit.rundir.prepare`).

    One process: the run folder (under ``MultiWorkerMirroredStrategy``, a worker's
    own inside it). Several JAX processes: the chief's is the run folder; every
    other process gets a temporary folder (removed at exit) holding a copy of the
    chief's backup and progress, which its callbacks resume from.

    Raises:
        ChuteError: the chief refused the run folder (every process raises it).
    """
    if processes.count == 1:
        # Under MultiWorkerMirroredStrategy each worker still writes a folder of its own.
        worker = strategy_lib.worker_index()
        return rundir.prepare(run_dir, overwrite=overwrite, worker_index=worker, started=started)
    run, refused = None, None
    if processes.chief:
        try:
            run = rundir.prepare(run_dir, overwrite=overwrite, started=started)
        except Exception as error:  # the others hear of it (or would wait for the chief)
            refused = error
    # what the others need: the verdict, and the files a resumed run continues from
    payload = _pack(run) if run is not None else str(refused).encode()
    header = [int(run is not None), int(run is not None and run.resumed)]
    (ok, resumed), payload = _from_chief(header, payload, processes)
    # Raised only after the broadcast: the others must hear the verdict before the chief leaves.
    if refused is not None:
        raise refused
    if not ok:
        where = os.fspath(run_dir)
        raise ChuteError(f"process 0 (the chief) cannot train in {where!r}: {payload.decode()}")
    if run is not None:
        if run.resumed:
            log.info("resuming the run in %s from its backup, on every process", run.path)
        return run
    local = rundir.RunDir(
        tempfile.mkdtemp(prefix=f"chute-process-{processes.index}-"), bool(resumed)
    )
    # The copy is only for this run's callbacks; the chief's run folder is the one that lasts.
    atexit.register(shutil.rmtree, local.path, True)
    names = _unpack(payload, local.path)
    if resumed:
        log.info("process %d resumes from the chief's backup (%d file(s))", processes.index, names)
    return local


def _resume_files(run: rundir.RunDir) -> list[str]:
    """Paths, relative to the run folder, of what a resumed run continues from: the
    backup folder (every phase's) and each phase's progress."""
    found = []
    pending = ["backup"] if storage.exists(run.backup) else []
    while pending:
        relative = pending.pop()
        for name in storage.listdir(run.join(relative)):
            path = f"{relative}/{name}"
            (pending if storage.isdir(run.join(path)) else found).append(path)
    # One progress file per phase, beside the backup folder rather than inside it.
    found += [n for n in storage.listdir(run.path) if n.startswith("progress-")]
    return sorted(found)


def _pack(run: rundir.RunDir) -> bytes:
    """The files of :func:`_resume_files`, as an uncompressed zip."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for relative in _resume_files(run):
            archive.writestr(relative, storage.read_bytes(run.join(*relative.split("/"))))
    return buffer.getvalue()


def _unpack(payload: bytes, folder: str) -> int:
    """Writes the files :func:`_pack` packed into ``folder``; returns how many."""
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        names = archive.namelist()
        for name in names:
            path = os.path.join(folder, *name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(archive.read(name))
    return len(names)


def _from_chief(
    header: Sequence[int], payload: bytes, processes: Processes
) -> tuple[list[int], bytes]:
    """The chief's ``header`` (small integers) and ``payload`` on every process: JAX
    collectives over every device (a psum in which only the chief's part is not 0), in
    pieces of at most 64 MiB; what the other processes pass is ignored."""
    from jax.experimental import multihost_utils

    # The size travels as two int32 (quotient, remainder): a payload over 2 GiB would overflow one.
    head = np.asarray([*header, len(payload) // _CHUNK, len(payload) % _CHUNK], np.int32)
    head = np.asarray(multihost_utils.broadcast_one_to_all(head))
    size = int(head[-2]) * _CHUNK + int(head[-1])
    if not processes.chief:
        # The others' part must have the chief's shape; its zeros add nothing to the psum.
        payload = bytes(size)
    pieces = []
    for start in range(0, size, _CHUNK):
        piece = payload[start : start + _CHUNK]
        # Padded to whole int32 words; the padding is cut off again below.
        words = np.frombuffer(piece.ljust(-(-len(piece) // 4) * 4, b"\0"), np.int32)
        words = np.asarray(multihost_utils.broadcast_one_to_all(words))  # int32: no x64 needed
        pieces.append(words.tobytes()[: len(piece)])
    return [int(v) for v in head[:-2]], b"".join(pieces)


@contextlib.contextmanager
def alone(devices: Devices) -> Iterator[None]:
    """Keras's distribution set aside while one JAX process (the chief) works alone: the
    models it loads or saves then live on its own devices, and no variable it makes waits
    for the other processes. Nothing changes for a run of one process."""
    if devices.processes == 1:
        yield
        return
    # Restored in finally: an error while the chief saves must not leave the distribution unset.
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def chief_only(devices: Devices, writers: Sequence[Any]) -> list:
    """Callbacks that write the run folder (checkpoints, logs), as this process runs them:
    as they are on one process; on several JAX processes, the chief's alone
    (:func:`alone`), none on the others."""
    if devices.processes == 1:
        return list(writers)
    # The others write nothing: their temporary folder holds only what the callbacks read.
    if not devices.chief:
        return []
    return [_on_chief()(callback, devices) for callback in writers]


# Made in a function, once: Keras is imported lazily, so the class cannot exist at import.
@functools.cache
def _on_chief() -> type:
    """The class of a callback whose every hook runs another's under :func:`alone` (the
    chief's, not a collective); made once Keras is imported (chute imports it lazily)."""

    class OnChief(keras.callbacks.Callback):
        def __init__(self, callback: Any, devices: Devices):
            super().__init__()
            self.callback, self.devices = callback, devices

        def set_model(self, model):
            super().set_model(model)
            self.callback.set_model(model)

        def set_params(self, params):
            super().set_params(params)
            self.callback.set_params(params)

        # One method per hook: the base Callback defines them all, so __getattr__ would never run.
        def _alone(self, hook: str, *args: Any, **kwargs: Any) -> Any:
            with alone(self.devices):
                return getattr(self.callback, hook)(*args, **kwargs)

        def on_train_begin(self, logs=None):
            return self._alone("on_train_begin", logs)

        def on_train_end(self, logs=None):
            return self._alone("on_train_end", logs)

        def on_epoch_begin(self, epoch, logs=None):
            return self._alone("on_epoch_begin", epoch, logs)

        def on_epoch_end(self, epoch, logs=None):
            return self._alone("on_epoch_end", epoch, logs)

        def on_train_batch_begin(self, batch, logs=None):
            return self._alone("on_train_batch_begin", batch, logs)

        def on_train_batch_end(self, batch, logs=None):
            return self._alone("on_train_batch_end", batch, logs)

        def on_test_begin(self, logs=None):
            return self._alone("on_test_begin", logs)

        def on_test_end(self, logs=None):
            return self._alone("on_test_end", logs)

        def on_test_batch_begin(self, batch, logs=None):
            return self._alone("on_test_batch_begin", batch, logs)

        def on_test_batch_end(self, batch, logs=None):
            return self._alone("on_test_batch_end", batch, logs)

    return OnChief
