"""Which accelerator is here, and the ``tf.distribute`` strategy and precision for it.

Detection order for ``kind="auto"``:

1. A TPU, connected, initialised and used through ``TPUStrategy``. Its
   ``TPUClusterResolver`` is the first of: the TPU named by ``--tpu``, by
   ``TPU_NAME`` (a TPU node, or a multi-host pod slice) or by Colab's
   ``COLAB_TPU_ADDR`` (a TPU node); a TPU attached to this host (a TPU VM, and
   Colab's and Kaggle's TPU runtimes, see :func:`local_tpu`) as ``tpu="local"``,
   since without a name the resolver only asks for one; else whatever
   ``TPUClusterResolver()`` finds by itself.
2. ``TF_CONFIG`` naming several workers: ``MultiWorkerMirroredStrategy``.
3. Several GPUs: ``MirroredStrategy``; one GPU: ``OneDeviceStrategy``.
4. The CPU.

Which TPU case was taken, or why none was found, is logged. Detection
(:func:`detect`) is separate from building the strategy (:func:`make_strategy`),
so its logic is tested with the environment, devices and resolver faked.

Example:
    >>> devices = tensorflow_devices()  # doctest: +SKIP
    >>> devices.kind, devices.replicas  # doctest: +SKIP
    ('tpu', 8)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.fit.devices import Devices
from chute.lazy import tf

log = logging.getLogger(__name__)

KINDS = ("auto", "tpu", "gpu", "cpu", "multiworker")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What :func:`detect` found: the strategy to build, and with what.

    ``kind`` is ``"tpu"``, ``"multiworker"``, ``"multi-gpu"``, ``"gpu"`` or ``"cpu"``.
    """

    kind: str
    tpu: Any = None  # the TPUClusterResolver, for kind == "tpu"
    gpus: int = 0
    workers: int = 1


def _workers(environ: Mapping[str, str]) -> int:
    raw = environ.get("TF_CONFIG")
    if not raw:
        return 1
    try:
        cluster = json.loads(raw).get("cluster", {})
    except (ValueError, AttributeError):
        raise ChuteError(f"TF_CONFIG is not valid JSON. Received: TF_CONFIG={raw[:80]!r}") from None
    # The chief trains too: it is one of the workers the strategy spans.
    return sum(len(cluster.get(role, [])) for role in ("chief", "worker"))


def count_workers(environ: Mapping[str, str] | None = None) -> int:
    """Workers (the chief included) that ``TF_CONFIG`` names; 1 without a cluster."""
    return _workers(os.environ if environ is None else environ)


