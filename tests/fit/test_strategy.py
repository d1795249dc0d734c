"""Strategy detection with the environment, devices and TPU resolver faked; precision; batch
arithmetic. Real /dev is never read: device folders are made in tmp_path."""

from __future__ import annotations

import importlib.machinery
import json
import logging
import sys
import types
from pathlib import Path

import pytest

from chute import ChuteError
from chute.fit import strategy

NO_DEVICES = Path("/nonexistent-dev")  # a device folder with nothing in it


class FakeResolver:
    def __init__(self, address):
        self.address = address


def no_tpu(address):
    raise ValueError("Please provide a TPU Name to connect to.")


def fake_dev(root: Path, *names: str) -> Path:
    """A device folder holding empty files named ``names`` (``"accel0"``, ``"vfio/0"``)."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return root


def detect(
    kind="auto", *, environ=None, gpus=0, tpu_ok=False, tpu=None, libtpu=False, dev=NO_DEVICES
):
    """``strategy.detect`` with everything faked. ``tpu_ok``: True (every address resolves) or
    the addresses that do; ``libtpu``: whether libtpu is installed; ``dev``: the device folder."""
    calls = []

    def resolve(address):
        calls.append(address)
        if tpu_ok is True or address in (tpu_ok or ()):
            return FakeResolver(address)
        return no_tpu(address)

    def find_local_tpu(environ):
        return strategy.local_tpu(environ, dev=dev, has_libtpu=lambda: libtpu)

    plan = strategy.detect(
        kind,
        tpu=tpu,
        environ=environ or {},
        list_gpus=lambda: gpus,
        resolve_tpu=resolve,
        find_local_tpu=find_local_tpu,
    )
    return plan, calls


@pytest.fixture
def info_log(caplog):
    caplog.set_level(logging.INFO, logger=strategy.__name__)
    return caplog


def test_tpu_first_from_flag_env_or_colab(info_log):
    plan, calls = detect(tpu_ok=True, tpu="my-tpu", gpus=8)
    assert plan.kind == "tpu" and plan.tpu.address == "my-tpu" and calls == ["my-tpu"]
    assert "TPU: --tpu my-tpu" in info_log.messages
    plan, _ = detect(tpu_ok=True, environ={"TPU_NAME": "node-1"})
    assert plan.tpu.address == "node-1" and "TPU: TPU_NAME=node-1" in info_log.messages
    plan, _ = detect(tpu_ok=True, environ={"COLAB_TPU_ADDR": "10.0.0.2:8470"})
    assert plan.tpu.address == "grpc://10.0.0.2:8470"
    assert "TPU: COLAB_TPU_ADDR=10.0.0.2:8470" in info_log.messages
    plan, calls = detect(tpu_ok=True)  # nothing named or attached: what the resolver finds alone
    assert plan.kind == "tpu" and calls == [None]
    assert "TPU: found by TPUClusterResolver() without a name" in info_log.messages


def test_a_named_tpu_wins_over_one_attached_to_this_host(tmp_path, info_log):
    """A host of a multi-host pod slice has chips too, but the slice is reached by its name."""
    attached = {"libtpu": True, "dev": fake_dev(tmp_path, "accel0")}
    environ = {"TPU_NAME": "pod-1", "TPU_WORKER_ID": "3"}
    plan, calls = detect(tpu_ok=True, environ=environ, **attached)
    assert plan.tpu.address == "pod-1" and calls == ["pod-1"]
    plan, calls = detect(tpu_ok=True, tpu="grpc://10.1.2.3:8470", **attached)
    assert calls == ["grpc://10.1.2.3:8470"]
    assert "TPU: TPU_NAME=pod-1" in info_log.messages


@pytest.mark.parametrize(
    ("environ", "libtpu", "devices", "why"),
    [
        pytest.param({}, True, ["accel0", "accel1"], "libtpu, {dev}/accel0", id="tpu-vm"),
        pytest.param({}, True, ["vfio/vfio", "vfio/0"], "libtpu, {dev}/vfio/0", id="tpu-vm-vfio"),
        pytest.param(
            {"TPU_ACCELERATOR_TYPE": "v5litepod-8"},
            False,
            [],
            "TPU_ACCELERATOR_TYPE=v5litepod-8",
            id="accelerator-type",
        ),
        pytest.param({"TPU_WORKER_ID": "0"}, False, [], "TPU_WORKER_ID=0", id="worker-id"),
    ],
)
def test_a_tpu_attached_to_this_host_is_connected_as_local(
    environ, libtpu, devices, why, tmp_path, info_log
):
    """TPU VMs, Colab's and Kaggle's TPU runtimes: no name, so ``TPUClusterResolver("local")``."""
    dev = fake_dev(tmp_path, *devices)
    plan, calls = detect(environ=environ, libtpu=libtpu, dev=dev, tpu_ok=("local",), gpus=2)
    assert plan.kind == "tpu" and plan.tpu.address == "local" and calls == ["local"]
    assert f"TPU: attached to this host ({why.format(dev=dev)})" in info_log.messages


@pytest.mark.parametrize(
    ("libtpu", "devices", "why"),
    [
        pytest.param(True, [], "libtpu installed, but no TPU chip in", id="libtpu-no-chips"),
        pytest.param(True, ["vfio/vfio"], "libtpu installed, but no TPU", id="vfio-control-only"),
        pytest.param(False, ["accel0"], "no libtpu, TPU_ACCELERATOR_TYPE", id="chips-no-libtpu"),
    ],
)
def test_no_tpu_attached_falls_back_without_trying_local(libtpu, devices, why, tmp_path, caplog):
    """No TPU pointed at and none found (any GPU or CPU machine): said at DEBUG (``-v``),
    not among a command's notes."""
    caplog.set_level(logging.DEBUG, logger=strategy.__name__)
    dev = fake_dev(tmp_path, *devices)
    plan, calls = detect(libtpu=libtpu, dev=dev, tpu_ok=("local",), gpus=1)
    assert plan == strategy.Plan("gpu", gpus=1) and calls == [None]  # the resolver's own search
    found = [r for r in caplog.records if r.getMessage().startswith("TPU: none found")]
    (record,) = found
    assert why in record.getMessage() and "Please provide a TPU Name" in record.getMessage()
    assert record.levelno == logging.DEBUG


