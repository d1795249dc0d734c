"""The demo: the main job on a built-in sample, with no download.

Generates a small folder of glyph images (:mod:`chute.samples`), converts it,
inspects it, draws its class grid and verifies it. ``say`` receives one line
per step (the CLI prints them; the library itself never prints).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from chute import conversion, describe, report, samples, storage, verification
from chute.errors import ChuteError


def run(
    directory: str | os.PathLike = "chute-demo",
    *,
    num_classes: int = 24,
    images_per_class: int = 60,
    say: Callable[[str], None] = lambda line: None,
) -> dict[str, str]:
    """Runs the demo in ``directory``; returns where each artefact went.

    Example:
        >>> paths = run("/tmp/chute-demo", say=print)  # doctest: +SKIP
    """
    directory = os.fspath(directory)
    images = storage.join(directory, "sample-images")
    shards = storage.join(directory, "shards")
    grid = storage.join(directory, "grid.png")
    if not os.path.isdir(images):
        say(f"1/4 drawing {num_classes} classes x {images_per_class} glyph images into {images}")
        samples.make_sample_folder(
            images,
            num_classes=num_classes,
            images_per_class=images_per_class,
            image_size=(40, 40),
            workers=min(4, os.cpu_count() or 1),
        )
    else:
        say(f"1/4 using the sample images already in {images}")
    say(f"2/4 converting to {shards} (32x32 grayscale, 10% validation)")
    result = conversion.convert(
        images, shards, image_size=32, color_mode="grayscale", val_fraction=0.1, overwrite=True
    )
    say(
        "    "
        + ", ".join(f"{k}: {v} images" for k, v in result.num_written.items())
        + f" in {result.seconds:.1f} s"
    )
    say("3/4 inspecting")
    say(describe.describe(shards))
    report.draw_grid(shards, grid, per_class=10, max_classes=12)
    say(f"    sample grid: {grid}")
    say("4/4 verifying every shard")
    checked = verification.verify(shards)
    if not checked.ok:
        raise ChuteError(f"verify found problems: {checked.problems}")
    say(f"    ok: {checked.num_shards} shards, {checked.num_records} records match the manifest")
    return {"images": images, "shards": shards, "grid": grid}
