"""The state of an output folder: finished, resumable, someone else's.

A conversion writes into ``OUT``: shards, ``rejects.csv`` and, last,
``manifest.json``. While it runs, ``OUT/.chute-work`` holds the plan's stamp
(source, options, layout) and one note per finished shard; a re-run with the
same stamp keeps those shards and redoes the rest.
"""

from __future__ import annotations

import json
import logging

from chute import manifest as manifest_lib
from chute import shards, storage
from chute.errors import ChuteError
from chute.options import ConvertOptions

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
    fs = storage.gfile()
    if not fs.exists(output):
        return None
    if not fs.isdir(output):
        raise ChuteError(f"`output` exists and is not a directory. Received: output={output!r}")
    wanted = {"source": source, "options": options.to_dict()}
    manifest_file = storage.join(output, manifest_lib.MANIFEST_NAME)
    plan_file = storage.join(output, WORK_DIR, _PLAN)
    previous = None
    if fs.exists(manifest_file):
        existing = manifest_lib.load(output)
        previous = {"source": existing.source.get("location"), "options": existing.options}
        if previous == wanted and not overwrite:
            return existing
    elif fs.exists(plan_file):
        with fs.GFile(plan_file, "rb") as handle:
            stored = json.loads(handle.read())
        previous = {"source": stored.get("source"), "options": stored.get("options")}
        if previous == wanted and not overwrite:
            return None  # resume
    elif fs.listdir(output) and not overwrite:
        raise ChuteError(
            "`output` is a non-empty folder that chute did not write. "
            f"Received: output={output!r}; choose an empty or new folder"
        )
    if previous is not None and previous != wanted and not overwrite:
        changed = [
            f"{key}: {previous['options'].get(key)!r} -> {value!r}"
            for key, value in wanted["options"].items()
            if (previous.get("options") or {}).get(key) != value
        ]
        if previous.get("source") != source:
            changed.insert(0, f"source: {previous.get('source')!r} -> {source!r}")
        raise ChuteError(
            f"`output` {output!r} holds a conversion with other options ({'; '.join(changed)}). "
            "Pass overwrite=True (--overwrite) to replace it, or choose another folder"
        )
    if overwrite:
        remove_outputs(output)
    return None


def remove_outputs(output: str) -> None:
    fs = storage.gfile()
    for name in fs.listdir(output):
        name = name.rstrip("/")
        if shards.SHARD_NAME.match(name) or name in (manifest_lib.MANIFEST_NAME, REJECTS_NAME):
            fs.remove(storage.join(output, name))
    remove_work_dir(output)


def remove_work_dir(output: str) -> None:
    fs = storage.gfile()
    work = storage.join(output, WORK_DIR)
    if fs.exists(work):
        fs.rmtree(work)


def load_done(output: str, name: str) -> dict | None:
    """The note of a shard finished by an earlier run, if the shard is really there."""
    fs = storage.gfile()
    note = storage.join(output, WORK_DIR, name + ".json")
    shard = storage.join(output, name)
    if not (fs.exists(note) and fs.exists(shard)):
        return None
    with fs.GFile(note, "rb") as handle:
        info = json.loads(handle.read())
    return info if fs.stat(shard).length == info["bytes"] else None


def save_done(output: str, name: str, info: dict) -> None:
    """Records that shard ``name`` is complete (after it was renamed into place)."""
    storage.write_atomic(storage.join(output, WORK_DIR, name + ".json"), json.dumps(info).encode())


def start_work(output: str, stamp: dict) -> None:
    """Creates the work folder for a plan; forgets notes made under another plan."""
    fs = storage.gfile()
    work = storage.join(output, WORK_DIR)
    fs.makedirs(work)
    plan_file = storage.join(work, _PLAN)
    if fs.exists(plan_file):
        with fs.GFile(plan_file, "rb") as handle:
            if json.loads(handle.read()) != stamp:
                log.warning("the source changed since the interrupted run; starting over")
                fs.rmtree(work)
                fs.makedirs(work)
    storage.write_atomic(plan_file, json.dumps(stamp, sort_keys=True).encode())


def write_rejects(output: str, rejects: list[dict]) -> None:
    """``rejects.csv``: every skipped input with its reason."""
    lines = ["key,reason"] + [_csv_row(r["key"], r["reason"]) for r in rejects]
    storage.write_atomic(storage.join(output, REJECTS_NAME), ("\n".join(lines) + "\n").encode())


def _csv_row(*cells: str) -> str:
    return ",".join(
        '"' + c.replace('"', '""') + '"' if any(x in c for x in ',"\n') else c for c in cells
    )
