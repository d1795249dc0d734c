"""What a run trains on, as one value: :class:`Devices`.

Built once per run: from a ``tf.distribute`` strategy on TensorFlow
(:func:`chute.fit.strategy.tensorflow_devices`), or from Keras's distribution on
JAX and torch (:func:`chute.fit.backend.devices`). Everything ``chute train``
asks of its devices (how many replicas, whether each host reads its own input,
which process writes the run folder, the scope to build a model in) is a field
or a property here, so nothing probes a strategy object for attributes.

Example:
    >>> one = Devices(kind="cpu")
    >>> one.replicas, one.per_host, one.chief, one.steps_per_execution
    (1, False, True, 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from chute.lazy import keras

# Steps per compiled call, by kind: TPUs pay a host round trip per call, so run many.
# MirroredStrategy stays at 1: with Keras 3.15 / TF 2.21 any larger value fails
# ("You must feed a value for placeholder tensor ..." in multi_step_on_iterator).
STEPS_PER_EXECUTION = {"tpu": 64, "multi-gpu": 1, "gpu": 8, "multiworker": 1, "cpu": 1}


@dataclasses.dataclass(frozen=True)
class Devices:
    """The devices of a run and how its input is read.

    Attributes:
        kind: ``"tpu"``, ``"multiworker"``, ``"multi-gpu"``, ``"gpu"`` or ``"cpu"``
            (on JAX and torch: ``"tpu"``, ``"gpu"`` or ``"cpu"``).
        backend: the Keras backend, ``"tensorflow"``, ``"jax"`` or ``"torch"``.
        replicas: devices one training step runs on, every host's (each takes its
            share of the global batch).
        names: the devices of this host (TensorFlow's) or of the run (Keras's names).
        hosts: hosts under ``tf.distribute`` that each read their own input (the
            workers of ``MultiWorkerMirroredStrategy``, the hosts of a TPU pod slice).
        processes: JAX processes (one per host) that train together.
        process_index: this process's index among them (0: the chief).
        devices_here: the devices of this process, which its input pipeline feeds.
        gpus: this host's GPUs (for the precision policy).
        gpu_mixed_float16: every one of them computes float16 fast (capability 7.0+).
        strategy: the ``tf.distribute`` strategy (TensorFlow), for ``chute.load`` and
            chute's multi-worker loop; None on JAX and torch.
        distribution: Keras's ``DataParallel`` over the devices (JAX), or None.
    """

    kind: str
    backend: str = "tensorflow"
    replicas: int = 1
    names: tuple[str, ...] = ()
    hosts: int = 1
    processes: int = 1
    process_index: int = 0
    devices_here: int = 1
    gpus: int = 0
    gpu_mixed_float16: bool = False
    strategy: Any = dataclasses.field(default=None, compare=False)
    distribution: Any = dataclasses.field(default=None, compare=False)

    @property
    def chief(self) -> bool:
        """Whether this process writes the run directory: the chief of JAX's processes,
        and every process of another kind of run (a ``tf.distribute`` worker writes its own)."""
        return self.process_index == 0

    @property
    def per_host(self) -> bool:
        """Whether every host reads its own input: under several workers, a TPU pod slice
        or several JAX processes (one pipeline feeding them all would read everything on
        each host)."""
        return self.processes > 1 or self.kind == "multiworker" or self.hosts > 1

    @property
    def steps_per_execution(self) -> int:
        """Steps per compiled call unless asked: many on a TPU, 1 on torch (Keras on
        torch allows no other)."""
        return 1 if self.backend == "torch" else STEPS_PER_EXECUTION.get(self.kind, 1)

    def scope(self) -> Any:
        """Where a model is built: the strategy's scope (TensorFlow), the distribution
        made current (JAX: variables replicated on every device, each batch split over
        them), or the one device (torch: Keras places tensors on the device in scope)."""
        if self.strategy is not None:
            return self.strategy.scope()
        if self.distribution is not None:
            return self.distribution.scope()
        if self.backend == "torch":
            return keras.device(self.names[0])
        return contextlib.nullcontext()

    def run_scope(self) -> Any:
        """What stays entered for a whole run: Keras's devices on JAX and torch; a
        ``tf.distribute`` strategy is entered only where a model or variable is made."""
        return contextlib.nullcontext() if self.backend == "tensorflow" else self.scope()

    def describe(self) -> str:
        """For logs and the CLI: ``"jax cpu: 4 device(s)"``, and on several hosts
        ``"jax tpu: 32 device(s) over 4 processes, 8 here"``."""
        described = f"{self.backend} {self.kind}: {self.replicas} device(s)"
        if self.processes > 1:
            described += f" over {self.processes} processes, {self.devices_here} here"
        return described
