"""Multi-label sources and sample weights, at the scan: CSV/JSONL lists with several labels
per image, Parquet list columns (the Hub's ``Sequence(ClassLabel)``), WebDataset lists, the
label options and their refusals; tiny files written here."""

from __future__ import annotations

import io
import json
import logging
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import write_image

from chute.cli import _given, _parser
from chute.errors import ChuteError
from chute.ingest import sources
from chute.ingest.options import ConvertOptions
from chute.ingest.sources.base import LabelRules

MULTI = LabelRules(mode="multi")


def _images(folder: Path, names: list[str]) -> None:
    for seed, name in enumerate(names):
        write_image(folder / name, seed=seed, size=(8, 8))


def _csv(tmp_path: Path, text: str, name: str = "list.csv") -> str:
    """``text`` as a list beside images a.png..e.png."""
    _images(tmp_path, [f"{c}.png" for c in "abcde"])
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def _labels(found) -> dict[str, tuple[str, ...]]:
    """Each item's key -> its label names."""
    return {item.key: tuple(found.class_names[i] for i in item.labels) for item in found.items}


# -- options ------------------------------------------------------------------------------


def test_label_options_default_to_todays_reading_and_build_the_rules():
    assert ConvertOptions().label_rules() == LabelRules()
    options = ConvertOptions(
        label_mode="multi",
        label_separator=";",
        allow_empty_labels=True,
        max_labels=3,
        weight_column="w",
    )
    assert options.label_rules() == LabelRules("multi", ";", True, 3, "w")
    assert ConvertOptions.from_dict(options.to_dict()) == options


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"label_mode": "many"}, r"`label_mode` must be one of \{'auto', 'single', 'multi'\}. "
                                 r"Received: label_mode='many'"),
        ({"label_separator": ","}, r"`label_separator` must be .*without a comma \(it would end "
                                   r"a CSV cell\).*Received: label_separator=','"),
        ({"label_separator": ""}, r"`label_separator` must be a non-empty.*Received: "),
        ({"label_separator": '"'}, "`label_separator` must be"),
        ({"label_separator": "a\nb"}, "`label_separator` must be"),
        ({"label_separator": 1}, "Received: label_separator=1"),
        ({"allow_empty_labels": "yes"}, "`allow_empty_labels` must be True or False"),
        ({"max_labels": 0}, r"`max_labels` must be None or a positive integer. Received: "
                            "max_labels=0"),
        ({"weight_column": " "}, r"`weight_column` must be None or a column name"),
    ],
)  # fmt: skip
def test_bad_label_options_are_refused_naming_the_value(values, match):
    with pytest.raises(ChuteError, match=match):
        ConvertOptions(**values)


def test_the_label_options_are_convert_flags():
    args = _parser().parse_args(
        ["convert", "src", "out", "--label-mode", "multi", "--label-separator", ";",
         "--allow-empty-labels", "--max-labels", "4", "--weight-column", "w"]
    )  # fmt: skip
    given = _given(args, ConvertOptions)
    assert ConvertOptions(**given).label_rules() == LabelRules("multi", ";", True, 4, "w")


# -- CSV lists ----------------------------------------------------------------------------


def test_a_csv_cell_with_the_separator_makes_the_list_multi_label(tmp_path, caplog):
    source = _csv(
        tmp_path,
        "path,labels\na.png,cat|dog\nb.png,dog\nc.png, night | cat |cat\nd.png,10|2\n",
    )
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(source)
    assert "multi-label: 3 rows of list.csv hold '|'" in caplog.text
    assert found.multi_label and not found.weighted
    assert found.class_names == ["10", "2", "cat", "dog", "night"]  # not all integers: text sort
    assert _labels(found) == {
        "a.png": ("cat", "dog"),
        "b.png": ("dog",),
        "c.png": ("cat", "night"),  # stripped, the repeated cat once
        "d.png": ("10", "2"),
    }
    assert all(item.label == -1 and item.weight is None for item in found.items)
    assert all(list(item.labels) == sorted(item.labels) for item in found.items)


