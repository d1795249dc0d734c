"""chute bench on a tiny folder: every loader timed, ratios and the model's bottleneck reported."""

from __future__ import annotations

import json

import pytest
from helpers import make_folder, run_cli


@pytest.mark.slow
def test_bench_times_every_loader_and_names_the_bottleneck(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 20, "b": 20}, size=(40, 40))
    out = tmp_path / "figures.json"
    result = run_cli(
        "bench",
        src,
        "--image-size",
        "32",
        "--batch-size",
        "8",
        "--work-dir",
        tmp_path / "work",
        "--model",
        "MobileNetV2",
        "--json",
        out,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    names = [row["name"] for row in figures["loaders"]]
    assert names[0].startswith("chute.load") and "keras image_dataset_from_directory" in names
    assert "chute.image_dataset_from_directory" in names
    assert any(name.startswith("in-memory Dataset.from_tensor_slices") for name in names)
    for row in figures["loaders"]:
        assert len(row["images_per_s"]) == 2 and min(row["images_per_s"]) > 0
    assert "chute.load cached pass / from_tensor_slices" in figures["ratios"]
    assert (
        figures["ratios"]["chute.load first pass, no cache / keras image_dataset_from_directory"]
        > 0
    )
    reading = (
        "chute.load first pass without building the dataset / keras image_dataset_from_directory"
    )
    with_build = "chute.load first pass / keras image_dataset_from_directory"
    assert figures["ratios"][reading] >= figures["ratios"][with_build] > 0
    first = figures["loaders"][0]
    assert 0 < first["build_seconds"] < first["seconds"][0]
    assert figures["model"]["bottleneck"] in ("input pipeline", "model compute")
    assert "the bottleneck is the" in result.stdout and "chute.load first pass /" in result.stdout


def test_bench_rejects_a_source_that_is_not_a_folder(tmp_path):
    (tmp_path / "file.txt").write_text("not images")
    result = run_cli("bench", tmp_path / "file.txt", "--work-dir", tmp_path / "work")
    assert result.returncode == 2 and "`source` must be a folder" in result.stderr
