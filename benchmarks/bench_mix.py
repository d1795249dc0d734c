"""Benchmark: a mixture of datasets (``chute.load([a, b], weights=...)``) against reading
the largest of them alone, on both engines, side by side in one run (issue #42, item 4:
target >= 0.95x the images/s of the largest dataset alone).

    python benchmarks/bench_mix.py --rounds 3 --json benchmarks/results/mix.json

Data (generated once under --work-dir and kept there, no download), bench_grain.py's:

* photos: camera-size photo-like JPEGs converted at shorter side 256 (JPEG), read at
  224x224 with ``augment="crop,flip"``, batch 64: the largest dataset (--photos, default
  500 photos) and a second, smaller one (--photos-b, default 200). Mixed 0.7 / 0.3.
* glyphs: generated glyph PNGs as 75x75 grayscale raw shards, batch 256: --glyph-classes
  x 40 (the largest) and half as many classes x 40, mixed 0.7 / 0.3.

Rows, each engine (``tf``: ``cache=None``; ``grain``: workers = the cores): ``alone`` (the
largest dataset), ``second`` (the other one alone) and ``mix``; "expected" is the rate
of reading 0.7 of the first and 0.3 of the second alone (``1 / (0.7 / alone + 0.3 /
second)``), what a mixture without any cost of its own would read. Every row streams
(``repeat=True``): built, started, read --warmup seconds untimed, then timed for at least
--seconds. The rows take turns within a
round (order reversed every other round); each figure is the median over --rounds, and
each ratio the median of the per-round ratios. images/CPU-s counts this process and its
children (Grain's workers), as bench_grain.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_grain import cores, glyph_shards, machine, photo_shards, stream, warm_up  # noqa: E402

SEED = 0
SIZE = 224


def loader(paths, batch: int, engine: str, weights=None, **options):
    """A ``make()`` for bench_grain's ``stream``: one dataset, or a mixture."""

    def make():
        import chute

        reading = {"engine": "grain", "workers": cores()} if engine == "grain" else {}
        if engine == "tf":
            reading["cache"] = None
        target = paths if len(paths) > 1 else paths[0]
        mixing = {"weights": weights} if len(paths) > 1 else {}
        dataset = chute.load(
            target, batch_size=batch, repeat=True, seed=SEED, **mixing, **reading, **options
        )
        return dataset, (iter if engine == "grain" else (lambda d: d.as_numpy_iterator()))

    return make


def rows_of(args, photos: list[str] | None, glyphs: list[str] | None) -> dict:
    rows = {}
    for engine in args.engines:
        if photos:
            light = {"image_size": SIZE, "augment": "crop,flip"}
            rows[f"photos {engine} alone"] = ("images", loader(photos[:1], 64, engine, **light))
            rows[f"photos {engine} second"] = ("images", loader(photos[1:], 64, engine, **light))
            rows[f"photos {engine} mix"] = (
                "images",
                loader(photos, 64, engine, weights=[0.7, 0.3], **light),
            )
        if glyphs:
            rows[f"glyphs {engine} alone"] = ("images", loader(glyphs[:1], 256, engine))
            rows[f"glyphs {engine} second"] = ("images", loader(glyphs[1:], 256, engine))
            rows[f"glyphs {engine} mix"] = (
                "images",
                loader(glyphs, 256, engine, weights=[0.7, 0.3]),
            )
    return rows


def table(summary: dict) -> str:
    lines = [
        "| data | engine | largest alone images/s | second alone | mix images/s "
        "| **mix / largest alone** | mix / expected | largest alone img/CPU-s "
        "| mix img/CPU-s | mix / largest per CPU-s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, ratio in summary["ratios"].items():
        data, engine = key.split()
        rows = summary["rows"]
        alone, second, mix = (rows[f"{key} {what}"] for what in ("alone", "second", "mix"))
        lines.append(
            f"| {data} | {engine} | {alone['images_per_s']:,.0f} "
            f"| {second['images_per_s']:,.0f} | {mix['images_per_s']:,.0f} "
            f"| **{ratio['images_per_s']:.2f}x** | {ratio['expected']:.2f}x "
            f"| {alone['images_per_cpu_s']:,.0f} | {mix['images_per_cpu_s']:,.0f} "
            f"| {ratio['images_per_cpu_s']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--photos", type=int, default=500)
    parser.add_argument("--photos-b", type=int, default=200)
    parser.add_argument("--glyph-classes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--engines", nargs="+", default=["tf", "grain"])
    parser.add_argument("--only", nargs="+", default=["photos", "glyphs"])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    photos = glyphs = None
    if "photos" in args.only:
        photos = [
            photo_shards(args.work_dir, args.photos),
            photo_shards(args.work_dir, args.photos_b),
        ]
    if "glyphs" in args.only:
        glyphs = [
            glyph_shards(args.work_dir, args.glyph_classes, 40),
            glyph_shards(args.work_dir, max(2, args.glyph_classes // 2), 40),
        ]
    rows = rows_of(args, photos, glyphs)
    warm_up(rows)
    runs: dict[str, list[dict]] = {name: [] for name in rows}
    for number in range(args.rounds):
        order = list(rows) if number % 2 == 0 else list(rows)[::-1]
        for name in order:
            result = stream(rows[name][1], args.seconds, args.warmup)
            runs[name].append(result)
            print(
                f"round {number + 1}: {name}: {result['images_per_s']:,.0f} images/s, "
                f"{result['images_per_cpu_s']:,.0f} per CPU-s",
                flush=True,
            )
    summary = {"machine": machine(), "args": vars(args), "rows": {}, "ratios": {}}
    for name, results in runs.items():
        summary["rows"][name] = {
            key: statistics.median(r[key] for r in results)
            for key in ("images_per_s", "images_per_cpu_s", "build_s", "start_s")
        }
    for name in rows:
        if not name.endswith(" mix"):
            continue
        key = name.removesuffix(" mix")
        alone = runs[f"{key} alone"]
        second = runs[f"{key} second"]
        summary["ratios"][key] = {
            what: statistics.median(
                m[what] / a[what] for m, a in zip(runs[name], alone, strict=True)
            )
            for what in ("images_per_s", "images_per_cpu_s")
        }
        summary["ratios"][key]["expected"] = statistics.median(
            m["images_per_s"] * (0.7 / a["images_per_s"] + 0.3 / b["images_per_s"])
            for m, a, b in zip(runs[name], alone, second, strict=True)
        )
    print(table(summary))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=2)


if __name__ == "__main__":
    main()