def test_integer_labels_sort_numerically_and_a_label_header_works_too(tmp_path):
    found = sources.scan(_csv(tmp_path, "file,class\na.png,10|2\nb.png,1\n"))
    assert found.class_names == ["1", "2", "10"]
    assert [item.labels for item in found.items] == [(1, 2), (0,)]


def test_a_single_label_list_reads_as_today_and_says_so(tmp_path, caplog):
    source = _csv(tmp_path, "a.png,cat\nb.png,dog\nc.png,cat\n")
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(source)
    assert "single-label: no label of list.csv holds '|'" in caplog.text
    assert not found.multi_label and not found.weighted
    assert [(i.key, i.label, i.labels, i.weight) for i in found.items] == [
        ("a.png", 0, None, None),
        ("b.png", 1, None, None),
        ("c.png", 0, None, None),
    ]


def test_single_mode_keeps_a_cell_with_separators_as_one_class(tmp_path):
    source = _csv(tmp_path, "a.png,cat|dog\nb.png,dog\n")
    found = sources.scan(source, labels=LabelRules(mode="single"))
    assert found.class_names == ["cat|dog", "dog"] and not found.multi_label
    assert [item.label for item in found.items] == [0, 1]


def test_multi_mode_without_separators_gives_one_label_each(tmp_path, caplog):
    source = _csv(tmp_path, "a.png,cat\nb.png,dog\n")
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(source, labels=MULTI)
    assert "multi-label: label_mode='multi'" in caplog.text
    assert found.multi_label and _labels(found) == {"a.png": ("cat",), "b.png": ("dog",)}


def test_another_separator(tmp_path):
    source = _csv(tmp_path, "a.png,cat;dog\nb.png,a|b\n")
    found = sources.scan(source, labels=LabelRules(separator=";"))
    assert _labels(found) == {"a.png": ("cat", "dog"), "b.png": ("a|b",)}


def test_an_empty_label_field_is_a_reject_or_a_negative_when_allowed(tmp_path):
    source = _csv(tmp_path, "path,labels,split\na.png,cat|dog,train\nb.png,,train\nc.png,dog,val\n")
    found = sources.scan(source)
    assert [i.key for i in found.items] == ["a.png", "c.png"]
    assert found.rejects == [
        {"key": "b.png", "reason": "no labels (line 3); pass allow_empty_labels=True "
                                   "(--allow-empty-labels) to keep it as a negative"},
    ]  # fmt: skip
    allowed = sources.scan(source, labels=LabelRules(allow_empty=True))
    assert not allowed.rejects and allowed.presplit
    assert {(i.key, i.split, i.labels) for i in allowed.items} == {
        ("a.png", "train", (0, 1)),
        ("b.png", "train", ()),
        ("c.png", "val", (1,)),
    }


def test_negatives_only_is_an_error(tmp_path):
    source = _csv(tmp_path, "a.png,\nb.png,\n")
    with pytest.raises(ChuteError, match=r"no image of .*list.csv has a label"):
        sources.scan(source, labels=LabelRules(mode="multi", allow_empty=True))


@pytest.mark.parametrize("cell", ["cat||dog", "cat|", "|cat", "cat| |dog"])
def test_a_separator_that_leaves_an_empty_name_is_an_error_naming_the_line(tmp_path, cell):
    source = _csv(tmp_path, f"a.png,cat|dog\nb.png,{cell}\n")
    with pytest.raises(ChuteError) as raised:
        sources.scan(source)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{source}, line 2: the labels {cell.strip()!r} split at the "
                              "separator '|' leave an empty name")  # fmt: skip
    assert "--label-separator" in message


def test_more_labels_than_max_labels_is_a_reject_naming_the_count(tmp_path):
    source = _csv(tmp_path, "a.png,cat|dog|owl\nb.png,dog|cat|dog\nc.png,owl\n")
    found = sources.scan(source, labels=LabelRules(max_labels=2))
    assert found.rejects == [
        {"key": "a.png", "reason": "3 labels (line 1), more than max_labels=2"}
    ]
    assert found.class_names == ["cat", "dog", "owl"]
    assert _labels(found) == {"b.png": ("cat", "dog"), "c.png": ("owl",)}


