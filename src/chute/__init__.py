"""chute keeps TPUs and GPUs fed.

Image-classification datasets (class folders, CSV lists, arrays,
``keras.datasets``) become verified, sharded TFRecord files with a manifest,
read back by a fast tf.data pipeline and trained on under any
``tf.distribute`` strategy. The public API is this facade over the stages:

- ``chute.format``: the on-disk contract (record schema and framing, the
  manifest and its one ``ImageSpec``, model bundles, storage);
- ``chute.image``: image preparation shared by the converter's workers, the
  reader and predict (decode, orientation, colour mode, resize, encode);
- ``chute.ingest``: ``convert`` (sources, split, decode/encode workers, shard
  writer, resume);
- ``chute.read``: ``load`` and its ``LoadOptions`` over two engines, ``tf`` (the
  tf.data pipeline: plan, shard reader, batches, augmentation, the tf.data service)
  and ``grain`` (batches by number over ``chute.read.grain.source``, records by
  number), the ``image_dataset_from_directory`` drop-in;
- ``chute.fit``: ``train`` (config, strategy, models, run directory, the
  multi-worker loop), ``evaluate``, ``predict``, ``export``;
- ``chute.tools``: ``inspect``, ``verify``, ``index`` (record indexes for a dataset
  converted without them), reports, samples, the demo and ``bench``.

(The convert and train stages are ``ingest`` and ``fit``: a subpackage named
``chute.convert`` would replace the ``chute.convert`` function on this module
when first imported.) Heavy modules (TensorFlow) load on first use, so
``import chute`` and ``chute --help`` are instant.

Example:
    >>> import chute
    >>> result = chute.convert("./Images_with_noise", "./kn-shards", image_size=75,
    ...                        color_mode="grayscale", val_fraction=0.01)  # doctest: +SKIP
    >>> chute.verify("./kn-shards").ok  # doctest: +SKIP
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ChuteError": "chute.errors",
    "ConvertOptions": "chute.ingest.options",
    "ConvertResult": "chute.ingest.convert",
    "convert": "chute.ingest.convert",
    "ImageSpec": "chute.format.spec",
    "Manifest": "chute.format.manifest",
    "load_manifest": ("chute.format.manifest", "load"),
    "inspect": "chute.tools.inspect",
    "verify": "chute.tools.verify",
    "VerifyReport": "chute.tools.verify",
    "make_sample_folder": "chute.tools.samples",
    "load": "chute.read.load",
    "LoadOptions": "chute.read.options",
    "auto_strategy": "chute.fit.backend",
    "build_model": "chute.fit.models",
    "available_models": "chute.fit.models",
    "train": "chute.fit.train",
    "TrainConfig": "chute.fit.config",
    "TrainResult": "chute.fit.train",
    "evaluate": "chute.fit.evaluate",
    "MultiLabelReport": "chute.fit.evaluate_labels",
    "label_stats": "chute.tools.labels",
    "predict": "chute.fit.predict",
    "export": "chute.fit.export",
    "Bundle": "chute.format.bundle",
    "load_bundle": "chute.format.bundle",
    "image_dataset_from_directory": "chute.read.dropin",
    "index": "chute.tools.index",
    "IndexReport": "chute.tools.index",
    "grain_source": "chute.read.grain.source",
    "GrainSource": "chute.read.grain.source",
}
__all__ = [
    "Bundle",
    "ChuteError",
    "ConvertOptions",
    "ConvertResult",
    "GrainSource",
    "ImageSpec",
    "IndexReport",
    "LoadOptions",
    "Manifest",
    "MultiLabelReport",
    "TrainConfig",
    "TrainResult",
    "VerifyReport",
    "auto_strategy",
    "available_models",
    "build_model",
    "convert",
    "evaluate",
    "export",
    "grain_source",
    "image_dataset_from_directory",
    "index",
    "inspect",
    "label_stats",
    "load",
    "load_bundle",
    "load_manifest",
    "make_sample_folder",
    "predict",
    "train",
    "verify",
]

if TYPE_CHECKING:
    from chute.errors import ChuteError
    from chute.fit.backend import auto_strategy
    from chute.fit.config import TrainConfig
    from chute.fit.evaluate import evaluate
    from chute.fit.evaluate_labels import MultiLabelReport
    from chute.fit.export import export
    from chute.fit.models import available_models, build_model
    from chute.fit.predict import predict
    from chute.fit.train import TrainResult, train
    from chute.format.bundle import Bundle, load_bundle
    from chute.format.manifest import Manifest
    from chute.format.manifest import load as load_manifest
    from chute.format.spec import ImageSpec
    from chute.ingest.convert import ConvertResult, convert
    from chute.ingest.options import ConvertOptions
    from chute.read.dropin import image_dataset_from_directory
    from chute.read.grain.source import GrainSource, grain_source
    from chute.read.load import load
    from chute.read.options import LoadOptions
    from chute.tools.index import IndexReport, index
    from chute.tools.inspect import inspect
    from chute.tools.labels import label_stats
    from chute.tools.samples import make_sample_folder
    from chute.tools.verify import VerifyReport, verify


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'chute' has no attribute {name!r}")
    module_name, attribute = target if isinstance(target, tuple) else (target, name)
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
