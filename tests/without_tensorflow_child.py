"""The commands of tests/fit/test_without_tensorflow.py, in one child process where
``import tensorflow`` fails (a ``sitecustomize`` on its PYTHONPATH hides it from every
finder, in this process and in every worker it starts), with ``KERAS_BACKEND=jax``:
``python without_tensorflow_child.py SRC OUT ROOT``, OUT a bucket URL.

Prints each command's exit code, and whether TensorFlow was found or imported, as one
JSON line at the end (``RESULT {...}``); the commands' own output goes before it.
"""

import importlib.util
import json
import sys
from pathlib import Path

from chute.cli import main

src, out, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
run = str(root / "run")
codes = {"tensorflow found": importlib.util.find_spec("tensorflow") is not None}
commands = {
    "convert": ["convert", src, out, "--image-size", "16", "--val-fraction", "0.25",
                "--workers", "1"],
    "verify": ["verify", out, "--no-progress"],
    "grid": ["inspect", out, "--grid", str(root / "grid.png")],
    # no --engine: without TensorFlow, train chooses the Grain engine itself
    "train": ["train", out, "--run-dir", run, "--model", "kannada-cnn", "--epochs", "1",
              "--batch-size", "8", "--workers", "0", "--no-progress"],
    "evaluate": ["evaluate", run, out],
    "predict": ["predict", run, str(next(Path(src).rglob("*.png")))],
    "export savedmodel": ["export", run, "--output", str(root / "savedmodel")],
    "export keras": ["export", run, "--output", str(root / "keras"), "--format", "keras"],
}  # fmt: skip
for name, args in commands.items():
    print(f"=== {name}", flush=True)
    print(f"=== {name}", file=sys.stderr, flush=True)
    codes[name] = main(args)
codes["tensorflow imported"] = "tensorflow" in sys.modules
print("RESULT " + json.dumps(codes), flush=True)
