"""A built-in sample dataset: glyphs drawn with Pillow, no download.

Each class is one or two characters drawn with Pillow's default font, with
random rotation, shift, scale and noise: hard enough that a classifier has
something to learn, small and fast to make. The demo, the tests and the
benchmarks all use it.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import string

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from chute import checks
from chute.errors import ChuteError

_ALPHABET = string.ascii_uppercase + string.digits  # distinct even on case-blind filesystems


def class_text(index: int) -> str:
    """The glyph(s) of class ``index``: 'A'..'9', then two-character pairs.

    Example:
        >>> class_text(0), class_text(36)
        ('A', 'AA')
    """
    if index < len(_ALPHABET):
        return _ALPHABET[index]
    index -= len(_ALPHABET)
    return _ALPHABET[index // len(_ALPHABET) % len(_ALPHABET)] + _ALPHABET[index % len(_ALPHABET)]


def render_glyph(
    text: str,
    size: tuple[int, int],
    rng: np.random.Generator,
    *,
    rgb: bool = False,
    noise: float = 0.25,
) -> Image.Image:
    """Draws ``text`` at a random angle, offset and scale, with Gaussian noise."""
    height, width = size
    # Drawn at twice the size, rotated, then cut and scaled down: no edge of the glyph is lost.
    canvas = 2 * max(height, width)
    font = ImageFont.load_default(
        size=int(canvas * rng.uniform(0.35, 0.5) / max(1, len(text)) ** 0.5)
    )
    image = Image.new("L", (canvas, canvas), 0)
    ImageDraw.Draw(image).text((canvas / 2, canvas / 2), text, fill=255, font=font, anchor="mm")
    image = image.rotate(rng.uniform(-20, 20), resample=Image.Resampling.BILINEAR)
    box_w, box_h = (
        0.8 * canvas * width / max(height, width),
        0.8 * canvas * height / max(height, width),
    )
    left = (canvas - box_w) / 2 + rng.uniform(-0.1, 0.1) * canvas
    top = (canvas - box_h) / 2 + rng.uniform(-0.1, 0.1) * canvas
    image = image.resize(
        (width, height), Image.Resampling.BILINEAR, box=(left, top, left + box_w, top + box_h)
    )
    pixels = np.asarray(image, dtype=np.float32)
    if rgb:
        tint = rng.uniform(0.4, 1.0, size=3)
        pixels = pixels[..., None] * tint
    pixels = pixels + rng.normal(0, 255 * noise, size=pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _write_class(args: tuple) -> None:
    root, index, name, count, size, rgb, noise, seed, fmt = args
    # A generator per class: the images do not depend on how classes are shared out to workers.
    rng = np.random.default_rng([seed, index])
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    for number in range(count):
        image = render_glyph(class_text(index), size, rng, rgb=rgb, noise=noise)
        image.save(os.path.join(folder, f"{number:05d}.{fmt}"))


def make_sample_folder(
    path: str | os.PathLike,
    *,
    num_classes: int = 20,
    images_per_class: int = 30,
    image_size: tuple[int, int] = (64, 64),
    color_mode: str = "grayscale",
    noise: float = 0.25,
    image_format: str = "png",
    seed: int = 0,
    workers: int = 1,
) -> list[str]:
    """Writes ``path/<class>/<n>.<image_format>`` glyph images; returns the class names.

    Example:
        >>> make_sample_folder("/tmp/glyphs", num_classes=3)  # doctest: +SKIP
        >>> names  # doctest: +SKIP
        ['A', 'B', 'C']
    """
    if not 1 <= num_classes <= len(_ALPHABET) * (len(_ALPHABET) + 1):
        raise ChuteError(
            f"`num_classes` must be from 1 to 1332. Received: num_classes={num_classes}"
        )
    checks.one_of("color_mode", color_mode, ("grayscale", "rgb"))
    names = [
        # Numbered once there are two-letter names: folders then sort in class order.
        class_text(i) if num_classes <= len(_ALPHABET) else f"c{i:04d}_{class_text(i)}"
        for i in range(num_classes)
    ]
    jobs = [
        (
            os.fspath(path),
            i,
            name,
            images_per_class,
            tuple(image_size),
            color_mode == "rgb",
            noise,
            seed,
            image_format,
        )
        for i, name in enumerate(names)
    ]
    if workers <= 1:
        for job in jobs:
            _write_class(job)
    else:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            list(pool.map(_write_class, jobs, chunksize=4))
    return sorted(names)
