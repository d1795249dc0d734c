"""predict without TensorFlow: ``prepare_image`` crops and resizes with the Grain engine's
NumPy code (chute.image.crop) where TensorFlow is not installed; its pixels are the
TensorFlow path's, bit for bit, for bilinear and nearest (the stored encodings, crops and
sizes in the table)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import write_image

from chute.fit import predict as predict_lib
from chute.format.bundle import Bundle
from chute.format.spec import ImageSpec

CASES = [  # (stored spec, input size, crop fraction, file size (h, w), mode)
    (ImageSpec(16, 16, 1, "raw"), (16, 16), 1.0, (20, 24), "L"),
    (ImageSpec(16, 16, 3, "png"), (12, 12), 0.875, (16, 16), "RGB"),
    (ImageSpec(None, None, 3, "jpeg", shorter_side=20), (16, 16), 0.875, (30, 40), "RGB"),
    (ImageSpec(24, 20, 1, "raw", interpolation="nearest"), (10, 9), 0.75, (24, 20), "L"),
]


@pytest.mark.parametrize(("spec", "size", "fraction", "shape", "mode"), CASES)
def test_the_numpy_crop_gives_the_tensorflow_pixels(tmp_path, monkeypatch, spec, size, fraction,
                                                     shape, mode):  # fmt: skip
    path = write_image(tmp_path / "x.png", size=shape, mode=mode, seed=3)
    bundle = Bundle(["a", "b"], spec, {}, str(tmp_path), input_size=size, crop_fraction=fraction)
    with_tf = predict_lib.prepare_image(str(path), bundle)
    monkeypatch.setattr(predict_lib, "installed", lambda name: name != "tensorflow")
    monkeypatch.setattr(predict_lib, "tf", None)  # any use of TensorFlow fails the test
    without = predict_lib.prepare_image(str(path), bundle)
    assert without.shape == (*size, spec.channels) and without.dtype == np.uint8
    np.testing.assert_array_equal(without, with_tf)
