"""Which Keras backend a run trains on, and its devices when that is not TensorFlow.

Keras 3 runs on TensorFlow, JAX or torch; which one is fixed when Keras is
imported (``KERAS_BACKEND``, else ``keras.json``'s ``"backend"``) and cannot
change in that process. :func:`resolve` returns the backend of a run, sets
``KERAS_BACKEND`` while Keras is not imported yet (what ``chute train
--backend`` relies on), and refuses a backend other than the one running.

On TensorFlow, a run trains under a ``tf.distribute`` strategy
(:mod:`chute.fit.strategy`). On JAX and torch, :func:`devices` returns the same
:class:`~chute.fit.devices.Devices` value, backed by
``keras.distribution.DataParallel`` over every device on JAX (this host's, or
every host's when JAX runs one process per host, see :mod:`chute.fit.processes`),
or one device on torch. Either way the input is chute's tf.data pipeline, so
TensorFlow is first kept off the accelerators (:func:`keep_tensorflow_off_accelerators`):
a TensorFlow that saw a TPU or the GPUs would take them from JAX or torch.

Example:
    >>> resolve("jax")  # doctest: +SKIP
    'jax'
    >>> devices("jax", "auto").describe()  # doctest: +SKIP
    'jax cpu: 4 device(s)'
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.fit import strategy as strategy_lib
from chute.fit.devices import Devices
from chute.lazy import extra, installed, keras, tensorflow_builds, tf

log = logging.getLogger(__name__)

BACKENDS = ("tensorflow", "jax", "torch")


def _install(backend: str) -> str:
    """What to install when a backend's package is missing."""
    if backend == "tensorflow":
        return tensorflow_builds()
    if backend == "jax":
        return extra("jax", instead="'jax[cpu]'; 'jax[cuda12]' or 'jax[tpu]' on accelerators")
    return "pip install torch"


def configured() -> str:
    """The backend Keras runs on, or will when imported: ``KERAS_BACKEND``, else
    ``keras.json``'s (in ``KERAS_HOME`` or ``~/.keras``), else ``"tensorflow"``;
    without importing Keras.

    Example:
        >>> os.environ["KERAS_BACKEND"] = "jax"; configured()  # doctest: +SKIP
        'jax'
    """
    # Imported already: its backend is fixed for this process, whatever the variables say now.
    if "keras" in sys.modules:
        return keras.backend.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as handle:
            return str(json.load(handle).get("backend", "tensorflow"))
    # No readable keras.json: Keras itself falls back to TensorFlow.
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def resolve(requested: str | None = None) -> str:
    """The backend a run trains on: ``requested``, or Keras's configured one.

    While Keras is not imported yet, ``requested`` is honoured by setting
    ``KERAS_BACKEND`` (what the CLI's ``--backend`` does); once it is, only the
    backend it runs can be used.

    Raises:
        ChuteError: ``requested`` is not a backend; its package is not installed;
            or Keras already runs another backend in this process.
    """
    if requested is not None:
        checks.one_of("backend", requested, BACKENDS)
        _check_installed(requested, f"backend={requested!r}")
        # Keras reads KERAS_BACKEND once, at import: setting it later would change nothing.
        if "keras" not in sys.modules:
            os.environ["KERAS_BACKEND"] = requested
    name = configured()
    if requested is not None and name != requested:
        raise ChuteError(
            f"`backend` is {requested!r} but Keras already runs on {name!r} in this process "
            "(a Keras backend is chosen once, when Keras is imported). Received: "
            f"backend={requested!r}; start a new process with KERAS_BACKEND={requested} "
            f"(or `chute train --backend {requested}`), or pass backend={name!r} or None"
        )
    if name not in BACKENDS:
        raise checks.bad_value("KERAS_BACKEND", name, f"one of {list(BACKENDS)} for chute train")
    # The configured backend may come from keras.json, not from `requested`: checked again.
    _check_installed(name, f"backend={requested!r}; Keras's configured backend: {name!r}")
    log.info("Keras backend: %s", keras.backend.backend())  # imports Keras, on that backend
    return name


