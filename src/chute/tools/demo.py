"""The demo: the main job on a built-in sample, with no download.

Generates a small folder of glyph images (:mod:`chute.tools.samples`),
converts it, inspects it, draws its class grid, verifies it, trains a small CNN
on the CPU and classifies held-out images. ``say`` receives one line
per step (the CLI prints them; the library itself never prints).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from chute.errors import ChuteError
from chute.fit.predict import predict
from chute.fit.train import train
from chute.format import storage
from chute.ingest.convert import convert
from chute.tools import samples
from chute.tools.grid import draw_grid
from chute.tools.inspect import inspect
from chute.tools.verify import verify


def run(
    directory: str | os.PathLike = "chute-demo",
    *,
    num_classes: int = 24,
    images_per_class: int = 60,
    epochs: int = 8,
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
    # Drawn once: a second demo in the same folder starts from the same images.
    if not os.path.isdir(images):
        say(f"1/6 drawing {num_classes} classes x {images_per_class} glyph images into {images}")
        samples.make_sample_folder(
            images,
            num_classes=num_classes,
            images_per_class=images_per_class,
            image_size=(40, 40),
            workers=min(4, os.cpu_count() or 1),
        )
    else:
        say(f"1/6 using the sample images already in {images}")
    say(f"2/6 converting to {shards} (32x32 grayscale, 10% validation)")
    result = convert(
        images, shards, image_size=32, color_mode="grayscale", val_fraction=0.1, overwrite=True
    )
    say(
        "    "
        + ", ".join(f"{k}: {v} images" for k, v in result.num_written.items())
        + f" in {result.seconds:.1f} s"
    )
    say("3/6 inspecting")
    say(inspect(shards))
    draw_grid(shards, grid, per_class=10, max_classes=12)
    say(f"    sample grid: {grid}")
    say("4/6 verifying every shard")
    checked = verify(shards)
    if not checked.ok:
        raise ChuteError(f"verify found problems: {checked.problems}")
    say(f"    ok: {checked.num_shards} shards, {checked.num_records} records match the manifest")
    if not epochs:
        return {"images": images, "shards": shards, "grid": grid}

    run_dir = storage.join(directory, "run")
    say(f"5/6 training chute's default model for {epochs} epochs on the CPU into {run_dir}")
    result = train(
        shards,
        run_dir,
        epochs=epochs,
        batch_size=32,
        strategy="cpu",
        precision="float32",
        overwrite=True,
        verbose=0,
    )
    say(
        f"    best validation accuracy {result.best_val_accuracy:.3f} "
        f"(chance: {1 / num_classes:.3f}); {result.seconds_per_epoch:.1f} s/epoch, "
        f"{result.images_per_second:,.0f} images/s"
    )
    # Another seed than the training images': glyphs the model has never seen.
    held_out = storage.join(directory, "held-out")
    samples.make_sample_folder(
        held_out, num_classes=num_classes, images_per_class=1, image_size=(40, 40), seed=999
    )
    say(f"6/6 classifying held-out images (never seen in training) from {held_out}")
    predictions = predict(run_dir, [held_out], top_k=1)
    right = sum(
        item.class_name == item.path.replace("\\", "/").rsplit("/", 2)[-2]
        for item in predictions.predictions
    )
    for item in predictions.predictions[:6]:
        truth = item.path.replace("\\", "/").rsplit("/", 2)[-2]
        say(f"    {truth}: predicted {item.class_name} ({item.top[0][1]:.2f})")
    say(f"    {right} of {len(predictions.predictions)} held-out images right")
    return {
        "images": images,
        "shards": shards,
        "grid": grid,
        "run": run_dir,
        "model bundle": result.bundle,
        "curves": storage.join(run_dir, "curves.png"),
        "confusion": storage.join(run_dir, "confusion-val.png"),
        "held-out": held_out,
    }