def test_an_attached_tpu_that_fails_to_connect_falls_back_with_the_reason(tmp_path, caplog):
    dev = fake_dev(tmp_path, "accel0")
    plan, calls = detect(libtpu=True, dev=dev, tpu_ok=False)
    assert plan == strategy.Plan("cpu") and calls == ["local"]
    (record,) = [r for r in caplog.records if r.getMessage().startswith("TPU: none found")]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"TPU: none found (attached to this host (libtpu, {dev}/accel0); "
        "TPUClusterResolver(tpu='local'): Please provide a TPU Name to connect to.)"
    )
    with pytest.raises(ChuteError, match=r"'tpu' but no TPU was found \(attached to this host"):
        detect("tpu", libtpu=True, dev=dev, tpu_ok=False)


def test_local_tpu_reads_the_variables_then_libtpu_and_the_chips(tmp_path, monkeypatch):
    dev = fake_dev(tmp_path, "accel0")
    no_libtpu = {"dev": dev, "has_libtpu": lambda: False}
    unset = {"TPU_WORKER_ID": "", "TPU_ACCELERATOR_TYPE": ""}
    assert strategy.local_tpu(unset, **no_libtpu)[0] is False  # empty: not set
    assert strategy.local_tpu({"TPU_WORKER_ID": "1"}, **no_libtpu) == (True, "TPU_WORKER_ID=1")
    # By default, libtpu is looked up with importlib's find_spec (found, never imported).
    monkeypatch.setitem(sys.modules, "libtpu", None)  # find_spec: not installed
    assert strategy.local_tpu({}, dev=dev)[0] is False
    libtpu = types.ModuleType("libtpu")
    libtpu.__spec__ = importlib.machinery.ModuleSpec("libtpu", None)
    monkeypatch.setitem(sys.modules, "libtpu", libtpu)  # find_spec: installed
    assert strategy.local_tpu({}, dev=dev) == (True, f"libtpu, {dev}/accel0")


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


def test_cpu_strategy_and_its_devices():
    devices = strategy.tensorflow_devices("cpu")
    built = devices.strategy
    assert built.num_replicas_in_sync == devices.replicas == 1 and devices.kind == "cpu"