def _check_installed(name: str, received: str) -> None:
    if importlib.util.find_spec(name) is None:
        raise ChuteError(
            f"The Keras backend {name!r} is not installed: {_install(name)}. Received: {received}"
        )


def keep_tensorflow_off_accelerators() -> None:
    """Hides GPUs and TPUs from TensorFlow, which then only reads and prepares input:
    JAX or torch trains on them. Must come before TensorFlow runs anything; a
    TensorFlow that already holds one is reported (set ``CUDA_VISIBLE_DEVICES``
    for it, or install ``tensorflow-cpu``)."""
    # Hidden before TensorFlow runs anything: afterwards its devices can no longer be hidden.
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except RuntimeError:  # TensorFlow's devices are initialised: too late to hide them
            held = tf.config.list_logical_devices(kind)
            if held:
                log.warning(
                    "TensorFlow already holds %d %s(s), which the %s backend needs: start "
                    "the run in a fresh process, or install tensorflow-cpu for the reader",
                    len(held),
                    kind,
                    keras.backend.backend(),
                )
        except ValueError:  # this TensorFlow has no such device type
            continue
    log.info("input pipeline: TensorFlow on the CPU only (GPUs and TPUs hidden from it)")


def auto_strategy(kind: str = "auto", *, tpu: str | None = None) -> Any:
    """What a Keras model trains under on this machine, for the backend Keras runs.

    TensorFlow: the best ``tf.distribute`` strategy (:mod:`chute.fit.strategy`): a
    TPU, all GPUs, several workers, or the CPU. JAX: a
    ``keras.distribution.DataParallel`` over every device (TPU chips, else GPUs, else
    the CPU devices; every process's with several), already set as Keras's
    distribution (``keras.distribution.set_distribution``), since Keras's ``fit``
    distributes the batches only under the distribution set; TensorFlow, which reads the
    input, is first kept off the accelerators, so it never brings up a TPU JAX needs.
    Either way ``with strategy.scope():`` builds the model on the devices, and
    ``chute.load(..., strategy=strategy)`` reads batches for them. What was found is
    logged.

    Args:
        kind: ``"auto"``, or insist on ``"tpu"``, ``"gpu"``, ``"cpu"`` or
            ``"multiworker"`` (TensorFlow only).
        tpu: a TPU name or ``grpc://`` address (TensorFlow only; default: from the
            environment).

    Returns:
        A ``tf.distribute.TPUStrategy``, ``MultiWorkerMirroredStrategy``,
        ``MirroredStrategy`` (several GPUs) or ``OneDeviceStrategy`` (one GPU, the
        CPU); on JAX a ``keras.distribution.DataParallel``.

    Raises:
        ChuteError: on torch (one device, no strategy: build the model without one), or
            a kind that is not there.

    Example:
        >>> strategy = auto_strategy()  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = make_model()
    """
    checks.one_of("strategy", kind, strategy_lib.KINDS)
    name = configured()
    if name == "tensorflow":
        return strategy_lib.tensorflow_devices(kind, tpu=tpu).strategy
    if name != "jax":
        raise ChuteError(
            f"chute.auto_strategy() gives a tf.distribute strategy (TensorFlow) or a "
            f"keras.distribution (JAX); Keras runs on {name!r}, which trains on one device "
            f"without either. Received: KERAS_BACKEND={name!r}; build and fit the model "
            "without a strategy, or set KERAS_BACKEND=jax (or tensorflow) before Keras is "
            "imported to use every device"
        )
    # Before TensorFlow runs anything: on a TPU VM it would otherwise take the chips.
    if installed("tensorflow"):
        keep_tensorflow_off_accelerators()
    distribution = devices("jax", kind, tpu=tpu).distribution
    keras.distribution.set_distribution(distribution)
    return distribution


