"""``chute.image_dataset_from_directory``: Keras's loader, one import away, faster and safer.

Same arguments, defaults, results and errors as
``keras.utils.image_dataset_from_directory``: Keras's own public function
checks the arguments, lists, shuffles and splits the files (and prints what it
found), so ``class_names``, ``file_paths``, order and errors match; images are
decoded and resized with the same TensorFlow ops, so the pixels match, and the
paths are shuffled with Keras's buffer size and seed, so with ``shuffle=True``
and a seed the batches come in Keras's order. The pipeline differs where it
does not change the results: images are decoded up to 32 per tf.data call (one
per call with ``skip_corrupt``) and tf.data's autotuning model is off. Three
extras are off by default: ``skip_corrupt`` (skip files that fail to decode
instead of stopping), ``drop_remainder`` (static batch shapes for TPU/XLA) and
``cache`` (``"memory"`` or a file path, as ``tf.data.Dataset.cache``).

Example:
    >>> # from keras.utils import image_dataset_from_directory
    >>> from chute import image_dataset_from_directory  # doctest: +SKIP
    >>> train, val = image_dataset_from_directory(
    ...     "flowers", validation_split=0.2, subset="both", seed=1, image_size=(180, 180)
    ... )  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from chute.format import storage
from chute.lazy import keras, tf
from chute.machine import available_cores

_GROUP = 32  # images decoded per call at most (see _Builder.load_group)
_IN_FLIGHT = 512  # images the parallel calls hold at once at most (two batches of 256)
ALLOWLIST_FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")  # as Keras's loader


def image_dataset_from_directory(
    directory,
    labels="inferred",
    label_mode="int",
    class_names=None,
    color_mode="rgb",
    batch_size=32,
    image_size=(256, 256),
    shuffle=True,
    seed=None,
    validation_split=None,
    subset=None,
    interpolation="bilinear",
    follow_links=False,
    crop_to_aspect_ratio=False,
    pad_to_aspect_ratio=False,
    data_format=None,
    format="tf",
    verbose=True,
    *,
    skip_corrupt=False,
    drop_remainder=False,
    cache=None,
):
    """Generates a ``tf.data.Dataset`` from image files in a directory, as Keras does.

    See ``keras.utils.image_dataset_from_directory`` for every argument up to
    ``verbose``. Extras (keyword only, off by default):

    Args:
        skip_corrupt: skip images that fail to read or decode (logged) instead
            of raising an error mid-epoch. How many remain is known only once
            read, so the dataset has no ``len()`` (its cardinality is unknown).
        drop_remainder: drop the last partial batch, so every batch has a
            static shape (TPU/XLA).
        cache: ``"memory"`` or a file path: keep decoded images after the
            first epoch (``tf.data.Dataset.cache``); shuffled data are then
            shuffled after the cache, each epoch, with Keras's buffer size (the
            order is then not Keras's, and memory holds that buffer, not the
            dataset).

    Returns:
        A dataset with ``class_names`` and ``file_paths``, or a
        ``(train, validation)`` pair with ``subset="both"``.
    """
    # ValueError, not ChuteError: the drop-in raises what Keras's loader raises.
    if cache is not None and not isinstance(cache, str):
        raise ValueError(f'`cache` must be None, "memory" or a file path. Received: cache={cache}')
    if format == "grain" and (skip_corrupt or drop_remainder or cache is not None):
        raise ValueError(
            "skip_corrupt, drop_remainder and cache apply to format='tf' datasets only"
        )
    if seed is None and not (validation_split and shuffle):
        # Keras draws one as well; drawn here, this pipeline shuffles as Keras's does.
        # (With validation_split, Keras asks for a seed: its error is kept.)
        seed = np.random.randint(1e6)
    listed = keras.utils.image_dataset_from_directory(
        directory,
        labels,
        label_mode,
        class_names,
        color_mode,
        batch_size,
        image_size,
        shuffle,
        seed,
        validation_split,
        subset,
        interpolation,
        follow_links,
        crop_to_aspect_ratio,
        pad_to_aspect_ratio,
        data_format,
        format,
        verbose,
    )
    if format == "grain":  # a different kind of dataset: Keras's own
        return listed
    # Either None means no labels, as in Keras's loader.
    if labels is None or label_mode is None:
        labels = label_mode = None
    parts = listed if isinstance(listed, list) else [listed]
    names = parts[0].class_names
    label_of = _labeller(directory, labels, names, follow_links)
    build = _Builder(
        image_size=(image_size, image_size) if isinstance(image_size, int) else tuple(image_size),
        channels={"rgb": 3, "rgba": 4, "grayscale": 1}[color_mode],
        label_mode=label_mode,
        num_classes=len(names) if names else 0,
        interpolation=interpolation.lower(),
        data_format=data_format or keras.config.image_data_format(),
        crop=crop_to_aspect_ratio,
        pad=pad_to_aspect_ratio,
        batch_size=batch_size,
        seed=seed,
        skip_corrupt=skip_corrupt,
        drop_remainder=drop_remainder,
        cache=cache,
    )
    datasets = []
    for number, part in enumerate(parts):
        # with subset="both", Keras shuffles the training part only
        shuffled = shuffle and number == 0
        paths = list(part.file_paths)
        dataset = build(paths, [label_of(p) for p in paths] if label_mode else None, shuffled)
        dataset.class_names = names
        dataset.file_paths = paths
        datasets.append(dataset)
    return datasets if isinstance(listed, list) else datasets[0]


def _labeller(directory, labels, class_names, follow_links):
    """``path -> label`` for the files Keras listed.

    Inferred labels come from a file's class folder. A list of labels belongs,
    as Keras documents, to the image files in the alphanumeric order that
    ``os.walk(directory)`` gives them.
    """
    directory = os.fspath(directory)
    if labels == "inferred":
        index = {name: i for i, name in enumerate(class_names)}
        prefix = len(os.path.join(directory, ""))
        # The first folder under the directory is the class; "\\" for Windows paths.
        return lambda path: index[path[prefix:].replace("\\", "/").split("/", 1)[0]]
    if labels is None:
        return lambda path: None
    if storage.is_local(directory):
        walk = os.walk(directory, followlinks=follow_links)
        join = os.path.join
    else:
        walk, join = storage.walk(directory), storage.join
    files = [
        join(root, name)
        # Sorted, as Keras documents: a list of labels follows the alphanumeric order of os.walk.
        for root, _, names in sorted(walk, key=lambda entry: entry[0])
        for name in sorted(names)
        if name.lower().endswith(ALLOWLIST_FORMATS)
    ]
    return dict(zip(files, labels, strict=True)).__getitem__


def _group_size(cores: int) -> int:
    """Images decoded per call: up to ``_GROUP``, fewer on many cores, so that
    the calls running at once (one per core) hold at most ``_IN_FLIGHT``
    (beyond that many cores, one image per call, as Keras's loader)."""
    return max(1, min(_GROUP, _IN_FLIGHT // max(1, cores)))


@dataclasses.dataclass(frozen=True)
class _Builder:
    """Builds the tf.data pipeline for one list of files."""

    image_size: tuple[int, int]
    channels: int
    label_mode: str | None
    num_classes: int
    interpolation: str
    data_format: str
    crop: bool
    pad: bool
    batch_size: int | None
    seed: int | None
    skip_corrupt: bool
    drop_remainder: bool
    cache: str | None

    def load_image(self, path):
        """One image, as Keras's loader makes it (the same ops, so the same pixels)."""
        image = tf.image.decode_image(
            tf.io.read_file(path), channels=self.channels, expand_animations=False
        )
        height, width = self.image_size
        if self.crop:
            image = tf.image.resize(_centre_crop(image, self.image_size), self.image_size,
                                    method=self.interpolation)  # fmt: skip
        elif self.pad:
            image = tf.image.resize_with_pad(image, height, width, method=self.interpolation)
        else:
            image = tf.image.resize(image, self.image_size, method=self.interpolation)
        # decode_image leaves the shape unknown to tf.data: stated here, as Keras does.
        image.set_shape((height, width, self.channels))
        if self.data_format == "channels_first":
            image = tf.transpose(image, (2, 0, 1))
        return image

    def load_group(self, paths, labels=None):
        """``load_image`` over a group of paths in one call: tf.data's cost per
        call is paid once per group rather than per image. One image at a time
        within the group, so no more full-size decoded images are held than
        with one image per call; groups run in parallel."""
        # parallel_iterations=1: one full-size decoded image at a time within the group.
        images = tf.map_fn(
            self.load_image, paths, fn_output_signature=self.image_spec, parallel_iterations=1
        )
        return images if labels is None else (images, labels)

    @functools.cached_property
    def image_spec(self):
        """What ``load_image`` returns: float32, or uint8 with ``nearest`` (as Keras)."""
        # Traced rather than written down: the dtype depends on the interpolation, as in Keras.
        traced = tf.function(self.load_image, autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.string)
        )
        return tf.TensorSpec.from_tensor(traced.structured_outputs)

    def labels(self, labels):
        """Labels as Keras encodes them: int32, one-hot float32, or float32 (N, 1)."""
        ds = tf.data.Dataset.from_tensor_slices(np.asarray(labels, np.int32))
        if self.label_mode == "binary":
            return ds.map(lambda x: tf.expand_dims(tf.cast(x, tf.float32), -1))
        if self.label_mode == "categorical":
            return ds.map(lambda x: tf.one_hot(x, self.num_classes))
        return ds

    def __call__(self, paths, labels, shuffle):
        # Keras's shuffle buffer and seed over the same paths: the same order as its loader.
        buffer = self.batch_size * 8 if self.batch_size is not None else 1024
        ds = tf.data.Dataset.from_tensor_slices(paths)
        if labels is not None:
            ds = tf.data.Dataset.zip((ds, self.labels(labels)))
        # Paths are shuffled before anything is decoded (cheap); with a cache, decoded
        # images are shuffled anew each epoch after it.
        if shuffle and self.cache is None:
            ds = ds.shuffle(buffer, seed=self.seed)
        # A call per core, in order: with Keras's shuffle and seed before it, the
        # order is Keras's own.
        cores = available_cores()
        parallel = {"num_parallel_calls": cores, "deterministic": True}
        if self.skip_corrupt:  # one image per call, so a bad file costs only itself
            load = self.load_image
            fn = (lambda path, label: (load(path), label)) if labels is not None else load
            ds = ds.map(fn, **parallel).ignore_errors(log_warning=True)
        else:
            ds = ds.batch(_group_size(cores)).map(self.load_group, **parallel).unbatch()
            # unbatch() forgets the count, and without it len() raises a TypeError where
            # Keras's dataset gives its number of batches: one image per path, always.
            ds = ds.apply(tf.data.experimental.assert_cardinality(len(paths)))
        if self.cache is not None:
            ds = ds.cache("" if self.cache == "memory" else self.cache)
            if shuffle:
                ds = ds.shuffle(buffer, seed=self.seed)
        if self.batch_size is not None:
            ds = ds.batch(self.batch_size, drop_remainder=self.drop_remainder)
        options = tf.data.Options()
        options.experimental_optimization.parallel_batch = True  # batches copied in parallel
        # No autotuning model: the decoding calls are sized above, and the prefetch
        # buffer grows while the consumer waits; deleting an iterator (each epoch)
        # waits for the model.
        options.autotune.enabled = False
        return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def _centre_crop(image, size):
    """The centred window of ``size``'s aspect ratio, computed as Keras's ``smart_resize`` does."""
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    target_height, target_width = size
    crop_height = tf.cast(tf.cast(width * target_height, tf.float32) / target_width, tf.int32)
    crop_height = tf.maximum(tf.minimum(height, crop_height), 1)
    crop_width = tf.cast(tf.cast(height * target_width, tf.float32) / target_height, tf.int32)
    crop_width = tf.maximum(tf.minimum(width, crop_width), 1)
    top = tf.cast(tf.cast(height - crop_height, tf.float32) / 2, tf.int32)
    left = tf.cast(tf.cast(width - crop_width, tf.float32) / 2, tf.int32)
    return image[top : top + crop_height, left : left + crop_width, :]
