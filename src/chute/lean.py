"""Three tf.data transformations without the overhead of their public wrappers.

``chute.load`` builds a new pipeline for every call (and one per input
pipeline under a strategy), so what it costs to build counts on a short first
epoch. Three public constructors do more than chute needs:

- ``tf.data.TFRecordDataset(path)`` wraps the reader of one file in a
  ``flat_map`` over a one-name list: one more function to trace and run per shard;
- ``Dataset.rebatch`` and ``Dataset.unbatch`` put a ``map`` in front that turns
  sparse and ragged parts into dense ones: a function traced (several
  milliseconds) and called per element, for datasets that are dense anyway.

Each is used directly where this TensorFlow has the class or op this code knows
(TensorFlow 2.16-2.21 do), and the public method otherwise; tests check that
both give the same elements.

Example:
    >>> blocks = regroup(tf, dataset_of_dense_batches, 256)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import inspect


def tfrecords(tf, path):
    """The records of one TFRecord file (``tf.data.TFRecordDataset(path)``)."""
    return _one_file_reader(tf)(path)


def regroup(tf, dataset, size: int):
    """``dataset.rebatch(size)`` for a dataset of dense tensors."""
    op = _rebatch_op(tf)
    if op is None:
        return dataset.rebatch(size, drop_remainder=False)
    return _regrouped_class(tf)(dataset, size, op)


def split(tf, dataset):
    """``dataset.unbatch()`` for a dataset of dense tensors."""
    unbatched = _unbatch_class(tf)
    return dataset.unbatch() if unbatched is None else unbatched(dataset)


@functools.cache
def _one_file_reader(tf):
    try:
        from tensorflow.python.data.ops.readers import _TFRecordDataset
    except ImportError:
        return tf.data.TFRecordDataset
    params = inspect.signature(_TFRecordDataset).parameters
    if "filenames" not in params or not issubclass(_TFRecordDataset, tf.data.Dataset):
        return tf.data.TFRecordDataset  # not the class this code knows
    return _TFRecordDataset


@functools.cache
def _rebatch_op(tf):
    try:
        from tensorflow.python.data.ops import dataset_ops  # noqa: F401
        from tensorflow.python.ops.gen_experimental_dataset_ops import rebatch_dataset_v2
    except ImportError:
        return None
    params = inspect.signature(rebatch_dataset_v2).parameters
    if not {"input_dataset", "batch_sizes", "drop_remainder", "output_types"} <= set(params):
        return None  # not the op this code knows
    return rebatch_dataset_v2


@functools.cache
def _regrouped_class(tf):
    from tensorflow.python.data.ops import dataset_ops

    class Regrouped(dataset_ops.UnaryDataset):
        """The elements of ``dataset`` (dense batches) cut again into batches of ``size``."""

        def __init__(self, dataset, size, op):
            self._spec = tf.nest.map_structure(
                lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype), dataset.element_spec
            )
            variant = op(
                dataset._variant_tensor,
                batch_sizes=tf.constant([size], tf.int64),
                drop_remainder=tf.constant(False),
                **self._flat_structure,
            )
            super().__init__(dataset, variant)

        @property
        def element_spec(self):
            return self._spec

    return Regrouped


@functools.cache
def _unbatch_class(tf):
    try:
        from tensorflow.python.data.ops.unbatch_op import _UnbatchDataset
    except ImportError:
        return None
    if "input_dataset" not in inspect.signature(_UnbatchDataset).parameters:
        return None  # not the class this code knows
    return _UnbatchDataset
