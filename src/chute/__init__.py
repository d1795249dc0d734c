"""chute keeps TPUs and GPUs fed.

Image-classification datasets (class folders, CSV lists, arrays,
``keras.datasets``) become verified, sharded TFRecord files with a manifest.
The public API is this facade; heavy modules (TensorFlow) load on first use,
so ``import chute`` and ``chute --help`` are instant.

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
    "ConvertOptions": "chute.options",
    "ConvertResult": "chute.conversion",
    "convert": "chute.conversion",
    "Manifest": "chute.manifest",
    "load_manifest": ("chute.manifest", "load"),
    "inspect": ("chute.describe", "describe"),
    "verify": "chute.verification",
    "VerifyReport": "chute.verification",
    "make_sample_folder": "chute.samples",
    "load": "chute.pipeline",
    "auto_strategy": "chute.strategy",
    "build_model": "chute.models",
    "available_models": "chute.models",
    "train": "chute.training",
    "TrainConfig": "chute.training",
    "evaluate": "chute.evaluation",
    "predict": "chute.prediction",
    "export": "chute.exporting",
    "load_bundle": "chute.bundle",
    "image_dataset_from_directory": "chute.dropin",
}
__all__ = [
    "ChuteError",
    "ConvertOptions",
    "ConvertResult",
    "Manifest",
    "TrainConfig",
    "VerifyReport",
    "auto_strategy",
    "available_models",
    "build_model",
    "convert",
    "evaluate",
    "export",
    "image_dataset_from_directory",
    "inspect",
    "load",
    "load_bundle",
    "load_manifest",
    "make_sample_folder",
    "predict",
    "train",
    "verify",
]

if TYPE_CHECKING:
    from chute.bundle import load_bundle
    from chute.conversion import ConvertResult, convert
    from chute.describe import describe as inspect
    from chute.dropin import image_dataset_from_directory
    from chute.errors import ChuteError
    from chute.evaluation import evaluate
    from chute.exporting import export
    from chute.manifest import Manifest
    from chute.manifest import load as load_manifest
    from chute.models import available_models, build_model
    from chute.options import ConvertOptions
    from chute.pipeline import load
    from chute.prediction import predict
    from chute.samples import make_sample_folder
    from chute.strategy import auto_strategy
    from chute.training import TrainConfig, train
    from chute.verification import VerifyReport, verify


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