def test_a_file_listed_twice_keeps_todays_reject(tmp_path):
    found = sources.scan(_csv(tmp_path, "a.png,cat|dog\nb.png,dog\na.png,owl\n"))
    assert found.rejects == [
        {"key": "a.png (line 3)",
         "reason": "listed again with label 'owl', not 'cat|dog': line 1 lists the same file"}
    ]  # fmt: skip
    assert found.class_names == ["cat", "dog"]


# -- JSONL lists --------------------------------------------------------------------------


def test_jsonl_lists_of_labels(tmp_path, caplog):
    lines = [
        {"path": "a.png", "labels": ["cat", "dog", "cat"]},
        {"path": "b.png", "label": ["owl"]},
        {"path": "c.png", "label": "dog"},
        {"path": "d.png", "labels": []},
        {"path": "e.png", "labels": "owl|cat"},  # a string: split as a CSV cell is
    ]
    source = _csv(tmp_path, "".join(json.dumps(line) + "\n" for line in lines), "list.jsonl")
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(source)
    assert "multi-label: 3 lines of list.jsonl hold a JSON list of labels" in caplog.text
    assert found.kind == "jsonl" and found.multi_label
    assert _labels(found) == {
        "a.png": ("cat", "dog"),
        "b.png": ("owl",),
        "c.png": ("dog",),
        "e.png": ("cat", "owl"),
    }
    assert [r["key"] for r in found.rejects] == ["d.png"]
    assert found.rejects[0]["reason"].startswith("no labels (line 4)")


def test_jsonl_integer_labels_sort_numerically(tmp_path):
    lines = ['{"path": "a.png", "labels": [10, 2]}', '{"path": "b.png", "labels": [1]}']
    found = sources.scan(_csv(tmp_path, "\n".join(lines), "list.jsonl"))
    assert found.class_names == ["1", "2", "10"]
    assert _labels(found) == {"a.png": ("2", "10"), "b.png": ("1",)}


@pytest.mark.parametrize(
    ("line", "rules", "match"),
    [
        ('{"path": "a.png", "labels": ["cat", true]}', LabelRules(),
         r"line 2: each line must be a JSON object with 'path' and 'label' \(or 'labels'\).*"
         "a label is an integer or a string, not True"),
        ('{"path": "a.png", "labels": ["cat", {"x": 1}]}', LabelRules(), "not {'x': 1}"),
        ('{"path": "a.png", "labels": ["cat", " "]}', LabelRules(),
         r"line 2: a label in the list is empty. Received: \['cat', ''\]"),
        ('{"path": "a.png", "labels": ["cat", "dog"]}', LabelRules(mode="single"),
         r"line 2: the label is a list, and `label_mode` is 'single'. Received: \['cat', 'dog'\]; "
         "pass label_mode='multi'"),
    ],
)  # fmt: skip
def test_bad_jsonl_label_lists_are_errors_naming_the_line(tmp_path, line, rules, match):
    source = _csv(tmp_path, '{"path": "b.png", "label": "cat"}\n' + line, "list.jsonl")
    with pytest.raises(ChuteError, match=match):
        sources.scan(source, labels=rules)


# -- weights ------------------------------------------------------------------------------


WEIGHTED = LabelRules(weight_column="weight")


def test_a_weight_column_gives_single_label_items_their_weights(tmp_path):
    listed = _csv(tmp_path, "path,label,weight\na.png,cat,0.5\nb.png,dog, 2\n")
    # only when named: a column that happens to be called "weight" weighs nothing
    assert not sources.scan(listed).weighted
    found = sources.scan(listed, labels=WEIGHTED)
    assert found.weighted and not found.multi_label
    assert [(i.key, i.label, i.weight) for i in found.items] == [
        ("a.png", 0, 0.5),
        ("b.png", 1, 2.0),
    ]


def test_weights_of_a_multi_label_list_and_a_named_weight_column(tmp_path):
    source = _csv(tmp_path, "image,labels,W\na.png,cat|dog,0\nb.png,dog,3.25\n")
    found = sources.scan(source, labels=LabelRules(weight_column="w"))  # header case ignored
    assert found.weighted and found.multi_label
    assert [(i.key, i.labels, i.weight) for i in found.items] == [
        ("a.png", (0, 1), 0.0),
        ("b.png", (1,), 3.25),
    ]


