"""The state of an output folder: finished, resumable, someone else's.

A conversion writes into ``OUT``: shards, ``rejects.csv`` and, last,
``manifest.json``. While it runs, ``OUT/.chute-work`` holds the plan's stamp
(source, options, layout) and one note per finished shard; a re-run with the
same stamp keeps those shards and redoes the rest.
"""

from __future__ import annotations

import json
import logging

from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.ingest.options import ConvertOptions
from chute.ingest.plan import SHARD_NAME

log = logging.getLogger(__name__)

WORK_DIR = manifest_lib.WORK_DIR
REJECTS_NAME = "rejects.csv"
_PLAN = "plan.json"


def existing_state(
    source: str, output: str, options: ConvertOptions, overwrite: bool
) -> manifest_lib.Manifest | None:
    """Returns the manifest of an identical finished run, or None to (re)start.

    Raises when the output holds a different conversion or other files, unless
    ``overwrite`` (then chute's own files there are removed).
    """
    if not storage.check_output(output, "output"):
        return None
    wanted = {"source": source, "options": options.to_dict()}
    manifest_file = storage.join(output, manifest_lib.MANIFEST_NAME)
    plan_file = storage.join(output, WORK_DIR, _PLAN)
    if storage.exists(manifest_file):
        existing = manifest_lib.load(output)
        previous = {"source": existing.source.get("location"), "options": existing.options}
        if previous == wanted and not overwrite:
            return existing
    elif storage.exists(plan_file):
        stored = json.loads(storage.read_bytes(plan_file))
        previous = {"source": stored.get("source"), "options": stored.get("options")}
        if previous == wanted and not overwrite:
            return None  # resume
    else:
        if storage.listdir(output) and not overwrite:
            raise ChuteError(
                "`output` is a non-empty folder that chute did not write. "
                f"Received: output={output!r}; choose an empty or new folder"
            )
        previous = None
    if previous is None:  # an empty folder, or chute's files to be replaced
        remove_outputs(output)
        return None
    holds = "a conversion"
    if previous != wanted:
        changed = [
            f"{key}: {previous['options'].get(key)!r} -> {value!r}"
            for key, value in wanted["options"].items()
            if (previous.get("options") or {}).get(key) != value
        ]
        if previous.get("source") != source:
            changed.insert(0, f"source: {previous.get('source')!r} -> {source!r}")
        holds = f"a conversion with other options ({'; '.join(changed)})"
    storage.replace_or_refuse(
        output, "output", holds=holds, overwrite=overwrite, entries=_outputs(output)
    )
    return None


def _outputs(output: str) -> list[str]:
    """The names in ``output`` that a conversion writes."""
    return [
        name
        for name in storage.listdir(output)
        if SHARD_NAME.match(name)
        or name in (manifest_lib.MANIFEST_NAME, REJECTS_NAME, manifest_lib.WORK_DIR)
    ]


def remove_outputs(output: str) -> None:
    """Deletes what a conversion wrote into ``output`` (and nothing else)."""
    for name in _outputs(output):
        storage.remove_if_exists(storage.join(output, name))


def remove_work_dir(output: str) -> None:
    """Deletes the work folder of a conversion."""
    storage.remove_if_exists(storage.join(output, WORK_DIR))


def load_done(output: str, name: str) -> dict | None:
    """The note of a shard finished by an earlier run, if the shard is really there."""
    note = storage.join(output, WORK_DIR, name + ".json")
    shard = storage.join(output, name)
    if not (storage.exists(note) and storage.exists(shard)):
        return None
    info = json.loads(storage.read_bytes(note))
    return info if storage.size(shard) == info["bytes"] else None


def save_done(output: str, name: str, info: dict) -> None:
    """Records that shard ``name`` is complete (after it was renamed into place)."""
    storage.write_atomic(storage.join(output, WORK_DIR, name + ".json"), json.dumps(info).encode())


def start_work(output: str, stamp: dict) -> None:
    """Creates the work folder for a plan; forgets notes made under another plan."""
    work = storage.join(output, WORK_DIR)
    storage.makedirs(work)
    plan_file = storage.join(work, _PLAN)
    if storage.exists(plan_file) and json.loads(storage.read_bytes(plan_file)) != stamp:
        log.warning("the source changed since the interrupted run; starting over")
        storage.rmtree(work)
        storage.makedirs(work)
    storage.write_atomic(plan_file, json.dumps(stamp, sort_keys=True).encode())


def write_rejects(output: str, rejects: list[dict]) -> None:
    """``rejects.csv``: every skipped input with its reason."""
    lines = ["key,reason"] + [_csv_row(r["key"], r["reason"]) for r in rejects]
    storage.write_atomic(storage.join(output, REJECTS_NAME), ("\n".join(lines) + "\n").encode())


def _csv_row(*cells: str) -> str:
    return ",".join(
        '"' + c.replace('"', '""') + '"' if any(x in c for x in ',"\n') else c for c in cells
    )