def devices(backend: str, kind: str = "auto", *, tpu: str | None = None) -> Devices:
    """The devices a JAX or torch run trains on (``kind`` as the ``strategy`` option).

    JAX: every device of the kind (``auto``: TPU chips, else GPUs, else the CPU
    devices), in one ``DataParallel``: this host's, or with several JAX processes
    (:mod:`chute.fit.processes`) every process's. torch: one device.

    Raises:
        ChuteError: a kind that is not there, a TensorFlow-only option
            (``multiworker``, ``tpu``), or several GPUs for torch.
    """
    checks.one_of("strategy", kind, strategy_lib.KINDS)
    if kind == "multiworker":
        raise ChuteError(
            f"`strategy` 'multiworker' is TensorFlow's MultiWorkerMirroredStrategy; the {backend} "
            "backend trains on this host's devices only. Received: strategy='multiworker'; use "
            "--backend tensorflow for several workers"
        )
    if tpu is not None:
        raise ChuteError(
            f"`tpu` names a TPU for TensorFlow to connect to; the {backend} backend finds "
            f"this host's TPU chips by itself. Received: tpu={tpu!r}; leave it out, or use "
            "--backend tensorflow"
        )
    found = _jax_devices(kind) if backend == "jax" else _torch_device(kind)
    log.info("devices: %s (%s)", found.describe(), ", ".join(found.names))
    return found


def _jax_devices(kind: str) -> Devices:
    import jax

    # None: Keras lists the best platform there is (TPU, then GPU, then CPU).
    wanted = None if kind == "auto" else kind
    try:
        names = keras.distribution.list_devices(wanted)
    except RuntimeError as error:  # JAX has no such platform here
        raise ChuteError(
            f"`strategy` is {kind!r} but JAX finds no {kind.upper()} here ({error}). "
            f"Received: strategy={kind!r}"
        ) from None
    # Keras names devices "platform:index"; one platform is used for the whole run.
    platform = names[0].split(":")[0]
    local = jax.local_devices(backend=platform)
    fast_fp16 = platform == "gpu" and all(
        float(getattr(d, "compute_capability", "0") or 0) >= 7.0 for d in local
    )
    processes = jax.process_count()
    # Every device of every process; on several, each process feeds its own part of the
    # global batch (chute.load's per-process input), which Keras must not shard again.
    distribution = keras.distribution.DataParallel(devices=names, auto_shard_dataset=processes == 1)
    return Devices(
        platform,
        backend="jax",
        replicas=len(names),
        names=tuple(names),
        processes=processes,
        process_index=jax.process_index(),
        devices_here=len(local),
        gpus=len(names) if platform == "gpu" else 0,
        gpu_mixed_float16=fast_fp16,
        distribution=distribution,
    )


def _torch_device(kind: str) -> Devices:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "tpu":
        raise ChuteError(
            "`strategy` is 'tpu' but the torch backend trains on a GPU or the CPU. "
            "Received: strategy='tpu'; use --backend jax or --backend tensorflow on a TPU"
        )
    if kind == "gpu" and gpus == 0:
        raise ChuteError("`strategy` is 'gpu' but torch sees no GPU on this machine")
    if kind != "cpu" and gpus > 1:
        raise ChuteError(
            f"The torch backend trains on one device; torch sees {gpus} GPUs. To train on all "
            "of them use --backend jax or --backend tensorflow; for one, set "
            "CUDA_VISIBLE_DEVICES=0. Received: backend='torch'"
        )
    if kind != "cpu" and gpus == 1:
        # Compute capability 7.0 or newer: where float16 is faster, as for TensorFlow and JAX.
        fast_fp16 = torch.cuda.get_device_capability(0) >= (7, 0)
        return Devices(
            "gpu", backend="torch", names=("cuda:0",), gpus=1, gpu_mixed_float16=fast_fp16
        )
    return Devices("cpu", backend="torch", names=("cpu",))