def test_jsonl_weights(tmp_path):
    lines = ['{"path": "a.png", "label": "cat", "weight": 1.5}',
             '{"path": "b.png", "label": "dog", "weight": "2"}']  # fmt: skip
    found = sources.scan(_csv(tmp_path, "\n".join(lines), "list.jsonl"), labels=WEIGHTED)
    assert found.weighted and [i.weight for i in found.items] == [1.5, 2.0]


@pytest.mark.parametrize("weight", ["-1", "nan", "inf", "heavy", ""])
def test_a_bad_weight_is_an_error_naming_the_line(tmp_path, weight):
    source = _csv(tmp_path, f"path,label,weight\na.png,cat,1\nb.png,dog,{weight}\n")
    match = r"list.csv, line 3: the sample weight \('weight'\) must be a finite number >= 0. "
    with pytest.raises(ChuteError, match=match + f"Received: '{weight}'"):
        sources.scan(source, labels=WEIGHTED)


def test_a_weight_beyond_float32_is_an_error_of_its_own(tmp_path):
    """1e39 is finite in float64, not in float32 (how records store weights): it was
    refused as 'cannot convert image: OverflowError' while writing; now at the scan."""
    source = _csv(tmp_path, "path,label,weight\na.png,cat,3.4e38\nb.png,dog,1e39\n")
    match = (
        r"list.csv, line 3: the sample weight \('weight'\) must be at most 3.402823e\+38, "
        r"as records store weights in float32. Received: '1e39'"
    )
    with pytest.raises(ChuteError, match=match):
        sources.scan(source, labels=WEIGHTED)
    parquet = _parquet(tmp_path / "x.parquet", {"label": pa.array(["a", "b"]),
                                                "weight": pa.array([0.5, 1e39])})  # fmt: skip
    with pytest.raises(ChuteError, match=r"x.parquet, row 1: .* must be at most 3.402823e\+38"):
        sources.scan(parquet, labels=WEIGHTED)


def test_a_jsonl_line_without_the_weight_others_have_is_an_error(tmp_path):
    lines = ['{"path": "a.png", "label": "cat", "weight": 1}', '{"path": "b.png", "label": "d"}']
    with pytest.raises(ChuteError, match=r"line 2: the sample weight .* Received: None"):
        sources.scan(_csv(tmp_path, "\n".join(lines), "list.jsonl"), labels=WEIGHTED)


def test_a_named_weight_column_that_is_not_there_is_an_error_naming_the_columns(tmp_path):
    source = _csv(tmp_path, "path,label,weight\na.png,cat,1\n")
    with pytest.raises(ChuteError, match=r"`weight_column`: .*list.csv has columns \['path', "
                                          r"'label', 'weight'\]; 'w' is not one of them. "
                                          "Received: weight_column='w'"):  # fmt: skip
        sources.scan(source, labels=LabelRules(weight_column="w"))
    headless = _csv(tmp_path, "a.png,cat,1\n", "headless.csv")
    with pytest.raises(ChuteError, match=r"`weight_column`: .*headless.csv has no header row"):
        sources.scan(headless, labels=LabelRules(weight_column="weight"))
    jsonl = _csv(tmp_path, '{"path": "a.png", "label": "cat"}\n', "list.jsonl")
    with pytest.raises(ChuteError, match=r"no line of .*list.jsonl has the key 'w' \(keys: "):
        sources.scan(jsonl, labels=LabelRules(weight_column="w"))


# -- Parquet and the Hub's Sequence(ClassLabel) -------------------------------------------


