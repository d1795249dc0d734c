"""One stored image to the model's pixels: decode, crop and resize, in TensorFlow ops.

Used per image by ``chute.load`` when images are cropped (training's
random-resized crop, evaluation's centre crop) or stored at other sizes, and by
``chute.predict``, so that a file predicted on gets exactly the pixels its
record gets in evaluation. This is the TensorFlow part of :mod:`chute.image`;
what prepares an image before it is stored (:mod:`chute.image.decode`) never
imports TensorFlow.

- **Training** (:func:`random_crop`): an Inception-style random-resized crop
  (a window of ``scale`` of the image's area and ``ratio`` aspect, drawn by
  ``stateless_sample_distorted_bounding_box``) decoded alone
  (``decode_and_crop_jpeg``: only the window's blocks are decoded), resized
  to the output size, and flipped left-right half of the time, on uint8.
- **Evaluation and predict** (:func:`centre_crop`): the centred window of the
  output's aspect ratio covering ``crop_fraction`` of the image's shorter
  side (of the image decoded whole: the same pixels as any decoder's, the
  Grain engine's included), resized to the output size. With ``crop_fraction=1`` and an image
  already at the output size, the pixels are the stored ones.

Random choices are stateless ops keyed by a per-image key, so the same seed
gives the same crops whatever the number of cores.

Example:
    >>> pixels = centre_crop(record_bytes, stored_spec, (224, 224), 0.875)  # doctest: +SKIP
"""

from __future__ import annotations

from chute.format.spec import ImageSpec
from chute.lazy import tf

# libjpeg's accurate integer DCT: TensorFlow's default is the fast one, whose pixels differ
# by a few levels from every other decoder's (Pillow's, OpenCV's: the Grain engine's and
# predict's); with this one the engines and predict decode a JPEG to the same pixels.
DCT_METHOD = "INTEGER_ACCURATE"
# chute's interpolation names -> tf.image.resize's
RESIZE_METHODS = {
    "nearest": "nearest",
    "bilinear": "bilinear",
    "bicubic": "bicubic",
    "area": "area",
    "lanczos": "lanczos3",
}


def image_shape(data, stored: ImageSpec):
    """``[height, width, channels]`` (int32) of one stored image, without decoding it
    when the header tells (JPEG) or the spec does (raw)."""
    if stored.encoding == "jpeg":
        # From the header alone: the crop window is known before anything is decoded.
        return tf.image.extract_jpeg_shape(data)
    if stored.encoding == "raw":
        return tf.constant(stored.shape, tf.int32)
    return tf.shape(decode(data, stored))


def random_crop(data, stored: ImageSpec, size, key, *, scale, ratio, flip: bool):
    """A random-resized crop of one stored image, decoded, resized to ``size`` and
    (with ``flip``) flipped left-right half of the time; uint8.

    Args:
        data: the record's image bytes.
        stored: how the dataset stores images.
        size: ``(height, width)`` of the result.
        key: an int64 scalar: the image's random choices are keyed by it.
        scale: ``(min, max)`` share of the image's area the window covers.
        ratio: ``(min, max)`` aspect ratio (width / height) of the window.
        flip: also flip left-right, half of the time.
    """
    shape = image_shape(data, stored)
    begin, window, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=tf.stack([key, tf.constant(0, tf.int64)]),
        min_object_covered=scale[0],
        aspect_ratio_range=ratio,
        area_range=scale,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    image = _decode_window(data, stored, begin[0], begin[1], window[0], window[1])
    image = _resized(image, size, stored)
    if flip:
        image = tf.image.stateless_random_flip_left_right(
            image, seed=tf.stack([key, tf.constant(1, tf.int64)])
        )
    return image


def centre_crop(data, stored: ImageSpec, size, crop_fraction: float):
    """The centred window of ``size``'s aspect ratio over ``crop_fraction`` of the
    image's shorter side, decoded and resized to ``size``; uint8."""
    shape = image_shape(data, stored)
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    aspect = size[1] / size[0]
    # the largest window of the output's aspect ratio, then crop_fraction of it
    window_height = tf.minimum(height, width / aspect) * crop_fraction
    window_width = tf.minimum(width, height * aspect) * crop_fraction
    crop_height = tf.maximum(1, tf.cast(tf.round(window_height), tf.int32))
    crop_width = tf.maximum(1, tf.cast(tf.round(window_width), tf.int32))
    top, left = (shape[0] - crop_height) // 2, (shape[1] - crop_width) // 2
    # Decoded whole, then sliced: a JPEG's window decoded alone differs at its edges (the
    # colour planes are upsampled without their neighbours), and evaluation's pixels must
    # be those of any decoder (the Grain engine's, predict's).
    whole = decode(data, stored)
    image = tf.slice(whole, tf.stack([top, left, 0]), tf.stack([crop_height, crop_width, -1]))
    return _resized(image, size, stored)


def decode(data, stored: ImageSpec):
    """One stored image, decoded whole."""
    if stored.encoding == "raw":
        return tf.reshape(tf.io.decode_raw(data, tf.uint8), stored.shape)
    if stored.encoding == "png":
        return tf.io.decode_png(data, channels=stored.channels)
    return tf.io.decode_jpeg(data, channels=stored.channels, dct_method=DCT_METHOD)


def _decode_window(data, stored: ImageSpec, top, left, height, width):
    """Only the window of a JPEG is decoded; other images are decoded, then sliced."""
    if stored.encoding == "jpeg":
        window = tf.stack([top, left, height, width])
        return tf.image.decode_and_crop_jpeg(
            data, window, channels=stored.channels, dct_method=DCT_METHOD
        )
    return tf.slice(decode(data, stored), tf.stack([top, left, 0]), tf.stack([height, width, -1]))


def _resized(image, size, stored: ImageSpec):
    """``image`` at ``size`` (untouched when it is already), rounded back to uint8."""
    height, width = size
    shape = tf.shape(image)

    def resize():
        method = RESIZE_METHODS[stored.interpolation]
        resized = tf.image.resize(image, (height, width), method=method)
        return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)

    same = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))
    # At the output size already: the stored pixels as they are, no resampling.
    image = tf.cond(same, lambda: image, resize)
    return tf.ensure_shape(image, (height, width, stored.channels))
