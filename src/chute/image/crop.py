"""One stored image to the model's pixels in NumPy and OpenCV: what the Grain engine's
worker processes run, without TensorFlow.

The same operations as :mod:`chute.image.tf_ops`, with the same windows:

- **Training** (:func:`random_window` then :func:`window_pixels`): an
  Inception-style random-resized crop (an area share in ``scale``, an aspect
  ratio drawn log-uniformly in ``ratio``, ten tries, else the whole image),
  resized to the output size; :func:`place` puts it in its batch, flipped or not.
- **Evaluation** (:func:`centre_window`): the centred window of the output's
  aspect ratio over ``crop_fraction`` of the shorter side, computed as
  ``tf_ops.centre_crop`` computes it (same rounding).

In training, a JPEG is decoded at 1/2, 1/4 or 1/8 of its size (libjpeg's DCT
scaling) when the window still covers the output at that scale: most of a large
photo's decoding is skipped. JPEGs are decoded by libjpeg-turbo through ``simplejpeg``
where it is installed (the ``grain`` extra): the same pixels as OpenCV's decoder and
TensorFlow's accurate one, straight to RGB, in about two thirds of OpenCV's CPU time
(``benchmarks/README.md``); OpenCV is asked about what it refuses (a damaged file).

Evaluation (``exact``) decodes the whole image, as the tf.data engine does, and
resizes as ``tf.image.resize`` then ``round``: for bilinear (the default) and
nearest, the same float32 operations in the same order as TensorFlow's CPU kernels,
so the pixels are the tf.data engine's, bit for bit (OpenCV's float resize rounds a
pixel in ~0.1% to the next level). Bicubic, area and lanczos are OpenCV's (Keys
a=-0.75, its own area weights, Lanczos-4): several levels from TensorFlow's. Images
stored at the output size and evaluated uncropped are the stored pixels.

Example:
    >>> centre_window(256, 320, (224, 224), 0.875)
    (16, 48, 224, 224)
    >>> rng = np.random.default_rng(0)
    >>> top, left, height, width = random_window(100, 100, rng, (0.5, 1.0), (0.75, 1.33))
    >>> 0.5 * 100 * 100 <= height * width * 1.05 and top + height <= 100
    True
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from chute.image.resize import FILTERS

try:  # libjpeg-turbo with its SIMD code; OpenCV's wheel decodes the same pixels slower
    import simplejpeg
except ImportError:  # pragma: no cover - the grain extra installs it
    simplejpeg = None

cv2.setNumThreads(1)  # parallelism comes from worker processes

_REDUCED = {
    (1, 2): cv2.IMREAD_REDUCED_GRAYSCALE_2,
    (1, 4): cv2.IMREAD_REDUCED_GRAYSCALE_4,
    (1, 8): cv2.IMREAD_REDUCED_GRAYSCALE_8,
    (3, 2): cv2.IMREAD_REDUCED_COLOR_2,
    (3, 4): cv2.IMREAD_REDUCED_COLOR_4,
    (3, 8): cv2.IMREAD_REDUCED_COLOR_8,
}

Window = tuple[int, int, int, int]  # top, left, height, width


def centre_window(height: int, width: int, size: tuple[int, int], fraction: float) -> Window:
    """The centred window of ``size``'s aspect ratio covering ``fraction`` of the image's
    shorter side (as ``tf_ops.centre_crop``: rounded half to even, at least 1 pixel).

    Example:
        >>> centre_window(64, 64, (64, 64), 1.0)
        (0, 0, 64, 64)
    """
    aspect = size[1] / size[0]
    # float32, as tf_ops.centre_crop computes it: float64 would round some sizes the other way.
    window_height = np.float32(min(height, width / aspect) * fraction)
    window_width = np.float32(min(width, height * aspect) * fraction)
    # np.round: half to even, as TensorFlow rounds; int() alone would truncate.
    crop_height = max(1, int(np.round(window_height)))
    crop_width = max(1, int(np.round(window_width)))
    return (height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width


def random_window(
    height: int,
    width: int,
    rng: np.random.Generator,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> Window:
    """A random-resized crop's window: ``scale`` of the area, aspect ratio (width /
    height) in ``ratio``; the whole image when ten tries find none that fits.

    Example:
        >>> random_window(10, 10, np.random.default_rng(1), (1.0, 1.0), (1.0, 1.0))
        (0, 0, 10, 10)
    """
    area = height * width
    # Log-uniform: a ratio and its inverse (tall and wide) are equally likely.
    low, high = math.log(ratio[0]), math.log(ratio[1])
    # Ten tries, as Inception's crop: a tight scale and ratio may not fit a thin image.
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(low, high))
        crop_width = round(math.sqrt(target * aspect))
        crop_height = round(math.sqrt(target / aspect))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = int(rng.integers(0, height - crop_height + 1))
            left = int(rng.integers(0, width - crop_width + 1))
            return top, left, crop_height, crop_width
    return 0, 0, height, width


def decode(
    data: bytes,
    encoding: str,
    shape: tuple[int, int, int],
    *,
    reduce: int = 1,
) -> np.ndarray:
    """A stored image as HxWxC uint8 (RGB); a JPEG at ``1/reduce`` of its size.

    Example:
        >>> decode(bytes(12), "raw", (2, 2, 3)).shape
        (2, 2, 3)
    """
    channels = shape[2]
    if encoding == "raw":
        return np.frombuffer(data, np.uint8).reshape(shape)
    if encoding == "jpeg" and simplejpeg is not None:
        pixels = _turbo(data, channels, reduce)
        if pixels is not None:
            return pixels
    buffer = np.frombuffer(data, np.uint8)
    if reduce > 1:
        flags = _REDUCED[(channels, reduce)]
    else:
        flags = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    # IGNORE_ORIENTATION: the stored pixels as they are, as TensorFlow's decoders read them.
    pixels = cv2.imdecode(buffer, flags | cv2.IMREAD_IGNORE_ORIENTATION)
    if pixels is None:
        raise ValueError(f"a {encoding} image that does not decode")
    if channels == 1:
        return pixels.reshape(*pixels.shape[:2], 1)
    # OpenCV decodes to BGR; every other decoder in chute gives RGB.
    return cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


def _turbo(data: bytes, channels: int, reduce: int) -> np.ndarray | None:
    """A JPEG decoded by simplejpeg, as :func:`decode` returns it; None for one it refuses."""
    colorspace = "GRAY" if channels == 1 else "RGB"
    try:
        if reduce == 1:
            return simplejpeg.decode_jpeg(data, colorspace=colorspace)
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        # The least scale that keeps ceil(size / reduce): libjpeg's 1/reduce, as OpenCV's
        # IMREAD_REDUCED_* decodes it.
        pixels = simplejpeg.decode_jpeg(
            data,
            colorspace=colorspace,
            min_height=-(-height // reduce),
            min_width=-(-width // reduce),
        )
    except ValueError:  # damaged data: OpenCV decides
        return None
    if pixels.shape[:2] != (-(-height // reduce), -(-width // reduce)):
        return None  # pragma: no cover - libjpeg scales by M/8: 1/2, 1/4, 1/8 are exact
    return pixels


def window_pixels(
    data: bytes,
    encoding: str,
    shape: tuple[int, int, int],
    window: Window,
    size: tuple[int, int],
    interpolation: str = "bilinear",
    *,
    exact: bool = True,
) -> np.ndarray:
    """The ``window`` of a stored image resized to ``size``: HxWxC uint8. With
    ``exact=False`` (training) a JPEG is decoded at the smallest DCT scale that still
    covers ``size`` with the window, and uint8 is resampled directly (faster; within a
    level or two of the exact pixels); ``exact`` gives ``tf_ops.centre_crop``'s pixels.

    Example:
        >>> pixels = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
        >>> window_pixels(pixels.tobytes(), "raw", (4, 4, 3), (1, 1, 2, 2), (2, 2)).shape
        (2, 2, 3)
    """
    top, left, height, width = window
    reduce = 1
    if encoding == "jpeg" and not exact:  # a scaled decode is not the whole one, resized
        # The largest reduction that still covers the output: least decoding, no upscaling.
        for factor in (8, 4, 2):
            if height // factor >= size[0] and width // factor >= size[1]:
                reduce = factor
                break
    pixels = decode(data, encoding, shape, reduce=reduce)
    if reduce > 1:  # the window in the reduced image (libjpeg rounds sizes up)
        top, left = top // reduce, left // reduce
        height, width = height // reduce, width // reduce
    pixels = pixels[top : top + height, left : left + width]
    return resized(pixels, size, interpolation, exact=exact)


def resized(
    pixels: np.ndarray, size: tuple[int, int], interpolation: str, *, exact: bool = True
) -> np.ndarray:
    """HxWxC uint8 at ``size`` (the same array when it is already), resampled as
    ``tf.image.resize`` then ``round``: bit for bit for bilinear and nearest, OpenCV's
    float32 filter for the others (``exact=False``: OpenCV's fixed-point arithmetic on
    uint8, faster, within a level or two).

    Example:
        >>> resized(np.full((4, 4, 1), 7, np.uint8), (2, 2), "bilinear")[..., 0]
        array([[7, 7],
               [7, 7]], dtype=uint8)
    """
    if pixels.shape[:2] == tuple(size):
        return pixels
    channels = pixels.shape[2]
    if exact and interpolation == "bilinear":
        return _bilinear(pixels, size)
    if exact and interpolation == "nearest":
        rows, cols = _nearest(size[0], pixels.shape[0]), _nearest(size[1], pixels.shape[1])
        return pixels[rows][:, cols]
    if not exact:
        out = cv2.resize(pixels, (size[1], size[0]), interpolation=FILTERS[interpolation])
        return out.reshape(size[0], size[1], channels)
    out = cv2.resize(
        pixels.astype(np.float32),
        (size[1], size[0]),
        interpolation=FILTERS[interpolation],
    )
    # Clipped: bicubic and lanczos overshoot past 0 and 255 near edges.
    out = np.clip(np.round(out), 0, 255).astype(np.uint8)
    return out.reshape(size[0], size[1], channels)


def place(image: np.ndarray, out: np.ndarray, *, flip: bool = False) -> None:
    """Copies HxWxC ``image`` into ``out`` (a batch's slot), mirrored left-right when
    ``flip``. OpenCV mirrors a 224x224 RGB image in ~8 microseconds; NumPy's copy of
    ``image[:, ::-1]`` walks it 3 bytes at a time (~340).

    Example:
        >>> out = np.zeros((1, 3, 1), np.uint8)
        >>> place(np.arange(3, dtype=np.uint8).reshape(1, 3, 1), out, flip=True)
        >>> out[..., 0].tolist()
        [[2, 1, 0]]
    """
    if not flip:
        out[...] = image
        return
    written = cv2.flip(np.ascontiguousarray(image), 1, dst=out)
    if not np.shares_memory(written, out):  # pragma: no cover - OpenCV took another layout
        out[...] = written.reshape(out.shape)


# TensorFlow's resize kernels (tensorflow/core/kernels/image/resize_{bilinear,nearest_
# neighbor}_op.cc, half-pixel centres), step by step in float32 as they compute.


def _bilinear(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``tf.image.resize(pixels, size)`` (bilinear), rounded to uint8."""
    rows, cols = _half_pixel(size[0], pixels.shape[0]), _half_pixel(size[1], pixels.shape[1])
    image = pixels.astype(np.float32)
    x_lerp = cols[2][None, :, None]

    def along_x(lines: np.ndarray) -> np.ndarray:
        left, right = lines[:, cols[0]], lines[:, cols[1]]
        return left + (right - left) * x_lerp

    top, bottom = along_x(image[rows[0]]), along_x(image[rows[1]])
    out = top + (bottom - top) * rows[2][:, None, None]
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def _half_pixel(out: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear sampling along one axis of ``size`` pixels resized to ``out``: each output
    pixel's lower and upper source pixel and the upper one's weight."""
    scale = np.float32(size) / np.float32(out)
    position = (np.arange(out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(position)
    # Clamped at the borders, as TensorFlow's kernel: the first half pixel repeats the edge.
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(position).astype(np.int64), size - 1)
    return lower, upper, position - floor


def _nearest(out: int, size: int) -> np.ndarray:
    """Nearest sampling along one axis: each output pixel's source pixel."""
    scale = np.float32(size) / np.float32(out)
    position = (np.arange(out, dtype=np.float32) + np.float32(0.5)) * scale
    return np.minimum(np.floor(position).astype(np.int64), size - 1)
