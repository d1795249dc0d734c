"""An unknown model is named as the option that gave it: ``model`` (``--model``) for
``chute train`` and ``chute bench``, ``name`` for ``build_model(name, ...)``."""

from __future__ import annotations

import pytest
from helpers import run_here

import chute
from chute.errors import ChuteError
from chute.fit.models import MODEL_NAMES, build_model, check_model


def test_train_names_the_model_option(shared_dataset, tmp_path):
    with pytest.raises(ChuteError) as error:
        chute.train(shared_dataset, tmp_path / "run", model="NoSuchModel")
    message = str(error.value)
    assert message.startswith("`model` must be one of")
    assert "Received: model='NoSuchModel'" in message and "`name`" not in message
    assert all(repr(name) in message for name in MODEL_NAMES)
    assert not (tmp_path / "run").exists()  # checked before any work


def test_cli_train_names_the_model_option(shared_dataset, tmp_path):
    result = run_here("train", shared_dataset, "--model", "NoSuchModel", "--run-dir", tmp_path)
    assert result.returncode == 2, result.stderr
    assert "chute train: error: `model` must be one of" in result.stderr
    assert "Received: model='NoSuchModel'" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_model_says_model_and_build_model_says_name():
    with pytest.raises(ChuteError, match=r"^`model` must be .*Received: model=''"):
        check_model("")
    with pytest.raises(ChuteError, match=r"Did you mean 'MobileNetV2'"):
        check_model("MobileNetV9")
    with pytest.raises(ChuteError, match=r"^`name` must be one of .*Received: name='alexnet'"):
        build_model("alexnet", input_shape=(32, 32, 3), num_classes=3)
    assert check_model("Kannada_CNN") == "kannada-cnn"
