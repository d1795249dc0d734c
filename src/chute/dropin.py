"""``chute.image_dataset_from_directory``: Keras's loader, one import away, faster and safer.

Same arguments, defaults, results and errors as
``keras.utils.image_dataset_from_directory`` (files are listed, shuffled and
split by Keras's own ``dataset_utils``, and images are decoded and resized with
the same TensorFlow ops, so ``class_names``, ``file_paths``, order and pixels
match). The pipeline differs where it does not change the results: paths are
shuffled before decoding rather than decoded images afterwards, images are
decoded up to 32 per tf.data call (one per call with ``skip_corrupt``),
decoding runs out of order when the data is shuffled anyway, and tf.data's autotuning
model is off (deleting an iterator could wait on it for up to a second).
Three extras are off by default: ``skip_corrupt`` (skip files that fail to
decode instead of stopping), ``drop_remainder`` (static batch shapes for
TPU/XLA) and ``cache`` (``"memory"`` or a file path, as
``tf.data.Dataset.cache``).

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
import logging

import numpy as np

from chute import lean
from chute.workers import default_workers

log = logging.getLogger(__name__)
_GROUP = 32  # images decoded per call at most (see _Builder.load_group)
_IN_FLIGHT = 512  # images the parallel calls hold at once at most (two batches of 256)

ALLOWLIST_FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
_INTERPOLATIONS = (
    "bilinear",
    "nearest",
    "bicubic",
    "area",
    "lanczos3",
    "lanczos5",
    "gaussian",
    "mitchellcubic",
)


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
            of raising an error mid-epoch.
        drop_remainder: drop the last partial batch, so every batch has a
            static shape (TPU/XLA).
        cache: ``"memory"`` or a file path: keep decoded images after the
            first epoch (``tf.data.Dataset.cache``).

    Returns:
        A dataset with ``class_names`` and ``file_paths``, or a
        ``(train, validation)`` pair with ``subset="both"``.
    """
    from keras.src.backend.config import standardize_data_format
    from keras.src.utils import dataset_utils

    if labels not in ("inferred", None):
        if not isinstance(labels, list | tuple):
            raise ValueError(
                "`labels` argument should be a list/tuple of integer labels, of the same size "
                "as the number of image files in the target directory. If you wish to infer "
                'the labels from the subdirectory names in the target directory, pass `labels="'
                'inferred"`. If you wish to get a dataset that only contains images (no labels), '
                f"pass `labels=None`. Received: labels={labels}"
            )
        if class_names:
            raise ValueError(
                'You can only pass `class_names` if `labels="inferred"`. '
                f"Received: labels={labels}, and class_names={class_names}"
            )
    if label_mode not in {"int", "categorical", "binary", None}:
        raise ValueError(
            '`label_mode` argument must be one of "int", "categorical", "binary", or None. '
            f"Received: label_mode={label_mode}"
        )
    if labels is None or label_mode is None:
        labels = label_mode = None
    channels = {"rgb": 3, "rgba": 4, "grayscale": 1}.get(color_mode)
    if channels is None:
        raise ValueError(
            '`color_mode` must be one of {"rgb", "rgba", "grayscale"}. '
            f"Received: color_mode={color_mode}"
        )
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    elif not isinstance(image_size, list | tuple) or len(image_size) != 2:
        raise ValueError(
            "Invalid `image_size` value. Expected a tuple of 2 integers. "
            f"Received: image_size={image_size}"
        )
    interpolation = interpolation.lower()
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(
            f"Argument `interpolation` should be one of {_INTERPOLATIONS}. "
            f"Received: interpolation={interpolation}"
        )
    if crop_to_aspect_ratio and pad_to_aspect_ratio:
        raise ValueError(
            "Only one of `pad_to_aspect_ratio`, `crop_to_aspect_ratio` can be set to `True`."
        )
    if format not in ("tf", "grain"):
        raise ValueError(f'`format` should be either "tf" or "grain". Received: format={format}')
    if format == "grain":  # a different kind of dataset: Keras's own
        if skip_corrupt or drop_remainder or cache is not None:
            raise ValueError(
                "skip_corrupt, drop_remainder and cache apply to format='tf' datasets only"
            )
        import keras

        return keras.utils.image_dataset_from_directory(
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
    if cache is not None and not isinstance(cache, str):
        raise ValueError(f'`cache` must be None, "memory" or a file path. Received: cache={cache}')
    dataset_utils.check_validation_split_arg(validation_split, subset, shuffle, seed)

    if seed is None:
        seed = np.random.randint(1e6)
    paths, labels, class_names = dataset_utils.index_directory(
        directory,
        labels,
        formats=ALLOWLIST_FORMATS,
        class_names=class_names,
        shuffle=shuffle,
        seed=seed,
        follow_links=follow_links,
        verbose=verbose,
    )
    if label_mode == "binary" and len(class_names) != 2:
        raise ValueError(
            'When passing `label_mode="binary"`, there must be exactly 2 class_names. '
            f"Received: class_names={class_names}"
        )
    data_format = standardize_data_format(data_format=data_format)
    build = _Builder(
        image_size=tuple(image_size),
        channels=channels,
        label_mode=label_mode,
        num_classes=len(class_names) if class_names else 0,
        interpolation=interpolation,
        data_format=data_format,
        crop=crop_to_aspect_ratio,
        pad=pad_to_aspect_ratio,
        batch_size=batch_size,
        seed=seed,
        skip_corrupt=skip_corrupt,
        drop_remainder=drop_remainder,
        cache=cache,
    )
    if subset == "both":
        parts = []
        for name in ("training", "validation"):
            part_paths, part_labels = dataset_utils.get_training_or_validation_split(
                paths, labels, validation_split, name
            )
            if not part_paths:
                kind = "training" if name == "training" else "validation"
                raise ValueError(
                    f"No {kind} images found in directory {directory}. "
                    f"Allowed formats: {ALLOWLIST_FORMATS}"
                )
            parts.append(build(part_paths, part_labels, shuffle and name == "training"))
        for part in parts:
            part.class_names = class_names
        return parts
    paths, labels = dataset_utils.get_training_or_validation_split(
        paths, labels, validation_split, subset
    )
    if not paths:
        raise ValueError(
            f"No images found in directory {directory}. Allowed formats: {ALLOWLIST_FORMATS}"
        )
    dataset = build(paths, labels, shuffle)
    dataset.class_names = class_names
    return dataset


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
    seed: int
    skip_corrupt: bool
    drop_remainder: bool
    cache: str | None

    def load_image(self, path):
        import tensorflow as tf

        # The same ops as Keras's loader, so the pixels are the same.
        image = tf.image.decode_image(
            tf.io.read_file(path), channels=self.channels, expand_animations=False
        )
        height, width = self.image_size
        if self.crop:
            from keras.src.backend import tensorflow as tf_backend
            from keras.src.utils import image_utils

            image = image_utils.smart_resize(
                image,
                self.image_size,
                interpolation=self.interpolation,
                data_format="channels_last",
                backend_module=tf_backend,
            )
        elif self.pad:
            image = tf.image.resize_with_pad(image, height, width, method=self.interpolation)
        else:
            image = tf.image.resize(image, self.image_size, method=self.interpolation)
        image.set_shape((height, width, self.channels))
        if self.data_format == "channels_first":
            image = tf.transpose(image, (2, 0, 1))
        return image

    def load_group(self, paths, labels=None):
        """``load_image`` over a group of paths in one call: tf.data's cost per
        call (tens of µs here) is paid once per group rather than per image.
        One image at a time within the group, so no more full-size decoded
        images are held than with one image per call; groups run in parallel."""
        import tensorflow as tf

        images = tf.map_fn(
            self.load_image, paths, fn_output_signature=self.image_spec, parallel_iterations=1
        )
        return images if labels is None else (images, labels)

    @functools.cached_property
    def image_spec(self):
        """What ``load_image`` returns: float32, or uint8 with ``nearest`` (as Keras)."""
        import tensorflow as tf

        traced = tf.function(self.load_image, autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.string)
        )
        return tf.TensorSpec.from_tensor(traced.structured_outputs)

    def __call__(self, paths, labels, shuffle):
        import tensorflow as tf
        from keras.src.utils import dataset_utils

        dataset = tf.data.Dataset.from_tensor_slices(paths)
        if self.label_mode:
            label_ds = dataset_utils.labels_to_dataset_tf(labels, self.label_mode, self.num_classes)
            dataset = tf.data.Dataset.zip((dataset, label_ds))
        if shuffle and self.cache is None:
            # shuffling paths is cheap: the whole list, before anything is decoded
            dataset = dataset.shuffle(len(paths), seed=self.seed)
        # A call per core. Shuffled data has no order to keep: let finished
        # images overtake slow ones.
        cores = default_workers()
        parallel = {"num_parallel_calls": cores, "deterministic": not shuffle}
        if self.skip_corrupt:  # one image per call, so a bad file costs only itself
            load = self.load_image
            fn = (lambda path, label: (load(path), label)) if self.label_mode else load
            dataset = dataset.map(fn, **parallel).ignore_errors(log_warning=True)
        else:
            grouped = dataset.batch(_group_size(cores)).map(self.load_group, **parallel)
            dataset = lean.split(tf, grouped)
        if self.cache is not None:
            # decoded images are cached, and shuffled afresh every epoch after that
            dataset = dataset.cache("" if self.cache == "memory" else self.cache)
            if shuffle:
                dataset = dataset.shuffle(len(paths), seed=self.seed)
        if self.batch_size is not None:
            dataset = dataset.batch(self.batch_size, drop_remainder=self.drop_remainder)
        options = tf.data.Options()
        options.experimental_optimization.parallel_batch = True  # batches copied in parallel
        # No autotuning model: the decoding calls are sized above, and the
        # prefetch buffer grows while the consumer waits. The model cost ~5% of
        # a pass here, and deleting an iterator (each epoch) waited for it, up
        # to a second in our benchmark runs.
        options.autotune.enabled = False
        dataset = dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
        dataset.file_paths = list(paths)
        return dataset