def _png(seed: int) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8), dtype=np.uint8)
    from PIL import Image

    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _parquet(path: Path, columns: dict, features: dict | None = None) -> str:
    """A Parquet file of ``columns`` (an ``image`` column of the Hub's ``{bytes, path}``
    structs added), with ``features`` as the Hub writes them in the ``huggingface``
    schema metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = len(next(iter(columns.values())))
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": _png(i), "path": f"{i}.png"} for i in range(rows)], struct)
    table = pa.table({"image": images, **columns})
    if features is not None:
        info = {"info": {"features": {"image": {"_type": "Image"}, **features}}}
        table = table.replace_schema_metadata({b"huggingface": json.dumps(info).encode()})
    pq.write_table(table, path)
    return str(path)


NAMES = ["cat", "dog", "owl"]
SEQUENCE = {"feature": {"names": NAMES, "_type": "ClassLabel"}, "_type": "Sequence"}
LIST = {"_type": "List", "feature": {"names": NAMES, "_type": "ClassLabel"}}


@pytest.mark.parametrize("feature", [SEQUENCE, LIST, [{"names": NAMES, "_type": "ClassLabel"}]])
def test_a_hub_sequence_of_class_labels_is_multi_label(tmp_path, feature, caplog):
    labels = pa.array([[0, 2], [1], [], [2, 2, 0], [5]], pa.list_(pa.int64()))
    # "tags", not "label": found from the metadata's Sequence(ClassLabel)
    source = _parquet(tmp_path / "data" / "train-0.parquet", {"tags": labels}, {"tags": feature})
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(source)
    assert "column 'tags' holds lists: multi-label" in caplog.text
    assert found.kind == "parquet" and found.multi_label and found.class_names == NAMES
    keys = [f"train-0.parquet#{row:08d}" for row in range(5)]
    assert [(i.key, i.label, i.labels) for i in found.items] == [
        (keys[0], -1, (0, 2)),
        (keys[1], -1, (1,)),
        (keys[3], -1, (0, 2)),
    ]
    assert found.rejects == [
        {"key": keys[2], "reason": "no labels (an empty list); pass allow_empty_labels=True "
                                   "to keep it as a negative"},
        {"key": keys[4], "reason": "label 5 is not a class index from 0 to 2, nor a class name "
                                   "of the file's metadata"},
    ]  # fmt: skip
    allowed = sources.scan(source, labels=LabelRules(allow_empty=True, max_labels=1))
    assert [(i.key, i.labels) for i in allowed.items] == [(keys[1], (1,)), (keys[2], ())]
    assert {r["reason"] for r in allowed.rejects} >= {"2 labels, more than max_labels=1"}


def test_a_parquet_list_of_strings_without_metadata(tmp_path):
    labels = pa.array([["owl", "cat"], ["dog"], ["cat", None]], pa.list_(pa.string()))
    found = sources.scan(_parquet(tmp_path / "x.parquet", {"labels": labels}))
    assert found.multi_label and found.class_names == ["cat", "dog", "owl"]
    assert _labels(found) == {"x.parquet#00000000": ("cat", "owl"), "x.parquet#00000001": ("dog",)}
    assert found.rejects == [
        {"key": "x.parquet#00000002", "reason": "a null label in ['cat', None]"}
    ]


def test_parquet_string_names_under_the_metadata_and_an_unknown_one(tmp_path):
    labels = pa.array([["owl", "cat"], ["emu"]], pa.list_(pa.string()))
    found = sources.scan(_parquet(tmp_path / "x.parquet", {"label": labels}, {"label": SEQUENCE}))
    assert [i.labels for i in found.items] == [(0, 2)]
    assert "label 'emu' is not a class index" in found.rejects[0]["reason"]


def test_parquet_lists_with_label_mode_single_are_refused(tmp_path):
    labels = pa.array([[0], [1]], pa.list_(pa.int64()))
    source = _parquet(tmp_path / "x.parquet", {"label": labels})
    with pytest.raises(ChuteError, match=r"`label_mode`: column 'label' of .*x.parquet holds "
                                          r"lists.*Received: label_mode='single'"):  # fmt: skip
        sources.scan(source, labels=LabelRules(mode="single"))


def test_parquet_single_values_stay_single_label_unless_multi_is_asked(tmp_path):
    source = _parquet(tmp_path / "x.parquet", {"label": pa.array([0, 1, 0])}, {"label": {
        "names": NAMES, "_type": "ClassLabel"}})  # fmt: skip
    found = sources.scan(source)
    assert not found.multi_label and not found.weighted
    assert [(i.label, i.labels) for i in found.items] == [(0, None), (1, None), (0, None)]
    multi = sources.scan(source, labels=MULTI)
    assert multi.multi_label and [i.labels for i in multi.items] == [(0,), (1,), (0,)]


def test_parquet_weights(tmp_path):
    columns = {"label": pa.array(["a", "b"]), "weight": pa.array([0.5, 2.0])}
    found = sources.scan(_parquet(tmp_path / "x.parquet", columns), labels=WEIGHTED)
    assert found.weighted and [i.weight for i in found.items] == [0.5, 2.0]
    columns = {"labels": pa.array([["a"], ["b"]]), "w": pa.array([1, 3])}
    named = sources.scan(
        _parquet(tmp_path / "y.parquet", columns), labels=LabelRules(weight_column="w")
    )
    assert named.multi_label and [i.weight for i in named.items] == [1.0, 3.0]


def test_bad_parquet_weights_are_errors(tmp_path):
    source = _parquet(tmp_path / "x.parquet", {"label": pa.array(["a", "b"]),
                                               "weight": pa.array([0.5, -1.0])})  # fmt: skip
    with pytest.raises(ChuteError, match=r"x.parquet, row 1: the sample weight \(column "
                                          r"'weight'\) must be a finite number >= 0. "
                                          "Received: -1.0"):  # fmt: skip
        sources.scan(source, labels=WEIGHTED)
    match = r"`weight_column`: .*x.parquet has columns \['image', 'label', 'weight'\]; 'w' is not"
    with pytest.raises(ChuteError, match=match):
        sources.scan(source, labels=LabelRules(weight_column="w"))
    with pytest.raises(ChuteError, match=r"`weight_column`: column 'label' of .*holds string, not "
                                          "numbers"):  # fmt: skip
        sources.scan(source, labels=LabelRules(weight_column="label"))


# -- WebDataset ---------------------------------------------------------------------------


def _shard(path: Path, samples: dict[str, dict[str, bytes]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as out:
        for seed, (key, files) in enumerate(samples.items()):
            for extension, data in {"png": _png(seed), **files}.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
    return str(path)


def test_webdataset_json_lists_are_multi_label(tmp_path, caplog):
    source = _shard(
        tmp_path / "shard-0.tar",
        {
            "s0": {"json": b'["cat", "dog", "cat"]'},
            "s1": {"json": b'{"labels": ["dog"]}'},
            "s2": {"json": b"[]"},
            "s3": {"cls": b"owl"},
            "s4": {"json": b'["cat", null]'},
        },
    )
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(source)
    assert "multi-label: 3 samples of" in caplog.text  # [] is a list too
    assert found.kind == "webdataset" and found.multi_label
    assert found.class_names == ["cat", "dog", "owl"]
    assert _labels(found) == {
        "shard-0.tar/s0.png": ("cat", "dog"),
        "shard-0.tar/s1.png": ("dog",),
        "shard-0.tar/s3.png": ("owl",),
    }
    assert {r["key"]: r["reason"] for r in found.rejects} == {
        "shard-0.tar/s2.png": "no labels in label member s2.json; pass allow_empty_labels=True "
        "(--allow-empty-labels) to keep it as a negative",
        "shard-0.tar/s4.png": "label member s4.json: a label is an integer or a string, not None",
    }
    allowed = sources.scan(source, labels=LabelRules(allow_empty=True, max_labels=1))
    assert _labels(allowed)["shard-0.tar/s2.png"] == ()
    assert "2 labels in s0.json, more than max_labels=1" in {r["reason"] for r in allowed.rejects}


def test_webdataset_txt_with_the_separator(tmp_path, caplog):
    source = _shard(tmp_path / "a.tar", {"s0": {"txt": b"cat|007"}, "s1": {"txt": b"7"}})
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(source)
    assert "multi-label: 1 .txt labels of" in caplog.text
    assert _labels(found) == {"a.tar/s0.png": ("7", "cat"), "a.tar/s1.png": ("7",)}
    single = sources.scan(source, labels=LabelRules(mode="single"))
    assert not single.multi_label and single.class_names == ["7", "cat|007"]


def test_webdataset_empty_names_and_lists_in_single_mode(tmp_path):
    source = _shard(tmp_path / "a.tar", {"s0": {"txt": b"cat||dog"}, "s1": {"txt": b"dog"}})
    with pytest.raises(ChuteError, match=r"a.tar/s0.txt: the labels 'cat\|\|dog' split at the "
                                          "separator '\\|' leave an empty name"):  # fmt: skip
        sources.scan(source)
    lists = _shard(tmp_path / "b.tar", {"s0": {"json": b'["cat"]'}, "s1": {"cls": b"dog"}})
    found = sources.scan(lists, labels=LabelRules(mode="single"))
    assert found.rejects == [
        {"key": "b.tar/s0.png",
         "reason": "label member s0.json holds a list of labels; label_mode='multi' reads it"}
    ]  # fmt: skip
    assert not found.multi_label and found.class_names == ["dog"]


# -- single-label kinds -------------------------------------------------------------------


def _tree(root: Path) -> Path:
    _images(root / "cat", ["0.png"])
    _images(root / "dog", ["1.png"])
    return root


def _npz(path: Path) -> Path:
    np.savez(path, x=np.zeros((2, 4, 4), np.uint8), y=np.array([0, 1]))
    return path


def _zip(root: Path, path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as out:
        for file in sorted(root.rglob("*.png")):
            out.write(file, file.relative_to(root).as_posix())
    return path


def _tar(root: Path, path: Path) -> Path:
    with tarfile.open(path, "w") as out:
        out.add(root, arcname=".")
    return path


@pytest.mark.parametrize(
    ("make", "kind", "why"),
    [
        (lambda t: _tree(t / "tree"), "folder", "one class per folder"),
        (lambda t: _zip(_tree(t / "tree"), t / "tree.zip"), "zip", "one class per folder"),
        (lambda t: _tar(_tree(t / "tree"), t / "tree.tar"), "tar", "one class per folder"),
        (lambda t: _npz(t / "a.npz"), "npz", "one integer label per image"),
        (lambda t: "keras:mnist", "keras", "one integer label per image"),  # refused unloaded
    ],
)
def test_class_per_folder_sources_refuse_multi_and_read_as_before_in_auto(tmp_path, make, kind,
                                                                          why):  # fmt: skip
    source = str(make(tmp_path))
    with pytest.raises(ChuteError) as raised:
        sources.scan(source, labels=MULTI)
    message = str(raised.value)
    assert message.startswith(f"`label_mode`: a {kind} source is single-label ({why}). "
                              f"Received: label_mode='multi', source={source!r}; list the "
                              "images and their labels in a CSV")  # fmt: skip
    assert "Parquet" in message and "\n" not in message
    if kind != "keras":
        found = sources.scan(source)
        assert not found.multi_label and found.class_names[:2] in (["cat", "dog"], ["0", "1"])
        found.close()


def test_a_weight_column_asked_of_a_folder_is_refused(tmp_path):
    with pytest.raises(ChuteError, match=r"`weight_column` applies to CSV, JSONL and Parquet "
                                          r"sources; `source` is a folder source. Received: "
                                          "weight_column='w'"):  # fmt: skip
        sources.scan(str(_tree(tmp_path / "tree")), labels=LabelRules(weight_column="w"))


def test_negatives_or_a_label_limit_ask_for_multi_label_by_themselves(tmp_path, caplog):
    listed = _csv(tmp_path, "path,labels\na.png,cat\nb.png,\nc.png,dog\n")
    with caplog.at_level(logging.INFO, logger="chute.ingest.sources"):
        found = sources.scan(listed, labels=LabelRules(allow_empty=True))
    assert "multi-label: allow_empty_labels=True asks for it" in caplog.text
    assert found.multi_label and [i.labels for i in found.items] == [(0,), (), (1,)]
    with pytest.raises(ChuteError, match=r"line 3: the label is empty"):
        sources.scan(listed, labels=LabelRules(mode="single"))
    with pytest.raises(ChuteError, match=r"a folder source is single-label .*allow_empty_labels"):
        sources.scan(_tree(tmp_path / "tree"), labels=LabelRules(allow_empty=True))
