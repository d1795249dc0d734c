"""Sources: class folders, pre-split trees, CSV/JSONL lists, .npz arrays and keras.datasets.

Every dataset here is a few tiny images made in a temp dir; keras.datasets
loaders are replaced by local stand-ins, or (one test) sent through a proxy on a
closed port of 127.0.0.1, so nothing touches the network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records, decode, make_folder, run_here, write_image

import chute
from chute.errors import ChuteError
from chute.ingest import sources


def keys_and_labels(found: sources.Source) -> dict[str, str]:
    """key -> class name of every item."""
    return {item.key: found.class_names[item.label] for item in found.items}


def split_of(found: sources.Source) -> dict[str, str | None]:
    return {item.key: item.split for item in found.items}


def received(path: Path | str) -> str:
    """How a message names the ``source`` argument it received."""
    return f"source={str(path)!r}"


# -- class-per-folder trees ---------------------------------------------------------------


def test_folder_class_names_sorted_and_labels_follow_folders(tmp_path):
    src = make_folder(tmp_path / "src", {"zeta": 2, "Alpha": 1, "beta": 3})
    found = sources.scan(str(src))
    assert found.kind == "folder"
    assert not found.presplit
    assert found.class_names == ["Alpha", "beta", "zeta"]
    assert keys_and_labels(found) == {
        "Alpha/000.png": "Alpha",
        "beta/000.png": "beta",
        "beta/001.png": "beta",
        "beta/002.png": "beta",
        "zeta/000.png": "zeta",
        "zeta/001.png": "zeta",
    }
    assert all(item.split is None for item in found.items)
    for item in found.items:
        assert Path(item.path) == src / item.key
    # Deterministic: a second scan gives the same items in the same order.
    assert sources.scan(str(src)).items == found.items


def test_folder_accepts_pathlike(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 1, "b": 1})
    assert sources.scan(src).class_names == ["a", "b"]


def test_folder_skips_hidden_files_and_folders(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 2, "b": 1})
    write_image(src / ".hidden_class" / "000.png")
    write_image(src / "a" / ".secret.png")
    write_image(src / "a" / ".cache" / "thumb.png")
    write_image(src / "b" / "sub" / ".trash" / "old.png")
    (src / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (src / "a" / "._000.png").write_bytes(b"\0\5\26\7")  # macOS resource fork

    found = sources.scan(str(src))
    assert found.class_names == ["a", "b"]
    assert sorted(keys_and_labels(found)) == ["a/000.png", "a/001.png", "b/000.png"]


def test_images_nested_deeper_belong_to_their_top_level_class(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 1, "b": 1})
    write_image(src / "a" / "sub" / "deeper" / "x.png")
    write_image(src / "b" / "more" / "y.png")

    found = sources.scan(str(src))
    assert found.class_names == ["a", "b"]  # "sub", "deeper", "more" are not classes
    assert keys_and_labels(found) == {
        "a/000.png": "a",
        "a/sub/deeper/x.png": "a",
        "b/000.png": "b",
        "b/more/y.png": "b",
    }
    item = next(i for i in found.items if i.key == "a/sub/deeper/x.png")
    assert Path(item.path) == src / "a" / "sub" / "deeper" / "x.png"


def test_symlinked_folders_are_followed(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 1, "b": 1})
    elsewhere = make_folder(tmp_path / "elsewhere", {"c": 2, "extra": 1})
    (src / "c").symlink_to(elsewhere / "c", target_is_directory=True)  # a class folder
    (src / "a" / "linked").symlink_to(elsewhere / "extra", target_is_directory=True)

    found = sources.scan(str(src))
    assert found.class_names == ["a", "b", "c"]
    assert keys_and_labels(found) == {
        "a/000.png": "a",
        "a/linked/000.png": "a",
        "b/000.png": "b",
        "c/000.png": "c",
        "c/001.png": "c",
    }
    for item in found.items:
        assert Path(item.path).is_file()


@pytest.mark.timeout(60)
def test_symlink_loop_inside_a_class_neither_hangs_nor_duplicates(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 2, "b": 1})
    (src / "a" / "self").symlink_to(src / "a", target_is_directory=True)
    (src / "a" / "sub").mkdir()
    write_image(src / "a" / "sub" / "x.png")
    (src / "a" / "sub" / "back").symlink_to("..", target_is_directory=True)

    found = sources.scan(str(src))
    assert keys_and_labels(found) == {
        "a/000.png": "a",
        "a/001.png": "a",
        "a/sub/x.png": "a",
        "b/000.png": "b",
    }


@pytest.mark.timeout(60)
def test_symlink_loop_back_to_the_source_root_neither_hangs_nor_duplicates(tmp_path):
    """``a/up -> ..`` leads back to the source itself: a loop, so nothing is read twice."""
    src = make_folder(tmp_path / "src", {"a": 2, "b": 2})
    (src / "a" / "up").symlink_to("..", target_is_directory=True)

    found = sources.scan(str(src))
    real_files = [os.path.realpath(item.path) for item in found.items]
    assert len(real_files) == len(set(real_files)), sorted(i.key for i in found.items)
    assert len(found.items) == 4
    # b's images are never labelled as class a.
    for item in found.items:
        assert item.key.split("/")[0] == found.class_names[item.label]


EXTENSION_FILES = {
    "x1.jpg": "JPEG",
    "x2.JPG": "JPEG",
    "x3.Jpeg": "JPEG",
    "x4.PNG": "PNG",
    "x5.bmp": "BMP",
    "x6.GIF": "GIF",
    "x7.webp": "WEBP",
    "x8.TIF": "TIFF",
    "x9.tiff": "TIFF",
}


def test_image_extensions_in_any_letter_case_are_accepted_and_others_ignored(tmp_path):
    src = tmp_path / "src"
    for i, (name, fmt) in enumerate(EXTENSION_FILES.items()):
        write_image(src / "a" / name, fmt=fmt, seed=i)
    write_image(src / "b" / "only.png", seed=99)
    (src / "a" / "notes.txt").write_text("not an image")
    (src / "a" / "labels.csv").write_text("x,y\n")
    (src / "a" / "README").write_text("no extension")
    (src / "a" / "x10.png.txt").write_text("txt after png")

    found = sources.scan(str(src))
    assert sorted(keys_and_labels(found)) == sorted(
        [f"a/{name}" for name in EXTENSION_FILES] + ["b/only.png"]
    )

    # Each of these formats really decodes in a conversion: nothing is rejected.
    result = chute.convert(src, tmp_path / "out", workers=1)
    assert result.num_rejected == 0
    assert result.num_written == {"train": len(EXTENSION_FILES) + 1}


def test_kannada_class_names_are_kept_exactly(tmp_path):
    names = ["ಖ", "ಕ", "ಕಾ"]
    src = make_folder(tmp_path / "src", dict.fromkeys(names, 2))
    found = sources.scan(str(src))
    assert found.class_names == sorted(names) == ["ಕ", "ಕಾ", "ಖ"]
    assert set(found.class_names) == set(os.listdir(src))
    for item in found.items:
        assert item.key.split("/")[0] == found.class_names[item.label]

    out = tmp_path / "out"
    chute.convert(src, out, workers=1)
    manifest = chute.load_manifest(str(out))
    assert manifest.class_names == ["ಕ", "ಕಾ", "ಖ"]
    records = all_records(out)
    assert len(records) == 6
    for record in records:
        assert record["key"].split("/")[0] == manifest.class_names[record["class"]]


# -- pre-split trees ----------------------------------------------------------------------


def test_presplit_tree_is_recognised_with_train_val_and_test(tmp_path):
    src = tmp_path / "src"
    make_folder(src / "train", {"a": 3, "b": 2}, seed=1)
    make_folder(src / "val", {"a": 1, "b": 1}, seed=2)
    make_folder(src / "test", {"a": 1, "b": 2}, seed=3)

    found = sources.scan(str(src))
    assert found.kind == "split-folder"
    assert found.presplit
    assert found.class_names == ["a", "b"]  # not "train", "val", "test"
    assert split_of(found) == {
        "test/a/000.png": "test",
        "test/b/000.png": "test",
        "test/b/001.png": "test",
        "train/a/000.png": "train",
        "train/a/001.png": "train",
        "train/a/002.png": "train",
        "train/b/000.png": "train",
        "train/b/001.png": "train",
        "val/a/000.png": "val",
        "val/b/000.png": "val",
    }
    for item in found.items:
        assert item.key.split("/")[1] == found.class_names[item.label]
        assert Path(item.path) == src / item.key


def test_presplit_tree_accepts_validation_alias_and_no_test(tmp_path):
    src = tmp_path / "src"
    make_folder(src / "train", {"a": 2, "b": 2}, seed=1)
    make_folder(src / "validation", {"a": 1, "b": 1}, seed=2)

    found = sources.scan(str(src))
    assert found.presplit
    assert found.class_names == ["a", "b"]
    splits = split_of(found)
    assert sorted(set(splits.values())) == ["train", "val"]
    assert splits["validation/a/000.png"] == "val"
    assert splits["validation/b/000.png"] == "val"
    assert sum(s == "train" for s in splits.values()) == 4


def test_presplit_tree_keeps_its_splits_in_a_conversion(tmp_path):
    src = tmp_path / "src"
    make_folder(src / "train", {"a": 4, "b": 3}, seed=1)
    make_folder(src / "val", {"a": 2, "b": 1}, seed=2)
    make_folder(src / "test", {"a": 1, "b": 2}, seed=3)

    out = tmp_path / "out"
    result = chute.convert(src, out, workers=1)
    assert result.num_written == {"train": 7, "val": 3, "test": 3}
    manifest = result.manifest
    assert manifest.class_names == ["a", "b"]
    assert manifest.splits["train"]["class_counts"] == [4, 3]
    assert manifest.splits["val"]["class_counts"] == [2, 1]
    assert manifest.splits["test"]["class_counts"] == [1, 2]
    for split in ("train", "val", "test"):
        keys = {r["key"] for r in all_records(out, split)}
        assert keys and all(k.startswith(f"{split}/") for k in keys)


@pytest.mark.parametrize("option", ["val_fraction", "test_fraction"])
def test_fraction_on_a_source_that_already_has_that_split_is_an_error(tmp_path, option):
    src = tmp_path / "src"
    make_folder(src / "train", {"a": 4, "b": 4}, seed=1)
    make_folder(src / "val", {"a": 1, "b": 1}, seed=2)
    make_folder(src / "test", {"a": 1, "b": 1}, seed=3)

    with pytest.raises(ChuteError) as error:
        chute.convert(src, tmp_path / "out", workers=1, **{option: 0.25})
    assert option in str(error.value)
    assert "0.25" in str(error.value)
    assert not (tmp_path / "out" / "manifest.json").exists()


# -- CSV and JSONL lists ------------------------------------------------------------------


@pytest.fixture
def listed(tmp_path, monkeypatch) -> Path:
    """``tmp/lists/imgs/{cat,dog}{0,1}.png``; cwd is elsewhere so paths must be list-relative."""
    base = tmp_path / "lists"
    for i, name in enumerate(["cat0", "cat1", "dog0", "dog1"]):
        write_image(base / "imgs" / f"{name}.png", seed=i)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return base


LIST_ROWS = "imgs/dog0.png,dog\nimgs/cat0.png,cat\nimgs/dog1.png,dog\nimgs/cat1.png,cat\n"


@pytest.mark.parametrize("header", ["path,label\n", "filename,class\n", ""], ids=repr)
def test_csv_paths_are_relative_to_the_list_file(listed, header):
    list_file = listed / "data.csv"
    list_file.write_text(header + LIST_ROWS)

    found = sources.scan(str(list_file))
    assert found.kind == "csv"
    assert not found.presplit
    assert found.class_names == ["cat", "dog"]
    assert keys_and_labels(found) == {
        "imgs/cat0.png": "cat",
        "imgs/cat1.png": "cat",
        "imgs/dog0.png": "dog",
        "imgs/dog1.png": "dog",
    }
    for item in found.items:
        assert item.split is None
        assert os.path.isabs(item.path)
        assert Path(item.path) == listed / item.key


def test_csv_with_a_relative_list_path_resolves_from_the_list_folder(listed, monkeypatch):
    (listed / "data.csv").write_text("path,label\n" + LIST_ROWS)
    monkeypatch.chdir(listed.parent)
    found = sources.scan(os.path.join("lists", "data.csv"))
    for item in found.items:
        assert Path(item.path) == listed / item.key
        assert Path(item.path).is_file()


def test_csv_absolute_path_is_refused_naming_the_line(listed, tmp_path):
    outside = write_image(tmp_path / "outside" / "abs.png")
    list_file = listed / "data.csv"
    list_file.write_text(f"path,label\nimgs/cat0.png,cat\n{outside},dog\n")

    with pytest.raises(ChuteError) as error:
        sources.scan(str(list_file))
    message = str(error.value)
    assert "line 3" in message
    assert str(outside) in message
    assert "allow_outside" in message or "--allow-outside" in message

    found = sources.scan(str(list_file), allow_outside=True)
    paths = {item.key: item.path for item in found.items}
    assert Path(paths[str(outside)]) == outside
    assert Path(paths["imgs/cat0.png"]) == listed / "imgs" / "cat0.png"


def test_csv_dotdot_escape_is_refused_naming_the_line(listed, tmp_path):
    write_image(tmp_path / "outside" / "esc.png")
    list_file = listed / "data.csv"
    list_file.write_text("imgs/cat0.png,cat\nimgs/dog0.png,dog\nimgs/../../outside/esc.png,dog\n")

    with pytest.raises(ChuteError) as error:
        sources.scan(str(list_file))
    message = str(error.value)
    assert "line 3" in message
    assert "../../outside/esc.png" in message

    found = sources.scan(str(list_file), allow_outside=True)
    item = next(i for i in found.items if i.key == "imgs/../../outside/esc.png")
    assert Path(item.path) == tmp_path / "outside" / "esc.png"


def test_csv_dotdot_that_stays_inside_the_list_folder_is_accepted(listed):
    list_file = listed / "data.csv"
    list_file.write_text("imgs/../imgs/cat0.png,cat\nimgs/dog0.png,dog\n")
    found = sources.scan(str(list_file))
    paths = sorted(Path(item.path) for item in found.items)
    assert paths == [listed / "imgs" / "cat0.png", listed / "imgs" / "dog0.png"]


def test_convert_refuses_an_outside_path_unless_allow_outside(listed, tmp_path):
    outside = write_image(tmp_path / "outside" / "abs.png", seed=7)
    list_file = listed / "data.csv"
    list_file.write_text(f"imgs/cat0.png,cat\n{outside},dog\n")

    with pytest.raises(ChuteError, match="line 2"):
        chute.convert(list_file, tmp_path / "out", workers=1)
    result = chute.convert(list_file, tmp_path / "out", workers=1, allow_outside=True)
    assert result.num_written == {"train": 2}


def test_jsonl_list(listed):
    list_file = listed / "data.jsonl"
    list_file.write_text(
        '{"path": "imgs/dog0.png", "label": "dog"}\n'
        "\n"
        '{"path": "imgs/cat0.png", "label": "cat"}\n'
        '{"path": "imgs/cat1.png", "label": "cat"}\n'
    )
    found = sources.scan(str(list_file))
    assert found.kind == "jsonl"
    assert found.class_names == ["cat", "dog"]
    assert keys_and_labels(found) == {
        "imgs/cat0.png": "cat",
        "imgs/cat1.png": "cat",
        "imgs/dog0.png": "dog",
    }
    for item in found.items:
        assert Path(item.path) == listed / item.key


def test_jsonl_escape_is_refused_naming_the_line(listed):
    list_file = listed / "data.jsonl"
    list_file.write_text(
        '{"path": "imgs/cat0.png", "label": "cat"}\n{"path": "../x.png", "label": "dog"}\n'
    )
    with pytest.raises(ChuteError) as error:
        sources.scan(str(list_file))
    assert "line 2" in str(error.value)
    assert "../x.png" in str(error.value)


def test_csv_split_column(listed):
    list_file = listed / "data.csv"
    list_file.write_text(
        "path,label,split\n"
        "imgs/cat0.png,cat,train\n"
        "imgs/dog0.png,dog,train\n"
        "imgs/cat1.png,cat,validation\n"
        "imgs/dog1.png,dog,test\n"
    )
    found = sources.scan(str(list_file))
    assert found.presplit
    assert split_of(found) == {
        "imgs/cat0.png": "train",
        "imgs/dog0.png": "train",
        "imgs/cat1.png": "val",
        "imgs/dog1.png": "test",
    }


def test_csv_bad_split_value_names_the_line_and_value(listed):
    list_file = listed / "data.csv"
    list_file.write_text("path,label,split\nimgs/cat0.png,cat,train\nimgs/dog0.png,dog,holdout\n")
    with pytest.raises(ChuteError) as error:
        sources.scan(str(list_file))
    assert "line 3" in str(error.value)
    assert "holdout" in str(error.value)


def test_jsonl_split_key(listed):
    list_file = listed / "data.jsonl"
    list_file.write_text(
        '{"path": "imgs/cat0.png", "label": "cat", "split": "train"}\n'
        '{"path": "imgs/dog0.png", "label": "dog", "split": "train"}\n'
        '{"path": "imgs/dog1.png", "label": "dog", "split": "val"}\n'
    )
    found = sources.scan(str(list_file))
    assert found.presplit
    assert split_of(found) == {
        "imgs/cat0.png": "train",
        "imgs/dog0.png": "train",
        "imgs/dog1.png": "val",
    }


def test_integer_labels_are_sorted_numerically(listed):
    list_file = listed / "data.csv"
    list_file.write_text("imgs/cat0.png,10\nimgs/cat1.png,2\nimgs/dog0.png,1\nimgs/dog1.png,100\n")
    found = sources.scan(str(list_file))
    assert found.class_names == ["1", "2", "10", "100"]
    assert keys_and_labels(found) == {
        "imgs/cat0.png": "10",
        "imgs/cat1.png": "2",
        "imgs/dog0.png": "1",
        "imgs/dog1.png": "100",
    }


def test_jsonl_integer_labels_are_sorted_numerically(listed):
    list_file = listed / "data.jsonl"
    list_file.write_text(
        '{"path": "imgs/cat0.png", "label": 10}\n'
        '{"path": "imgs/cat1.png", "label": 9}\n'
        '{"path": "imgs/dog0.png", "label": 0}\n'
    )
    found = sources.scan(str(list_file))
    assert found.class_names == ["0", "9", "10"]
    assert [found.class_names[i.label] for i in found.items] == ["10", "9", "0"]


def test_numeric_label_order_does_not_depend_on_hash_seed(listed):
    """Labels "1" and "01" are distinct classes with the same number; their order must be fixed."""
    list_file = listed / "data.csv"
    list_file.write_text("imgs/cat0.png,1\nimgs/cat1.png,01\nimgs/dog0.png,001\nimgs/dog1.png,2\n")
    code = (
        "import sys; from chute.ingest import sources; print(sources.scan(sys.argv[1]).class_names)"
    )
    seen = set()
    for seed in range(6):
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        done = subprocess.run(
            [sys.executable, "-c", code, str(list_file)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        seen.add(done.stdout.strip())
    assert len(seen) == 1, seen


def test_convert_from_a_list_labels_records(listed, tmp_path):
    list_file = listed / "data.csv"
    list_file.write_text("path,label\n" + LIST_ROWS)
    out = tmp_path / "out"
    result = chute.convert(list_file, out, workers=1)
    assert result.manifest.class_names == ["cat", "dog"]
    records = all_records(out)
    assert {r["key"]: r["class"] for r in records} == {
        "imgs/cat0.png": 0,
        "imgs/cat1.png": 0,
        "imgs/dog0.png": 1,
        "imgs/dog1.png": 1,
    }


def test_csv_empty_label_names_the_line(listed):
    list_file = listed / "data.csv"
    list_file.write_text("imgs/cat0.png,cat\nimgs/dog0.png,\n")
    with pytest.raises(ChuteError, match="line 2"):
        sources.scan(str(list_file))


# -- .npz arrays --------------------------------------------------------------------------


def test_npz_grayscale_x_y(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(7, 5, 4), dtype=np.uint8)
    y = np.array([2, 0, 1, 2, 0, 1, 2])
    path = tmp_path / "data.npz"
    np.savez(path, x=x, y=y)

    found = sources.scan(str(path))
    assert found.kind == "npz"
    assert not found.presplit
    assert found.class_names == ["0", "1", "2"]
    assert [item.label for item in found.items] == y.tolist()
    assert len({item.key for item in found.items}) == 7
    for item in found.items:
        assert item.path is None
        np.testing.assert_array_equal(found.payload(item), x[item.index])


def test_npz_rgb_with_class_names_converts_to_exact_pixels(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(6, 4, 5, 3), dtype=np.uint8)
    y = np.array([1, 0, 1, 0, 1, 0], dtype=np.int64)
    path = tmp_path / "data.npz"
    np.savez(path, x=x, y=y, class_names=np.array(["cat", "dog"]))

    found = sources.scan(str(path))
    assert found.class_names == ["cat", "dog"]
    assert [item.label for item in found.items] == y.tolist()

    out = tmp_path / "out"
    result = chute.convert(path, out, workers=1, encoding="raw")
    assert result.manifest.image.channels == 3
    index_of = {item.key: item.index for item in found.items}
    records = all_records(out)
    assert len(records) == 6
    for record in records:
        index = index_of[record["key"]]
        assert record["class"] == y[index]
        np.testing.assert_array_equal(decode(record), x[index])


def test_npz_rows_go_to_the_workers_as_one_array_a_chunk_with_the_same_bytes(tmp_path):
    """At ImageNet's shape a task of 64 rows, each pickled as an array of its own, cost the
    converter more than encoding them; now a chunk's rows are one array (up to 1 MiB) and
    an array's header is read once, in the converter, not once a row by a worker."""
    import pickle

    from helpers import tree_bytes

    from chute.ingest import convert as converting
    from chute.ingest import workers
    from chute.ingest.encode import Chunk

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(300, 4, 4), dtype=np.uint8)
    path = tmp_path / "data.npz"
    np.savez(path, x_train=x[:250], y_train=np.arange(250) % 3, x_val=x[250:], y_val=[0, 1] * 25)
    found = sources.scan(str(path))
    train = [item for item in found.items if item.split == "train"][:70]
    rows = found.payloads(train)
    assert isinstance(rows, np.ndarray) and rows.shape == (70, 4, 4)
    np.testing.assert_array_equal(rows, x[[item.index for item in train]])
    mixed = found.payloads([found.items[0], found.items[-1]])  # rows of two arrays
    assert isinstance(mixed, list) and len(mixed) == 2
    np.testing.assert_array_equal(mixed[1], x[-1])
    chunk = Chunk([item.key for item in train], [item.label for item in train], rows)
    # The task pickles one array object, not one a row (the rows' own bytes, together).
    task = pickle.loads(pickle.dumps(chunk))
    assert isinstance(task.payloads, np.ndarray) and task.payloads.flags.c_contiguous
    assert workers.task_cost((chunk, "spec", 1)) == 70
    assert converting._chunk_size(found) == converting.MAX_CHUNK  # 16-byte rows
    options = chute.ConvertOptions()
    probed = converting._probe(found, range(len(found.items)), options, None, None)  # no pool
    assert {p.height for p in probed} == {4} and len(probed) == 300
    # The output does not depend on the chunk's size or the number of workers.
    one = tmp_path / "one"
    chute.convert(path, one, workers=1, encoding="raw")
    original = converting.MAX_CHUNK
    try:
        converting.MAX_CHUNK = 64
        chute.convert(path, tmp_path / "two", workers=2, encoding="raw")
    finally:
        converting.MAX_CHUNK = original
    assert tree_bytes(one) == tree_bytes(tmp_path / "two")


