"""A training run held to a time budget (``chute train --time-limit 10m``).

The run trains as many epochs as fit in the budget: after each epoch it divides
the time left by the mean epoch time so far (training and validation) and stops
at the end of the last epoch that fits, with its best checkpoint as always. The
``onecycle`` and ``cosine`` schedules are fitted to that number of epochs: the
learning rate warms up over the first epoch (``onecycle``), then decays along a
cosine to 0 at the end of the last epoch the budget allows, re-fitted each epoch
as the estimate firms up. The rate changes each step (on JAX, whose ``fit`` keeps
the variables in its own state through an epoch, each epoch, at the rate of its
middle step). The time spent is kept in the run folder
(``budget.json``), so a resumed run spends only what is left.

Example:
    >>> parse_duration("10m"), parse_duration("1h30m"), parse_duration(90)
    (600.0, 5400.0, 90.0)
    >>> budget_epochs(limit=600, spent=130, epoch_seconds=[120], done=1, most=100)
    4
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.format import storage
from chute.lazy import keras

log = logging.getLogger(__name__)

MOST_EPOCHS = 1000
"""The epochs a time-limited run may take when ``epochs`` is not given."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")


def parse_duration(value: Any, argument: str = "time_limit") -> float:
    """Seconds from ``"90s"``, ``"10m"``, ``"1h30m"``, ``"2h"`` or a number of seconds.

    Raises:
        ChuteError: anything else, or not positive; the error names ``argument``.
    """
    allowed = "a positive duration such as 600, '90s', '10m', '1h30m' or '2h'"
    if isinstance(value, bool):
        raise checks.bad_value(argument, value, allowed)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if not parts or _PART.sub("", text).strip():
                raise checks.bad_value(argument, value, allowed) from None
            seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    else:
        raise checks.bad_value(argument, value, allowed)
    if not math.isfinite(seconds) or seconds <= 0:
        raise checks.bad_value(argument, value, allowed)
    return seconds


def budget_epochs(
    *, limit: float, spent: float, epoch_seconds: list[float], done: int, most: int
) -> int:
    """The epochs a run ends after: those ``done``, and as many more as the time left
    (``limit - spent``) holds at the mean of ``epoch_seconds``; from ``done`` (at least
    1) to ``most``."""
    mean = sum(epoch_seconds) / len(epoch_seconds)
    more = math.floor(max(0.0, limit - spent) / mean) if mean > 0 else most
    return max(1, min(most, done + more))


def rate_at(step: int, *, peak: float, warmup: int, total: int, schedule: str) -> float:
    """The learning rate at ``step`` of a run of ``total`` steps: ``onecycle``: linear
    from 0 to ``peak`` over ``warmup`` steps, then a cosine to 0 at ``total``;
    ``cosine``: the cosine from ``peak`` at step 0; anything else: ``peak``.

    Example:
        >>> [round(rate_at(s, peak=1.0, warmup=2, total=6, schedule="onecycle"), 3)
        ...  for s in range(7)]
        [0.0, 0.5, 1.0, 0.854, 0.5, 0.146, 0.0]
    """
    if schedule not in ("onecycle", "cosine"):
        return peak
    warm = warmup if schedule == "onecycle" else 0
    if step < warm:
        return peak * step / warm
    span = max(1, total - warm)
    done = min(1.0, (step - warm) / span)
    return peak * 0.5 * (1 + math.cos(math.pi * done))


def callback(
    *,
    limit: float,
    state_file: str,
    steps: int,
    most: int,
    peak: float,
    schedule: str,
    chief: bool,
) -> Any:
    """The Keras callback that holds a run to ``limit`` seconds (see the module).

    Args:
        limit: the budget in seconds.
        state_file: where the time spent is kept (``budget.json`` in the run folder).
        steps: optimizer steps per epoch.
        most: the most epochs the run may take.
        peak: the schedule's peak learning rate.
        schedule: the run's schedule name (``onecycle`` and ``cosine`` are fitted).
        chief: whether this process writes ``state_file``.
    """
    fitted = schedule in ("onecycle", "cosine")
    # On JAX, fit keeps the variables in its own state through an epoch: a rate set
    # between its steps would be lost, so the rate changes from epoch to epoch there.
    per_epoch = keras.backend.backend() == "jax"

    class TimeBudget(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            state = _read(state_file)
            if state and abs(state.get("limit", limit) - limit) > 1e-6:
                raise ChuteError(
                    f"This run was started with time_limit={state['limit']:g} seconds; "
                    f"resume it with the same, or start afresh with overwrite. Received: "
                    f"time_limit={limit:g}"
                )
            self.spent = float(state.get("spent", 0.0)) if state else 0.0
            self.seconds = list(state.get("epoch_seconds", [])) if state else []
            self.epochs = int(state["epochs"]) if state and state.get("epochs") else most
            self.step = 0
            self.epoch_start = 0
            self.began = 0.0
            self.stopped = False  # the budget ended the run

        def on_train_begin(self, logs=None):
            self.step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.monotonic()
            self.epoch_start = self.step
            if fitted and per_epoch:
                # JAX's fit reads the variables at each epoch's start only: the rate at the
                # epoch's middle step holds for all of it
                self._set_rate(self.step + steps // 2)

        def on_train_batch_begin(self, batch, logs=None):
            # Keras calls this once per execution (steps_per_execution steps), with the
            # index of the execution's first step in the epoch
            self.step = self.epoch_start + batch
            if fitted and not per_epoch:
                self._set_rate()

        def on_train_batch_end(self, batch, logs=None):
            self.step = self.epoch_start + batch + 1  # ``batch``: the execution's last step

        def on_epoch_end(self, epoch, logs=None):
            took = time.monotonic() - self.began
            self.spent += took
            self.seconds.append(took)
            self.epochs = budget_epochs(
                limit=limit, spent=self.spent, epoch_seconds=self.seconds, done=epoch + 1,
                most=most,
            )  # fmt: skip
            if chief:
                body = {
                    "limit": limit,
                    "spent": self.spent,
                    "epoch_seconds": self.seconds,
                    "epochs": self.epochs,
                }
                storage.write_atomic(state_file, json.dumps(body).encode())
            if epoch + 1 >= self.epochs:
                log.info(
                    "time limit: %.0f of %.0f s spent after epoch %d; stopping (the next "
                    "epoch would take about %.0f s)",
                    self.spent, limit, epoch + 1, self.seconds[-1],
                )  # fmt: skip
                self.model.stop_training = True
                self.stopped = True
            else:
                log.info(
                    "time limit: %.0f of %.0f s spent; %d epochs fit", self.spent, limit,
                    self.epochs,
                )  # fmt: skip

        def _set_rate(self, step: int | None = None):
            # Warm-up over the first epoch; the decay ends with the last epoch that fits.
            rate = rate_at(
                self.step if step is None else step,
                peak=peak,
                warmup=steps,
                total=self.epochs * steps,
                schedule=schedule,
            )
            self.model.optimizer.learning_rate = rate

    return TimeBudget()


def _read(path: str) -> dict | None:
    if not storage.exists(path):
        return None
    return json.loads(storage.read_bytes(path))