def worker_index(environ: Mapping[str, str] | None = None) -> int:
    """This process's place among the workers of ``TF_CONFIG`` (0: the chief, or no cluster).

    Example:
        >>> worker_index({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, '
        ...               '"task": {"type": "worker", "index": 1}}'})
        1
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG")
    if not raw:
        return 0
    try:
        config = json.loads(raw)
        task, cluster = config.get("task", {}), config.get("cluster", {})
        index = int(task.get("index", 0))
    except (ValueError, AttributeError, TypeError):
        raise ChuteError(f"TF_CONFIG is not valid JSON. Received: TF_CONFIG={raw[:80]!r}") from None
    # With a chief, it is worker 0 and the workers' own indices shift by one.
    if task.get("type") == "worker" and "chief" in cluster:
        return index + 1
    return index if task.get("type") in ("worker", None) else 0


def _has_libtpu() -> bool:
    return importlib.util.find_spec("libtpu") is not None  # found, not imported


def local_tpu(
    environ: Mapping[str, str] | None = None,
    *,
    dev: str | os.PathLike = "/dev",
    has_libtpu: Callable[[], bool] = _has_libtpu,
) -> tuple[bool, str]:
    """Whether a TPU is attached to this host, and why (or why not).

    TPU VMs, and the Colab and Kaggle TPU runtimes built on them, attach the TPU
    to the host: it has no name, ``TPUClusterResolver()`` asks for one, and
    ``TPUClusterResolver(tpu="local")`` connects to it. Such a host sets the TPU
    worker variables (``TPU_ACCELERATOR_TYPE``, ``TPU_WORKER_ID``), or has the TPU
    runtime (the ``libtpu`` package) and TPU chips among its devices.

    Args:
        environ: the environment to read (default: ``os.environ``).
        dev: the device folder holding the chips (``accel0``, …; ``vfio/0``, … from v5e on).
        has_libtpu: whether the ``libtpu`` package is installed.

    Returns:
        ``(attached, why)``, ``why`` saying what was seen, for the log.

    Example:
        >>> local_tpu({"TPU_ACCELERATOR_TYPE": "v5litepod-8"})
        (True, 'TPU_ACCELERATOR_TYPE=v5litepod-8')
        >>> local_tpu({}, has_libtpu=lambda: False)
        (False, 'no libtpu, TPU_ACCELERATOR_TYPE or TPU_WORKER_ID')
    """
    environ = os.environ if environ is None else environ
    # The variables first: reading them costs nothing, unlike looking for libtpu and the chips.
    for name in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID"):
        if environ.get(name):
            return True, f"{name}={environ[name]}"
    if not has_libtpu():
        return False, "no libtpu, TPU_ACCELERATOR_TYPE or TPU_WORKER_ID"
    # vfio/vfio is VFIO's control file on any VFIO host; the chips are its numbered groups.
    chips = sorted([*Path(dev).glob("accel*"), *Path(dev).glob("vfio/[0-9]*")])
    if not chips:
        return False, f"libtpu installed, but no TPU chip in {dev} (accel*, vfio/N)"
    return True, f"libtpu, {chips[0]}"


def _find_tpu(
    address: str | None,
    environ: Mapping[str, str],
    resolve_tpu: Callable[[str | None], Any],
    find_local_tpu: Callable[[Mapping[str, str]], tuple[bool, str]],
) -> tuple[Any, str]:
    """The TPU's resolver (None: no TPU) and how it was found, or why not."""
    colab = environ.get("COLAB_TPU_ADDR")
    # An explicit --tpu wins over anything the environment says.
    if address:
        how = f"--tpu {address}"
    elif environ.get("TPU_NAME"):  # a TPU node or a multi-host slice: by its name
        address = environ["TPU_NAME"]
        how = f"TPU_NAME={address}"
    elif colab:
        address, how = colab, f"COLAB_TPU_ADDR={colab}"
    else:
        attached, why = find_local_tpu(environ)
        if attached:
            address, how = "local", f"attached to this host ({why})"
        else:  # last resort: whatever the resolver finds without a name
            how = f"no --tpu, TPU_NAME or COLAB_TPU_ADDR; {why}"
    if colab and address == colab and "://" not in colab:
        address = f"grpc://{colab}"  # Colab gives host:port; the resolver wants an address
    try:
        resolver = resolve_tpu(address)
    except (ValueError, KeyError, RuntimeError, OSError) as error:
        why = f"{how}; TPUClusterResolver(tpu={address!r}): {error}"
        # A TPU was pointed at but failed: a warning, as training falls back to GPUs or the CPU.
        # None pointed at, none found: the usual case on a GPU or CPU machine, said with -v.
        log.log(logging.WARNING if address else logging.DEBUG, "TPU: none found (%s)", why)
        return None, why
    log.info("TPU: %s", how if address else "found by TPUClusterResolver() without a name")
    return resolver, how


def _default_resolver(address: str | None) -> Any:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
    # Without a name, an empty cluster means no TPU: raise so that detection falls back.
    if not resolver.cluster_spec().as_dict() and not address:
        raise ValueError("no TPU cluster")
    return resolver


def count_hosts(kind: str, tpu: Any = None, environ: Mapping[str, str] | None = None) -> int:
    """Hosts a strategy of ``kind`` spans, each with its own input pipeline: the
    workers of ``MultiWorkerMirroredStrategy`` (``TF_CONFIG``'s), the hosts of a TPU
    pod slice (the ``worker`` tasks its resolver ``tpu`` names), else 1.

    Example:
        >>> count_hosts("cpu")
        1
    """
    if kind == "multiworker":
        return count_workers(environ)
    if kind == "tpu" and tpu is not None:
        spec = tpu.cluster_spec()
        # a TPU attached to this host (tpu="local") names no cluster: one host
        return max(1, spec.num_tasks("worker")) if "worker" in spec.jobs else 1
    return 1


def count_gpus() -> int:
    """GPUs TensorFlow sees on this machine."""
    return _default_gpus()


def _default_gpus() -> int:
    return len(tf.config.list_physical_devices("GPU"))


