"""chute bench: every loader timed; ratios and the model's bottleneck follow from the timings."""

from __future__ import annotations

import json

import pytest
from helpers import make_folder, run_here

from chute.tools import bench

KERAS = "keras image_dataset_from_directory"
IDG = "tf_keras ImageDataGenerator.flow_from_directory"


def _rate(row: dict, index: int) -> float:
    return row["images"] / row["seconds"][index]


def test_ratios_divide_chute_passes_by_each_baselines_faster_pass():
    rows = [
        bench.Row("chute.load (pass 1: shards; pass 2: cache)", 1000, [2.0, 0.5], build=1.0),
        bench.Row("chute.load, no cache", 1000, [4.0, 2.5]),
        bench.Row("chute.image_dataset_from_directory", 1000, [5.0, 4.0]),
        bench.Row(KERAS, 1000, [10.0, 8.0]),
        bench.Row(IDG, 1000, [20.0, 25.0]),
        bench.Row("in-memory Dataset.from_tensor_slices (baseline)", 1000, [0.4, 0.25]),
    ]
    ratios = bench._ratios(rows)
    assert ratios == pytest.approx(
        {
            # keras's faster pass: 125 img/s; ImageDataGenerator's: 50 img/s
            f"chute.load first pass / {KERAS}": 500 / 125,
            f"chute.load first pass, no cache / {KERAS}": 250 / 125,
            f"chute.load first pass / {IDG}": 500 / 50,
            f"chute.load first pass, no cache / {IDG}": 250 / 50,
            # the first pass less the 1 s build: 1000 images in 1 s
            f"chute.load first pass without building the dataset / {KERAS}": 1000 / 125,
            f"chute.load first pass without building the dataset / {IDG}": 1000 / 50,
            "chute.load cached pass / from_tensor_slices": 2000 / 4000,
            f"chute drop-in / {KERAS}": 250 / 125,
        }
    )


def test_per_cpu_second_ratios_divide_chute_s_first_pass_by_each_baseline_s_best():
    rows = [
        bench.Row("chute.load (pass 1: shards; pass 2: cache)", 1000, [2.0, 0.5], cpu=[2, 1]),
        bench.Row("chute.load, no cache", 1000, [4.0, 2.5], cpu=[4.0, 5.0]),
        bench.Row("chute.image_dataset_from_directory", 1000, [5.0, 4.0], cpu=[5, 5]),
        bench.Row(KERAS, 1000, [10.0, 8.0], cpu=[20.0, 10.0]),
        bench.Row(IDG, 1000, [20.0, 25.0], cpu=[40.0, 50.0]),
        bench.Row("in-memory Dataset.from_tensor_slices (baseline)", 1000, [0.4, 0.25]),
    ]
    assert rows[1].per_cpu_second == [250.0, 200.0]
    ratios = bench._ratios(rows)
    # chute without a cache: 250 images per CPU-second; keras at best 100, IDG 25
    assert ratios[f"chute.load first pass per CPU-second / {KERAS}"] == pytest.approx(2.5)
    assert ratios[f"chute.load first pass per CPU-second / {IDG}"] == pytest.approx(10.0)


def test_ratios_leave_out_a_baseline_that_did_not_run():
    rows = [
        bench.Row("chute.load (pass 1: shards; pass 2: cache)", 100, [1.0, 1.0]),
        bench.Row("chute.load, no cache", 100, [1.0, 1.0]),
        bench.Row("chute.image_dataset_from_directory", 100, [1.0, 1.0]),
        bench.Row(KERAS, 100, [1.0, 1.0]),
        bench.Row("in-memory Dataset.from_tensor_slices (baseline)", 100, [1.0, 1.0]),
    ]
    assert not any(IDG in name for name in bench._ratios(rows))


@pytest.mark.parametrize(
    ("first_rate", "bottleneck", "feed"),
    [(300.0, "input pipeline", 0.75), (600.0, "model compute", 1.5)],
)
def test_the_slower_side_is_named_the_bottleneck(first_rate, bottleneck, feed):
    figures = bench._feed_figures("M", train_rate=400.0, first_rate=first_rate, cached_rate=800.0)
    assert figures == {
        "model": "M",
        "train_images_per_s": 400,
        "feed_ratio_first_pass": feed,
        "feed_ratio_cached": 2.0,
        "bottleneck": bottleneck,
    }


