"""Strategy detection with the TPU resolver and GPU list faked; precision; batch arithmetic."""

from __future__ import annotations

import json

import pytest

from chute import ChuteError
from chute.fit import strategy


class FakeResolver:
    def __init__(self, address):
        self.address = address


def no_tpu(address):
    raise ValueError("Please provide a TPU Name to connect to.")


def detect(kind="auto", *, environ=None, gpus=0, tpu_ok=False, tpu=None):
    calls = []

    def resolve(address):
        calls.append(address)
        if not tpu_ok:
            return no_tpu(address)
        return FakeResolver(address)

    plan = strategy.detect(
        kind, tpu=tpu, environ=environ or {}, list_gpus=lambda: gpus, resolve_tpu=resolve
    )
    return plan, calls


def test_tpu_first_from_flag_env_or_colab():
    plan, calls = detect(tpu_ok=True, tpu="my-tpu", gpus=8)
    assert plan.kind == "tpu" and plan.tpu.address == "my-tpu" and calls == ["my-tpu"]
    plan, _ = detect(tpu_ok=True, environ={"TPU_NAME": "node-1"})
    assert plan.tpu.address == "node-1"
    plan, _ = detect(tpu_ok=True, environ={"COLAB_TPU_ADDR": "10.0.0.2:8470"})
    assert plan.tpu.address == "grpc://10.0.0.2:8470"
    plan, calls = detect(tpu_ok=True)  # a TPU VM / Kaggle: the resolver finds it alone
    assert plan.kind == "tpu" and calls == [None]


def test_falls_back_when_no_tpu():
    assert detect(gpus=4)[0] == strategy.Plan("multi-gpu", gpus=4)
    assert detect(gpus=1)[0] == strategy.Plan("gpu", gpus=1)
    assert detect(gpus=0)[0] == strategy.Plan("cpu")


def test_tf_config_with_several_workers_means_multiworker():
    config = {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0},
    }
    plan, _ = detect(environ={"TF_CONFIG": json.dumps(config)}, gpus=1)
    assert plan == strategy.Plan("multiworker", workers=2)
    one = {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
    assert detect(environ={"TF_CONFIG": json.dumps(one)})[0].kind == "cpu"  # one worker: plain
    assert detect("multiworker", environ={"TF_CONFIG": json.dumps(one)})[0].kind == "multiworker"


def test_insisting_on_what_is_not_here_is_a_clear_error():
    with pytest.raises(ChuteError, match="'tpu' but no TPU was found"):
        detect("tpu")
    with pytest.raises(ChuteError, match="'gpu' but TensorFlow sees no GPU"):
        detect("gpu")
    with pytest.raises(ChuteError, match="'multiworker' but TF_CONFIG names no workers"):
        detect("multiworker")
    with pytest.raises(ChuteError, match="TF_CONFIG is not valid JSON"):
        detect(environ={"TF_CONFIG": "{oops"})
    with pytest.raises(ChuteError, match="`strategy` must be one of"):
        detect("quantum")
    assert detect("cpu", gpus=8, tpu_ok=False)[0].kind == "cpu"


def test_precision_policy():
    assert strategy.precision_policy("tpu") == "mixed_bfloat16"
    assert strategy.precision_policy("gpu") == "mixed_float16"
    assert strategy.precision_policy("multi-gpu", gpu_mixed_float16=False) == "float32"
    assert strategy.precision_policy("cpu") == "float32"
    assert strategy.precision_policy("cpu", "mixed_bfloat16") == "mixed_bfloat16"
    # several workers: float16 when this worker has GPUs that support it
    assert strategy.precision_policy("multiworker", gpus=4) == "mixed_float16"
    assert strategy.precision_policy("multiworker", gpus=0) == "float32"
    assert strategy.precision_policy("multiworker", gpus=4, gpu_mixed_float16=False) == "float32"
    with pytest.raises(ChuteError, match="`precision` must be one of"):
        strategy.precision_policy("cpu", "fp8")


def test_cpu_strategy_and_batch_arithmetic():
    built = strategy.auto_strategy("cpu")
    assert built.num_replicas_in_sync == 1 and built.chute_kind == "cpu"
    assert strategy.describe(built)["replicas"] == 1
    assert strategy.global_batch_size(128, built) == 128
    with pytest.raises(ChuteError, match="`batch_size` must be a positive integer"):
        strategy.global_batch_size(0, built)