def detect(
    kind: str = "auto",
    *,
    tpu: str | None = None,
    environ: Mapping[str, str] | None = None,
    list_gpus: Callable[[], int] = _default_gpus,
    resolve_tpu: Callable[[str | None], Any] = _default_resolver,
    find_local_tpu: Callable[[Mapping[str, str]], tuple[bool, str]] = local_tpu,
) -> Plan:
    """Decides which strategy to build, without building it.

    Args:
        kind: ``"auto"``, or insist on ``"tpu"``, ``"gpu"``, ``"cpu"`` or ``"multiworker"``.
        tpu: a TPU name or ``grpc://`` address (default: from the environment).
        environ: the environment to read (``TPU_NAME``, ``COLAB_TPU_ADDR``, ``TF_CONFIG``,
            and what :func:`local_tpu` reads).
        list_gpus: returns how many GPUs there are.
        resolve_tpu: returns a ``TPUClusterResolver`` for an address (or ``"local"``), or raises.
        find_local_tpu: says whether a TPU is attached to this host, and why (:func:`local_tpu`).

    Raises:
        ChuteError: a kind was insisted on and is not here.
    """
    checks.one_of("strategy", kind, KINDS)
    environ = os.environ if environ is None else environ
    if kind in ("auto", "tpu"):
        resolver, why = _find_tpu(tpu, environ, resolve_tpu, find_local_tpu)
        if resolver is not None:
            return Plan("tpu", tpu=resolver)
        if kind == "tpu":
            raise ChuteError(
                f"`strategy` is 'tpu' but no TPU was found ({why}). Received: tpu="
                f"{tpu or environ.get('TPU_NAME')!r}; pass --tpu NAME or set TPU_NAME"
            )
    workers = _workers(environ)
    if kind == "multiworker" or (kind == "auto" and workers > 1):
        if not environ.get("TF_CONFIG") or workers < 1:
            raise ChuteError(
                "`strategy` is 'multiworker' but TF_CONFIG names no workers. "
                "Set TF_CONFIG on every worker (see tf.distribute.MultiWorkerMirroredStrategy)"
            )
        return Plan("multiworker", workers=workers)
    if kind == "cpu":
        return Plan("cpu")
    gpus = list_gpus()
    if gpus > 1:
        return Plan("multi-gpu", gpus=gpus)
    if gpus == 1:
        return Plan("gpu", gpus=1)
    if kind == "gpu":
        raise ChuteError("`strategy` is 'gpu' but TensorFlow sees no GPU on this machine")
    return Plan("cpu")


def make_strategy(plan: Plan) -> Any:
    """Builds (for a TPU: connects and initialises) the strategy of a :class:`Plan`."""
    if plan.kind == "tpu":
        tf.config.experimental_connect_to_cluster(plan.tpu)  # a no-op for tpu="local"
        # Before the strategy: TPUStrategy needs an initialised TPU system.
        tf.tpu.experimental.initialize_tpu_system(plan.tpu)
        return tf.distribute.TPUStrategy(plan.tpu)
    if plan.kind == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if plan.kind == "multi-gpu":
        return tf.distribute.MirroredStrategy()
    if plan.kind == "gpu":
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def tensorflow_devices(kind: str = "auto", *, tpu: str | None = None) -> Devices:
    """The :class:`~chute.fit.devices.Devices` of the best strategy for this machine:
    :func:`detect`, then :func:`make_strategy`, then :func:`devices_of`."""
    plan = detect(kind, tpu=tpu)
    found = devices_of(make_strategy(plan), plan)
    log.info("strategy: %s, %d replica(s) on %s", plan.kind, found.replicas, ", ".join(found.names))
    return found


def devices_of(strategy: Any, plan: Plan) -> Devices:
    """What a built strategy of ``plan`` trains on, and this host's GPUs (which decide
    its precision)."""
    gpus = count_gpus() if plan.kind in ("gpu", "multi-gpu", "multiworker") else 0
    names = tuple(str(device) for device in strategy.extended.worker_devices)
    return Devices(
        plan.kind,
        replicas=strategy.num_replicas_in_sync,
        names=names,
        hosts=count_hosts(plan.kind, plan.tpu),
        devices_here=len(names),
        gpus=gpus,
        gpu_mixed_float16=gpus > 0 and gpu_supports_mixed_float16(),
        strategy=strategy,
    )


def precision_policy(
    kind: str, requested: str = "auto", *, gpu_mixed_float16: bool = True, gpus: int = 0
) -> str:
    """The Keras mixed-precision policy for a strategy kind.

    ``auto``: ``mixed_bfloat16`` on TPU, ``mixed_float16`` on GPUs that support
    it (compute capability 7.0 or newer), also when several workers train on
    GPUs (``gpus``: this worker's), ``float32`` elsewhere (the CPU, unless asked).

    Example:
        >>> precision_policy("tpu"), precision_policy("cpu")
        ('mixed_bfloat16', 'float32')
        >>> precision_policy("multiworker", gpus=2)
        'mixed_float16'
    """
    checks.one_of("precision", requested, PRECISIONS)
    # Asked for: honoured even where it is slow (float16 on a CPU).
    if requested != "auto":
        return requested
    if kind == "tpu":
        return "mixed_bfloat16"
    on_gpus = kind in ("gpu", "multi-gpu") or (kind == "multiworker" and gpus > 0)
    if on_gpus and gpu_mixed_float16:
        return "mixed_float16"
    return "float32"


def gpu_supports_mixed_float16() -> bool:
    """True when every visible GPU has compute capability 7.0 or newer."""
    gpus = tf.config.list_physical_devices("GPU")
    capabilities = [
        tf.config.experimental.get_device_details(g).get("compute_capability") for g in gpus
    ]
    # Tensor cores came with compute capability 7.0; older GPUs are slower in float16.
    return bool(capabilities) and all(c is not None and c >= (7, 0) for c in capabilities)