def test_npz_with_train_and_test_arrays(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "data.npz"
    np.savez(
        path,
        x_train=rng.integers(0, 256, size=(5, 4, 4), dtype=np.uint8),
        y_train=np.array([0, 1, 0, 1, 2]),
        x_test=rng.integers(0, 256, size=(3, 4, 4), dtype=np.uint8),
        y_test=np.array([2, 1, 0]),
    )
    found = sources.scan(str(path))
    assert found.presplit
    assert found.class_names == ["0", "1", "2"]
    train = [i for i in found.items if i.split == "train"]
    test = [i for i in found.items if i.split == "test"]
    assert len(train) == 5 and len(test) == 3
    assert [i.label for i in test] == [2, 1, 0]
    np.testing.assert_array_equal(found.payload(test[1]), np.load(path)["x_test"][1])


def test_npz_float_pixels_are_an_error(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, x=np.zeros((3, 4, 4), dtype=np.float32), y=np.array([0, 1, 0]))
    with pytest.raises(ChuteError) as error:
        sources.scan(str(path))
    assert "x.dtype=float32" in str(error.value)
    assert "uint8" in str(error.value)


def test_npz_y_length_mismatch_is_an_error(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, x=np.zeros((4, 4, 4), dtype=np.uint8), y=np.array([0, 1, 0]))
    with pytest.raises(ChuteError) as error:
        sources.scan(str(path))
    message = str(error.value)
    assert "`y`" in message
    assert "y.shape=(3,)" in message
    assert "4" in message


def test_npz_without_x_and_y_is_an_error_listing_its_arrays(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, images=np.zeros((2, 3, 3), dtype=np.uint8), labels=np.array([0, 1]))
    with pytest.raises(ChuteError) as error:
        sources.scan(str(path))
    assert "images" in str(error.value) and "labels" in str(error.value)


# -- keras.datasets (local stand-ins, never the network) ----------------------------------


def _fake_load_data(monkeypatch, name: str, train, test) -> list[int]:
    import keras

    calls: list[int] = []

    def load_data(*args, **kwargs):
        calls.append(1)
        return train, test

    monkeypatch.setattr(getattr(keras.datasets, name), "load_data", load_data)
    return calls


def test_keras_mnist_through_a_local_stand_in(monkeypatch, tmp_path):
    rng = np.random.default_rng(3)
    x_train = rng.integers(0, 256, size=(6, 4, 4), dtype=np.uint8)
    y_train = np.array([0, 1, 2, 3, 9, 5], dtype=np.uint8)
    x_test = rng.integers(0, 256, size=(2, 4, 4), dtype=np.uint8)
    y_test = np.array([7, 1], dtype=np.uint8)
    calls = _fake_load_data(monkeypatch, "mnist", (x_train, y_train), (x_test, y_test))

    found = sources.scan("keras:mnist")
    assert calls
    assert found.kind == "keras"
    assert found.class_names == [str(i) for i in range(10)]
    assert [i.label for i in found.items if i.split == "train"] == y_train.tolist()
    assert [i.label for i in found.items if i.split == "test"] == y_test.tolist()
    test_items = [i for i in found.items if i.split == "test"]
    np.testing.assert_array_equal(found.payload(test_items[0]), x_test[0])


def test_keras_cifar10_labels_of_shape_n_by_1(monkeypatch, tmp_path):
    rng = np.random.default_rng(4)
    # Every class needs a training image, so all ten labels appear (shuffled).
    train_labels = [3, 0, 9, 1, 8, 2, 7, 4, 6, 5, 0, 9]
    x_train = rng.integers(0, 256, size=(12, 4, 4, 3), dtype=np.uint8)
    y_train = np.array(train_labels, dtype=np.uint8).reshape(-1, 1)
    x_test = rng.integers(0, 256, size=(2, 4, 4, 3), dtype=np.uint8)
    y_test = np.array([[3], [0]], dtype=np.uint8)
    _fake_load_data(monkeypatch, "cifar10", (x_train, y_train), (x_test, y_test))

    found = sources.scan("keras:cifar10")
    assert found.class_names[0] == "airplane" and found.class_names[9] == "truck"
    assert len(found.class_names) == 10
    assert [i.label for i in found.items if i.split == "train"] == train_labels
    assert [i.label for i in found.items if i.split == "test"] == [3, 0]

    out = tmp_path / "out"
    # val_fraction=0: the source's own splits only (by default a val split is carved from train)
    result = chute.convert("keras:cifar10", out, workers=1, encoding="raw", val_fraction=0)
    assert result.num_written == {"train": 12, "test": 2}
    assert result.manifest.class_names == found.class_names
    index_of = {item.key: item.index for item in found.items}
    for record in all_records(out, "test"):
        np.testing.assert_array_equal(decode(record), x_test[index_of[record["key"]]])


def test_a_keras_source_with_train_and_test_only_gets_a_stratified_val_split(monkeypatch, tmp_path):
    """keras:fashion_mnist comes with train and test only: by default a tenth of each
    class's training images becomes the val split (Keras users' ``validation_split=0.1``),
    said in the summary; ``--val-fraction 0`` keeps none."""
    rng = np.random.default_rng(5)
    y_train = np.repeat(np.arange(10, dtype=np.uint8), 20)  # 10 classes x 20
    x_train = rng.integers(0, 256, size=(200, 4, 4), dtype=np.uint8)
    x_test = rng.integers(0, 256, size=(3, 4, 4), dtype=np.uint8)
    y_test = np.array([0, 1, 2], dtype=np.uint8)
    _fake_load_data(monkeypatch, "fashion_mnist", (x_train, y_train), (x_test, y_test))

    out = tmp_path / "out"
    done = run_here("convert", "keras:fashion_mnist", out, "--workers", "1", "--no-progress")
    assert done.returncode == 0, done.stderr
    manifest = chute.load_manifest(out)
    assert manifest.options["val_fraction"] == 0.1  # the fraction used, stored
    assert list(manifest.splits["val"].class_counts) == [2] * 10  # stratified: 2 of each class's 20
    assert manifest.num_examples("train") == 180 and manifest.num_examples("test") == 3
    assert re.search(r"val\s+20 images in 1 shard\(s\), 0.1 of train by default", done.stdout)
    assert "val_fraction=0.1" in done.stderr  # the log line says how to keep none
    val = {record["key"] for record in all_records(out, "val")}
    assert not val & {record["key"] for record in all_records(out, "train")}
    again = run_here("convert", "keras:fashion_mnist", out, "--workers", "1", "--no-progress")
    assert "nothing to do" in again.stdout, again.stdout + again.stderr

    none = tmp_path / "none"
    kept = run_here(
        "convert", "keras:fashion_mnist", none, "--val-fraction", "0", "--workers", "1",
        "--no-progress",
    )  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    assert {k: v.examples for k, v in chute.load_manifest(none).splits.items()} == {
        "train": 200,
        "test": 3,
    }
    assert "by default" not in kept.stdout


def test_unknown_keras_dataset_is_an_error(monkeypatch):
    with pytest.raises(ChuteError) as error:
        sources.scan("keras:foo")
    message = str(error.value)
    assert "source='keras:foo'" in message
    assert "keras:mnist" in message and "keras:cifar10" in message


def test_a_keras_dataset_that_cannot_be_downloaded_is_one_line(monkeypatch):
    """What keras.utils.get_file raises offline (a bare Exception) becomes one ChuteError
    naming the dataset, Keras's cache and the .npz way out."""
    import keras

    def offline(*args, **kwargs):
        raise Exception(
            "URL fetch failure on https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
            "mnist.npz: None -- [Errno -3] Temporary failure in name resolution"
        )

    monkeypatch.setattr(keras.datasets.mnist, "load_data", offline)
    monkeypatch.delenv("KERAS_HOME", raising=False)
    with pytest.raises(ChuteError) as error:
        sources.scan("keras:mnist")
    message = str(error.value)
    assert "\n" not in message
    assert "keras.datasets.mnist.load_data() failed (URL fetch failure on https://" in message
    assert "Temporary failure in name resolution" in message
    assert "~/.keras/datasets ($KERAS_HOME/datasets)" in message
    assert "numpy.savez('mnist.npz', x_train=x_train" in message and "convert mnist.npz" in message
    assert "Received: source='keras:mnist'" in message


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chute_convert_of_a_keras_source_offline_says_so_in_one_line(tmp_path):
    """``chute convert keras:mnist`` with nothing cached and the network unreachable (every
    request through a proxy on a closed port of 127.0.0.1): exit 2 with one line naming
    Keras's cache and the .npz way out, no traceback, nothing left in the cache."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{s.getsockname()[1]}"
    home = tmp_path / "keras-home"
    env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
    env.update(
        KERAS_HOME=str(home),
        http_proxy=proxy,
        https_proxy=proxy,
        HTTP_PROXY=proxy,
        HTTPS_PROXY=proxy,
        CUDA_VISIBLE_DEVICES="",
    )
    result = subprocess.run(
        [sys.executable, "-m", "chute", "convert", "keras:mnist", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    line = errors[0]
    assert line.startswith("chute convert: error: keras.datasets.mnist.load_data() failed (")
    assert f"into {home / 'datasets'} and reads it from there" in line
    assert "convert mnist.npz" in line and "Received: source='keras:mnist'" in line
    assert not [p for p in (home / "datasets").rglob("*") if p.is_file()]  # no partial file


# -- errors -------------------------------------------------------------------------------


def test_missing_source_is_an_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ChuteError) as error:
        sources.scan(str(missing))
    assert "does not exist" in str(error.value)
    assert received(missing) in str(error.value)


def test_convert_of_a_missing_source_is_an_error_and_writes_nothing(tmp_path):
    with pytest.raises(ChuteError, match="does not exist"):
        chute.convert(tmp_path / "nowhere", tmp_path / "out", workers=1)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_empty_folder_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ChuteError) as error:
        sources.scan(str(empty))
    message = str(error.value)
    assert received(empty) in message
    assert "class" in message  # says what layout it expected


def test_folder_of_loose_images_without_class_folders_is_an_error(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a.png")
    write_image(src / "b.png")
    with pytest.raises(ChuteError) as error:
        sources.scan(str(src))
    assert received(src) in str(error.value)
    assert "class" in str(error.value)


def test_class_folders_without_images_are_an_error(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b" / "sub").mkdir(parents=True)
    (src / "a" / "notes.txt").write_text("no images here")
    write_image(src / "b" / ".hidden.png")
    with pytest.raises(ChuteError) as error:
        sources.scan(str(src))
    message = str(error.value)
    assert "no images" in message
    assert received(src) in message
    assert ".png" in message  # names the extensions it looked for


def test_unknown_source_file_kind_is_an_error(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a,b\n")
    with pytest.raises(ChuteError) as error:
        sources.scan(str(path))
    assert received(path) in str(error.value)
    assert ".csv" in str(error.value)


# -- odd trees and lists ------------------------------------------------------------------------


def test_a_pre_split_tree_with_another_top_folder_is_refused_naming_it(tmp_path):
    make_folder(tmp_path / "src" / "train", {"cat": 3, "dog": 3})
    make_folder(tmp_path / "src" / "val", {"cat": 1, "dog": 1})
    make_folder(tmp_path / "src" / "unlabeled", {"misc": 2})
    with pytest.raises(ChuteError, match=r"looks pre-split.*'unlabeled'"):
        sources.scan(str(tmp_path / "src"))


def test_archivers_litter_is_skipped_at_every_level(tmp_path, caplog):
    make_folder(tmp_path / "src" / "train", {"cat": 3, "dog": 3, "__MACOSX": 2})
    make_folder(tmp_path / "src" / "val", {"cat": 1, "dog": 1})
    make_folder(tmp_path / "src" / "__MACOSX", {"train": 2})
    with caplog.at_level("WARNING"):
        found = sources.scan(str(tmp_path / "src"))
    assert found.presplit and found.class_names == ["cat", "dog"]
    assert "__MACOSX" in caplog.text


def test_a_file_listed_twice_is_kept_once_and_reported(tmp_path):
    make_folder(tmp_path / "imgs", {"cat": 2, "dog": 2})
    (tmp_path / "list.csv").write_text(
        "path,label\nimgs/cat/000.png,cat\nimgs/dog/000.png,dog\nimgs/cat/000.png,bird\n"
        "imgs/./cat/000.png,cat\n"
    )
    found = sources.scan(str(tmp_path / "list.csv"))
    assert [item.key for item in found.items] == ["imgs/cat/000.png", "imgs/dog/000.png"]
    assert found.class_names == ["cat", "dog"]  # "bird" came only with the repeated row
    reasons = [r["reason"] for r in found.rejects]
    assert len(reasons) == 2 and all("line 2 lists the same file" in r for r in reasons)
    assert "with label 'bird', not 'cat'" in reasons[0]
    result = chute.convert(tmp_path / "list.csv", tmp_path / "out", workers=1)
    assert sum(result.num_written.values()) == 2
    assert {r["key"] for r in result.manifest.rejects} == {
        "imgs/cat/000.png (line 4)",
        "imgs/./cat/000.png (line 5)",
    }


def test_a_symlink_inside_the_list_folder_leading_out_is_outside(tmp_path):
    make_folder(tmp_path / "elsewhere", {"cat": 1})
    (tmp_path / "listed").mkdir()
    (tmp_path / "listed" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "listed" / "list.csv").write_text("link/cat/000.png,cat\n")
    with pytest.raises(ChuteError, match="inside the list's folder"):
        sources.scan(str(tmp_path / "listed" / "list.csv"))
    found = sources.scan(str(tmp_path / "listed" / "list.csv"), allow_outside=True)
    assert len(found.items) == 1


def test_a_list_on_a_tf_filesystem_resolves_its_paths(tmp_path):
    import tensorflow as tf

    root = f"ram://lists-{tmp_path.name}"
    make_folder(tmp_path / "imgs", {"cat": 3, "dog": 3})
    for path in sorted((tmp_path / "imgs").rglob("*.png")):
        target = f"{root}/data/{path.relative_to(tmp_path).as_posix()}"
        tf.io.gfile.makedirs(target.rsplit("/", 1)[0])
        tf.io.gfile.copy(str(path), target, overwrite=True)
    rows = "".join(f"imgs/{c}/{i:03d}.png,{c}\n" for c in ("cat", "dog") for i in range(3))
    with tf.io.gfile.GFile(f"{root}/data/list.csv", "w") as handle:
        handle.write(rows)
    found = sources.scan(f"{root}/data/list.csv")
    assert found.items[0].path == f"{root}/data/imgs/cat/000.png"
    result = chute.convert(f"{root}/data/list.csv", tmp_path / "out", workers=1)
    assert result.num_written == {"train": 6} and not result.manifest.rejects


def test_list_that_is_not_utf8(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "list.csv").write_bytes("a.png,caf\xe9\n".encode("latin-1"))
    with pytest.raises(ChuteError, match="not UTF-8"):
        sources.scan(str(tmp_path / "list.csv"))


def test_jsonl_split_that_is_not_a_string(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "list.jsonl").write_text('{"path": "a.png", "label": "x", "split": 3}\n')
    with pytest.raises(ChuteError, match=r"line 1.*'split' must be a string"):
        sources.scan(str(tmp_path / "list.jsonl"))


def test_corrupt_npz(tmp_path):
    (tmp_path / "data.npz").write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(ChuteError, match=r"not a readable \.npz file"):
        sources.scan(str(tmp_path / "data.npz"))


def test_file_url_source(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 2, "b": 2}, size=(4, 4))
    assert len(sources.scan(f"file://{src}").items) == 4


# -- names that are not UTF-8 ---------------------------------------------------------------


def test_names_that_are_not_utf8_are_escaped_keys_end_to_end(tmp_path):
    """A file, a bad file and a class folder named with bytes that are not UTF-8 (latin-1
    é, a stray 0xff): each such byte is written ``\\xNN`` in the keys, records, rejects and
    source-files.csv; the files are still read through their real names."""
    src = make_folder(tmp_path / "src", {"a": 2, "b": 1})
    root = os.fsencode(src)
    os.mkdir(root + b"/caf\xe9")
    pixels = np.arange(120, dtype=np.uint8).reshape(12, 10)
    os.rename(write_image(tmp_path / "x.png", pixels), root + b"/a/caf\xe9.png")
    os.rename(write_image(tmp_path / "y.png", seed=3), root + b"/caf\xe9/\xff.png")
    with open(root + b"/b/bad\xff.png", "wb") as handle:
        handle.write(b"\x89PNG\r\n\x1a\n not really")

    found = sources.scan(str(src))
    assert found.class_names == ["a", "b", "caf\\xe9"]
    assert "a/caf\\xe9.png" in keys_and_labels(found)
    assert keys_and_labels(found)["caf\\xe9/\\xff.png"] == "caf\\xe9"

    results = [chute.convert(src, tmp_path / name, workers=1) for name in ("out", "again")]
    records = {r["key"]: r for r in all_records(tmp_path / "out")}
    assert set(records) == {"a/000.png", "a/001.png", "a/caf\\xe9.png", "b/000.png",
                            "caf\\xe9/\\xff.png"}  # fmt: skip
    assert (decode(records["a/caf\\xe9.png"])[..., 0] == pixels).all()
    (reject,) = results[0].manifest.rejects
    assert reject["key"] == "b/bad\\xff.png"
    assert "b/bad\\xff.png," in (tmp_path / "out" / "rejects.csv").read_text("utf-8")
    listing = (tmp_path / "out" / "source-files.csv").read_text("utf-8")
    assert "\na/caf\\xe9.png," in listing and "\ncaf\\xe9/\\xff.png," in listing
    # deterministic: a second conversion writes the same shards and rejects
    for name in ("train-00000-of-00001.tfrecord", "rejects.csv", "source-files.csv"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    assert chute.convert(src, tmp_path / "out", workers=1).already_done


# -- one table of kinds, one class per payload ----------------------------------------------


def test_one_table_decides_the_kind_for_the_scan_and_for_the_files(tmp_path):
    """What a source is read from (known before scanning, for a re-run's check) and how
    it is scanned come from the same row: each kind's class, and the files it lists."""
    import tarfile

    folder = make_folder(tmp_path / "folder", {"a": 2, "b": 2}, size=(4, 4))
    (tmp_path / "list.csv").write_text("path,label\nfolder/a/0.png,a\nfolder/b/0.png,b\n")
    np.savez(tmp_path / "arrays.npz", x=np.zeros((2, 3, 3), np.uint8), y=np.array([0, 1]))
    with tarfile.open(tmp_path / "tree.tar", "w") as packed:
        packed.add(folder, arcname="tree")
    cases = [  # (source, its class, its files before any scan)
        (folder, sources.FileSource, None),
        (tmp_path / "list.csv", sources.FileSource, None),
        (tmp_path / "arrays.npz", sources.ArraySource, [str(tmp_path / "arrays.npz")]),
        (tmp_path / "tree.tar", sources.MemberSource, [str(tmp_path / "tree.tar")]),
    ]
    for source, kind, files in cases:
        assert sources.container_files(str(source)) == files, source
        with sources.scan(str(source)) as found:
            assert type(found) is kind, source
            listed = [key for key, *_ in found.listing()]
            assert listed == (files or sorted(item.key for item in found.items)), source
    assert sources.container_files(str(tmp_path / "missing.npz")) is None
    assert sources.container_files("keras:mnist") is None  # a download: nothing to stat


def test_each_kind_gives_its_own_payload(tmp_path):
    items = [
        sources.Item("a/0.png", 0, None, "/data/a/0.png"),
        sources.Item("x", 1, "test", None, 1),
    ]
    files = sources.FileSource("folder", "/data", ["a"], items[:1])
    assert files.payload(items[0]) == "/data/a/0.png"
    pixels = np.arange(8, dtype=np.uint8).reshape(2, 2, 2)
    arrays = sources.ArraySource(
        "keras", "keras:mnist", ["a", "b"], items[1:], arrays={"test": pixels}
    )
    np.testing.assert_array_equal(arrays.payload(items[1]), pixels[1])
    assert arrays.listing() == [("keras:mnist", -1, -1)]  # Keras's cache: the name stands
    scratch = tmp_path / "unpacked"
    scratch.mkdir()
    members = sources.MemberSource("tar", "t.tar", ["b"], items[1:], members=["m0", "m1"],
                                   temp_dir=str(scratch))  # fmt: skip
    assert members.payload(items[1]) == "m1"
    with members:
        pass
    assert not scratch.exists()  # closing deletes what the source was unpacked to
