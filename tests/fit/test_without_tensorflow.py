"""chute without TensorFlow: a JAX + Grain + s3fs install converts into a bucket, verifies
it, draws its grid, trains from it, evaluates and predicts (KERAS_BACKEND=jax), and what
truly needs TensorFlow (TensorBoard logs, a SavedModel export) says so in one line while
the rest runs.

One child process runs every command (tests/without_tensorflow_child.py): TensorFlow is
hidden from it and from the workers it starts by a ``sitecustomize`` on their PYTHONPATH
that answers "no such module" for it (``importlib.util.find_spec`` gives None, ``import``
raises ModuleNotFoundError, as in a venv without it). The bucket is moto's S3 server on
127.0.0.1, started by the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import jax_child_env, make_folder
from object_stores import new_s3_bucket

import chute
from chute import lazy

pytest.importorskip("grain")
pytest.importorskip("jax")

TESTS = Path(__file__).resolve().parents[1]

# As if TensorFlow were not installed: every finder of sys.meta_path answers None for it.
HIDE_TENSORFLOW = """
import sys


class _WithoutTensorFlow:
    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            return None
        find = getattr(self._finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attribute):
        return getattr(self._finder, attribute)


sys.meta_path[:] = [_WithoutTensorFlow(finder) for finder in sys.meta_path]
"""


def _child_env(root: Path) -> dict[str, str]:
    """JAX on the CPU, TensorFlow hidden; the S3 server's variables (the s3_endpoint
    fixture's: its URL and dummy credentials) come with the environment."""
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE_TENSORFLOW)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TPU_NAME")}
    src = str(Path(chute.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), src, env.get("PYTHONPATH")) if p)
    env.update(
        **jax_child_env(root / "jax-cache"),
        KERAS_BACKEND="jax",
        XDG_CACHE_HOME=str(root / "cache"),  # the shard cache's default folder
        JAX_PLATFORMS="cpu",
        CUDA_VISIBLE_DEVICES="",
    )
    return env


@pytest.mark.slow  # one child process: a conversion, a JAX compile, a 1-epoch run
def test_convert_verify_train_evaluate_predict_from_a_bucket_without_tensorflow(
    s3_endpoint, tmp_path
):
    src = make_folder(tmp_path / "src", {"a": 12, "b": 12}, size=(16, 16))
    out = new_s3_bucket(s3_endpoint) + "/shards"
    done = subprocess.run(
        [sys.executable, str(TESTS / "without_tensorflow_child.py"), str(src), out, str(tmp_path)],
        env=_child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=400,
    )
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, done.stdout + done.stderr
    codes = json.loads(results[-1][len("RESULT ") :])
    assert not codes.pop("tensorflow found") and not codes.pop("tensorflow imported")
    assert codes.pop("export savedmodel") == 2  # a ChuteError: one line, no traceback
    assert codes == dict.fromkeys(codes, 0), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # what needs TensorFlow says so in one line each
    (export,) = [line for line in done.stderr.splitlines() if "chute export: error" in line]
    assert "needs TensorFlow" in export and "--format keras" in export
    assert "No TensorBoard logs: they need TensorFlow (pip install" in done.stderr
    assert "the Grain engine reads the data" in done.stderr
    assert "ok: 2 shards, 24 records match the manifest of " + out in done.stdout
    assert "trained kannada-cnn on " + out in done.stdout
    assert "val: 6 images" in done.stdout and "/000.png: " in done.stdout
    assert (tmp_path / "grid.png").exists() and (tmp_path / "keras" / "model.keras").exists()
    assert not (tmp_path / "savedmodel").exists()  # refused before writing anything
    assert not (tmp_path / "run" / "logs").exists()


def test_the_tf_data_engine_without_tensorflow_names_the_grain_engine(tmp_path, monkeypatch):
    from chute.read import load as load_lib

    out = tmp_path / "out"
    chute.convert(make_folder(tmp_path / "src", {"a": 2, "b": 2}), out, workers=1)
    monkeypatch.setattr(load_lib, "installed", lambda name: name != "tensorflow")
    install = re.escape(lazy.extra("tensorflow"))
    with pytest.raises(chute.ChuteError, match=r"needs TensorFlow.*engine='grain'.*" + install):
        chute.load(out)
    assert len(chute.load(out, engine="grain", batch_size=2, workers=0)) == 2


@pytest.mark.parametrize(
    ("engine", "present", "chosen"),
    [("tf", {"tensorflow", "grain"}, "tf"), ("tf", {"grain"}, "grain"),
     ("grain", {"grain"}, "grain"), ("tf", set(), None)],
)  # fmt: skip
def test_train_reads_with_grain_where_tensorflow_is_missing(monkeypatch, engine, present, chosen):
    from chute.fit import train as train_lib
    from chute.fit.config import TrainConfig

    monkeypatch.setattr(train_lib, "installed", lambda name: name in present)
    config = TrainConfig(load={"engine": engine})
    if chosen is None:
        install = re.escape(lazy.extra("grain"))
        with pytest.raises(chute.ChuteError, match="neither is installed.*" + install):
            train_lib._engine_without_tensorflow(config)
    else:
        assert train_lib._engine_without_tensorflow(config).load.engine == chosen
