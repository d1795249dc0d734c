"""Arrays as a source: a ``.npz`` file, or a ``keras.datasets`` name (``keras:cifar10``).

``keras:NAME`` loads through ``keras.datasets``, with Keras's own download and
cache (``~/.keras/datasets``, or ``$KERAS_HOME/datasets``). It is the one kind of
source that imports Keras, and so Keras's backend (TensorFlow unless
``KERAS_BACKEND`` names another); a ``.npz`` of the same arrays converts without.
"""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np

from chute.errors import ChuteError
from chute.format import storage
from chute.ingest.sources.base import SPLITS, ArraySource, Item, Source
from chute.lazy import keras

KERAS_CLASS_NAMES = {
    "mnist": [str(i) for i in range(10)],
    "fashion_mnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
    "cifar10": [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ],
    "cifar100": """
        apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy
        bridge bus butterfly camel can castle caterpillar cattle chair chimpanzee clock
        cloud cockroach couch crab crocodile cup dinosaur dolphin elephant flatfish
        forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion
        lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree
        orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
        porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk
        skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table
        tank telephone television tiger tractor train trout tulip turtle wardrobe whale
        willow_tree wolf woman worm
    """.split(),  # noqa: SIM905
}


def _array_source(
    kind: str,
    location: str,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    class_names: list[str] | None,
    containers: list[str],
) -> Source:
    arrays: dict[str, np.ndarray] = {}
    items: list[Item] = []
    max_label = -1
    presplit = len(splits) > 1
    for split, (x, y) in splits.items():
        x = np.asarray(x)
        y = np.asarray(y)
        if x.dtype != np.uint8:
            raise ChuteError(
                f"`x` must hold uint8 pixels (0-255). Received: x.dtype={x.dtype} in {location} "
                f"({split}); convert with (x * 255).round().astype('uint8') if it is in [0, 1]"
            )
        # (N, H, W, 1) is grayscale: stored as (N, H, W), as Pillow takes one channel.
        if x.ndim == 4 and x.shape[-1] == 1:
            x = x[..., 0]
        if not (x.ndim == 3 or (x.ndim == 4 and x.shape[-1] in (3, 4))):
            raise ChuteError(
                "`x` must have shape (N, H, W) or (N, H, W, C) with C in {1, 3, 4}. "
                f"Received: x.shape={x.shape} in {location} ({split})"
            )
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise ChuteError(
                f"`y` must be {len(x)} integer labels, one per image. Received: "
                f"y.shape={y.shape}, y.dtype={y.dtype} in {location} ({split})"
            )
        if len(y) and y.min() < 0:
            raise ChuteError(f"`y` must be labels >= 0. Received: min(y)={y.min()} in {location}")
        max_label = max(max_label, int(y.max()) if len(y) else -1)
        arrays[split] = x
        # Zero-padded keys: they sort in array order.
        width = max(5, len(str(len(x))))
        named = split if presplit else None
        items.extend(
            Item(f"{split}/{i:0{width}d}", label, named, None, i)
            for i, label in enumerate(y.tolist())  # Python ints: one conversion for all
        )
    if class_names is None:
        class_names = [str(i) for i in range(max_label + 1)]
    elif max_label >= len(class_names):
        raise ChuteError(
            f"`y` has label {max_label} but only {len(class_names)} class names were given "
            f"in {location}"
        )
    return ArraySource(
        kind,
        location,
        list(class_names),
        items,
        presplit=presplit,
        arrays=arrays,
        containers=containers,
    )


def scan_npz(path: str) -> Source:
    splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        # allow_pickle=False: a .npz from elsewhere must not run code when it is loaded.
        # A local file is read member by member, not held whole beside its arrays.
        where = storage.local_path(path) if storage.is_local(path) else None
        opened = where if where else io.BytesIO(storage.read_bytes(path))
        with np.load(opened, allow_pickle=False) as data:
            keys = set(data.files)
            if {"x", "y"} <= keys:
                splits["train"] = (data["x"], data["y"])
            for split in SPLITS:
                if {f"x_{split}", f"y_{split}"} <= keys:
                    splits[split] = (data[f"x_{split}"], data[f"y_{split}"])
            names = None
            if "class_names" in keys:
                names = [str(n) for n in data["class_names"].tolist()]
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise ChuteError(f"`source` is not a readable .npz file: {path!r} ({error})") from None
    if "train" not in splits:
        raise ChuteError(
            "A .npz source must hold arrays 'x' and 'y' (or 'x_train' and 'y_train', with "
            f"optional 'x_val'/'y_val', 'x_test'/'y_test'). Received: {path!r} holds "
            f"{sorted(keys)}"
        )
    return _array_source("npz", path, splits, names, [path])


def scan_keras(source: str) -> Source:
    name = source.split(":", 1)[1]
    if name not in KERAS_CLASS_NAMES:
        raise ChuteError(
            "`source` names an unknown keras dataset. Received: source="
            f"{source!r}; allowed: {', '.join('keras:' + k for k in sorted(KERAS_CLASS_NAMES))}"
        )
    try:
        (x_train, y_train), (x_test, y_test) = getattr(keras.datasets, name).load_data()
    except ChuteError:  # Keras itself is missing: chute's line says what to install
        raise
    except Exception as error:  # a failed download is a bare Exception in keras.utils.get_file
        raise ChuteError(_not_loaded(source, name, error)) from None
    return _array_source(
        "keras",
        source,
        {"train": (x_train, y_train), "test": (x_test, y_test)},
        KERAS_CLASS_NAMES[name],
        [],  # Keras's download cache: no file of the user's to watch
    )


def _not_loaded(source: str, name: str, error: Exception) -> str:
    """The one line saying that ``keras.datasets`` could not load ``name`` (offline, most
    often), where Keras keeps the file, and the way out that needs no network."""
    said = " ".join(str(error).split())[:300] or type(error).__name__
    home = os.environ.get("KERAS_HOME")
    cache = os.path.join(home, "datasets") if home else "~/.keras/datasets ($KERAS_HOME/datasets)"
    return (
        f"keras.datasets.{name}.load_data() failed ({said}). Keras downloads the dataset "
        f"once into {cache} and reads it from there afterwards: run the same command on a "
        "machine with network access and copy that folder here, or save the arrays there "
        f"with numpy.savez('{name}.npz', x_train=x_train, y_train=y_train, x_test=x_test, "
        f"y_test=y_test) and convert {name}.npz (no network, no TensorFlow). "
        f"Received: source={source!r}"
    )