@pytest.mark.slow
def test_bench_times_every_loader_and_reports_figures_that_follow_from_the_timings(tmp_path):
    """One run: every loader timed for the minimum, the ratios and the bottleneck recomputed
    from the timings it reports, and a model named as ``chute train`` names it."""
    src = make_folder(tmp_path / "src", {"a": 20, "b": 20}, size=(40, 40))
    out = tmp_path / "figures.json"
    result = run_here(
        "bench",
        src,
        "--image-size",
        "32",
        "--batch-size",
        "8",
        "--work-dir",
        tmp_path / "work",
        "--model",
        "kannada-cnn",  # one of chute.available_models(), not a keras.applications name
        "--min-seconds",
        "0.3",
        "--json",
        out,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["min_seconds"] == 0.3
    assert "each loader timed for at least 0.3 s" in result.stdout
    rows = {row["name"].split(" (")[0]: row for row in figures["loaders"]}
    assert figures["loaders"][0]["name"].startswith("chute.load")
    for name in ("chute.load, no cache", "chute.image_dataset_from_directory", KERAS):
        assert name in rows
    assert "in-memory Dataset.from_tensor_slices" in rows
    for row in figures["loaders"]:
        # 40 images, batches of 8: every loader saw every image, twice per round
        assert row["images"] == 40 and len(row["seconds"]) == 2 and row["rounds"] >= 1
        assert row["images_per_s"] == pytest.approx([_rate(row, 0), _rate(row, 1)], rel=1e-3, abs=1)
        # the mean passes times the rounds: at least the minimum (to the microsecond)
        assert row["rounds"] * sum(row["seconds"]) >= 0.3 - 1e-5, row
        # images per CPU-second of this process's threads: some CPU was spent on each pass
        assert len(row["cpu_seconds"]) == 2 and min(row["cpu_seconds"]) > 0, row
        per_cpu = [row["images"] / c for c in row["cpu_seconds"]]
        assert row["images_per_cpu_s"] == pytest.approx(per_cpu, rel=1e-3, abs=1)

    # Each ratio recomputed from the timings the JSON reports (to the microsecond).
    load = figures["loaders"][0]
    best = {name: max(_rate(row, 0), _rate(row, 1)) for name, row in rows.items()}
    reading = load["images"] / (load["seconds"][0] - load["build_seconds"])
    expected = {
        f"chute.load first pass / {KERAS}": _rate(load, 0) / best[KERAS],
        f"chute.load first pass, no cache / {KERAS}": _rate(rows["chute.load, no cache"], 0)
        / best[KERAS],
        f"chute.load first pass without building the dataset / {KERAS}": reading / best[KERAS],
        "chute.load cached pass / from_tensor_slices": _rate(load, 1)
        / best["in-memory Dataset.from_tensor_slices"],
        f"chute drop-in / {KERAS}": best["chute.image_dataset_from_directory"] / best[KERAS],
    }
    no_cache = rows["chute.load, no cache"]
    expected[f"chute.load first pass per CPU-second / {KERAS}"] = (
        no_cache["images"] / no_cache["cpu_seconds"][0]
    ) / max(rows[KERAS]["images"] / c for c in rows[KERAS]["cpu_seconds"])
    for name, value in expected.items():
        assert figures["ratios"][name] == pytest.approx(value, rel=0.02, abs=0.01), name
    assert "img/CPU-s" in result.stdout

    model = figures["model"]
    assert model["model"] == "kannada-cnn"
    feed = _rate(load, 0) / model["train_images_per_s"]
    assert model["feed_ratio_first_pass"] == pytest.approx(feed, rel=0.05, abs=0.01)
    assert model["bottleneck"] == ("input pipeline" if feed < 1 else "model compute")
    assert f"the bottleneck is the {model['bottleneck']}" in result.stdout
    first = f"chute.load first pass / {KERAS}"
    assert f"{first}: {figures['ratios'][first]}x" in result.stdout


def test_bench_rejects_a_source_that_is_not_a_folder(tmp_path):
    (tmp_path / "file.txt").write_text("not images")
    result = run_here("bench", tmp_path / "file.txt", "--work-dir", tmp_path / "work")
    assert result.returncode == 2 and "`source` must be a folder" in result.stderr


# -- timed for a minimum duration; every argument checked first --------------------------------


def test_rounds_repeat_until_the_minimum_duration_and_average_each_pass():
    reported = iter(
        [
            (16, [0.1, 0.3], 0.05, [0.2, 0.6]),
            (16, [0.2, 0.1], 0.01, [0.4, 0.3]),
            (16, [0.3, 0.2], 0.03, [0.6, 0.3]),
        ]
    )
    images, seconds, build, rounds, cpu = bench._rounds(lambda: next(reported), min_seconds=1.0)
    # 0.4 s, then 0.7 s, then 1.2 s >= 1.0 s: three rounds, each pass the mean of three
    assert (images, rounds) == (16, 3)
    assert seconds == pytest.approx([0.2, 0.2]) and build == pytest.approx(0.03)
    assert cpu == pytest.approx([0.4, 0.4])
    one = iter([(16, [0.5, 0.7], 0.0, [0.5, 0.7])])
    assert bench._rounds(lambda: next(one), min_seconds=1.0)[3] == 1  # 1.2 s: enough


def test_bench_refuses_an_unknown_model_before_any_work(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 4, "b": 4})
    result = run_here("bench", src, "--model", "NoSuchModel", "--work-dir", tmp_path / "work")
    assert result.returncode == 2, result.stderr
    assert "`model` must be one of" in result.stderr
    assert "Received: model='NoSuchModel'" in result.stderr
    assert "converting" not in result.stderr and "timing" not in result.stderr
    assert not (tmp_path / "work" / "shards").exists()


def test_bench_with_fewer_images_than_a_batch_says_so(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 2, "b": 1})
    result = run_here("bench", src, "--batch-size", "8", "--work-dir", tmp_path / "work")
    assert result.returncode == 2, result.stderr
    assert "`batch_size` must be at most the number of images" in result.stderr
    assert "(3)" in result.stderr and "Received: batch_size=8" in result.stderr
    assert "timing" not in result.stderr and "Traceback" not in result.stderr
