"""A manifest's splits and shards as typed records: parsed and checked once, written back
byte for byte, and read by attribute everywhere outside ``chute.format``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chute import ChuteError
from chute.format import manifest as manifest_lib
from chute.format.splits import IndexEntry, Shard, Split, parse_split

SHA = "ab" * 32
SHARD = {
    "file": "train-00000-of-00001.tfrecord",
    "num_records": 3,
    "bytes": 120,
    "sha256": SHA,
    "class_counts": {"classes": [0, 2], "counts": [1, 2]},
    "index": {"file": "train-00000-of-00001.index", "sha256": "cd" * 32},
}
SPLIT = {"num_examples": 3, "class_counts": [1, 0, 2], "shards": [SHARD]}
NAMES = ["a", "b", "c"]


def _body(**splits) -> dict:
    return {
        "format": "chute.manifest",
        "version": manifest_lib.VERSION,
        "class_names": NAMES,
        "image": {"height": 8, "width": 8, "channels": 1},
        "splits": splits or {"train": json.loads(json.dumps(SPLIT))},
        "options": {},
        "source": {},
    }


def test_a_split_is_parsed_into_records_and_written_back_as_it_was():
    split = parse_split(SPLIT, "m.json", "splits.train", NAMES)
    shard = split.shards[0]
    assert shard == Shard(
        "train-00000-of-00001.tfrecord",
        3,
        120,
        SHA,
        ((0, 1), (2, 2)),
        IndexEntry("train-00000-of-00001.index", "cd" * 32),
    )
    assert split.examples == 3 and split.class_counts == (1, 0, 2)
    assert shard.dense_counts(3) == [1, 0, 2]
    assert split.to_dict() == SPLIT
    assert list(split.to_dict()["shards"][0]) == list(SHARD)  # the keys in the writer's order


def test_a_version_2_shard_keeps_its_list_of_every_class_count():
    listed = {**SHARD, "class_counts": [1, 0, 2]}
    del listed["index"]  # written before record indexes
    shard = parse_split({**SPLIT, "shards": [listed]}, "m", "splits.train", NAMES).shards[0]
    assert shard.index is None and shard.dense_counts(3) == [1, 0, 2]
    assert shard.to_dict() == listed


def test_a_manifest_is_the_same_bytes_after_a_round_trip():
    text = manifest_lib.Manifest(
        class_names=NAMES,
        image=manifest_lib.ImageSpec(8, 8, 1),
        splits={"train": SPLIT},
        options={},
        source={},
    ).to_json()
    again = manifest_lib.Manifest.from_json(text)
    assert isinstance(again.splits["train"], Split)
    assert again.to_json() == text


def test_a_split_of_shards_sums_their_counts():
    one = Shard.from_dict(SHARD)
    two = Shard.from_dict(
        {**SHARD, "file": "b", "num_records": 4, "class_counts": {"classes": [1], "counts": [4]}}
    )
    split = Split.of([one, two], 3)
    assert split.examples == 7 and split.class_counts == (1, 4, 2) and split.shards == (one, two)


def test_the_stored_form_is_still_read_by_key():
    split = parse_split(SPLIT, "m", "splits.train", NAMES)
    assert split["class_counts"] == [1, 0, 2] and split["num_examples"] == 3
    assert split["shards"][0]["file"] == SHARD["file"]
    assert split["shards"][0]["index"]["sha256"] == "cd" * 32


def test_a_split_and_a_shard_are_read_only_mappings_of_their_stored_form():
    """Every read-only dict use of ``chute.load_manifest(...).splits`` keeps working."""
    split = parse_split(SPLIT, "m", "splits.train", NAMES)
    shard = split.shards[0]
    assert dict(split) == SPLIT and split == SPLIT
    assert SPLIT == split  # noqa: SIM300 (the dict's side: a mapping compares both ways)
    assert dict(shard) == SHARD and shard == SHARD and shard != {**SHARD, "bytes": 1}
    assert "shards" in split and "index" in shard and "label" not in shard
    assert len(split) == 3 and len(shard) == len(SHARD)
    assert list(split.keys()) == list(SPLIT) and list(shard) == list(SHARD)
    assert dict(split.items())["num_examples"] == 3 and split.get("label", 0) == 0
    assert shard == parse_split(SPLIT, "m", "splits.train", NAMES).shards[0]
    assert hash(split) == hash(parse_split(SPLIT, "m", "splits.train", NAMES))
    with pytest.raises(TypeError):
        split["num_examples"] = 4  # type: ignore[index]


def _damaged(path: Path, change) -> str:
    body = _body()
    change(body["splits"]["train"])
    path.write_text(json.dumps(body))
    return str(path)


@pytest.mark.parametrize(
    ("change", "field", "allowed"),
    [
        (lambda s: s["shards"][0].pop("sha256"), "splits.train.shards[0].sha256", "is missing"),
        (lambda s: s["shards"][0].update(bytes="120"), "splits.train.shards[0].bytes", "count"),
        (lambda s: s["shards"][0].update(num_records=-1), "shards[0].num_records", "count"),
        (lambda s: s["shards"][0].update(index={"file": "x"}), "shards[0].index", "index entry"),
        (lambda s: s["shards"][0]["index"].update(file="../x"), "index.file", "inside the"),
        (lambda s: s["shards"][0].update(class_counts=[1]), "shards[0].class_counts", "one count"),
        (lambda s: s["shards"][0]["class_counts"].update(classes=[0, 3]), "classes", "labels from"),
        (lambda s: s.update(class_counts="3"), "splits.train.class_counts", "a list of 3 counts"),
        (lambda s: s.pop("num_examples"), "splits.train.num_examples", "is missing"),
    ],
)
def test_a_damaged_entry_is_one_error_naming_the_file_and_field(tmp_path, change, field, allowed):
    path = _damaged(tmp_path / "manifest.json", change)
    with pytest.raises(ChuteError) as error:
        manifest_lib.load(path)
    message = str(error.value)
    assert message.startswith(f"{path} is not a valid chute manifest"), message
    assert re.search(re.escape(field) + r"` must be|" + re.escape(field) + " is missing", message)
    assert allowed in message


# Keys of the stored splits and shards: outside chute.format they are read as attributes.
_SUBSCRIPT = re.compile(
    r"""\[['"](shards|sha256|bytes|num_records|class_counts|num_examples|index|file)['"]\]"""
)
_GET = re.compile(
    r"""\.get\(['"](sha256|num_records|class_counts|num_examples)['"]"""
    r"""|\b(shard|split|entry|info|s)\.get\(['"](shards|bytes|index|file)['"]"""
)
_SPLITS = re.compile(r"\.splits\[")


def test_no_manifest_string_lookup_outside_format():
    src = Path(__file__).resolve().parents[2] / "src" / "chute"
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.parent.name == "format" and path.parent.parent == src:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ">>>" in line:  # examples of the shard writer's note, a dict of its own
                continue
            if _SUBSCRIPT.search(line) or _GET.search(line) or _SPLITS.search(line):
                found.append(f"{path.relative_to(src)}:{number}: {line.strip()}")
    assert not found, "read the typed records (chute.format.splits) instead:\n" + "\n".join(found)
