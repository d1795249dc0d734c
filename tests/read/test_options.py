"""LoadOptions: every bad value is refused naming the option, the value and what is allowed,
before any dataset is opened; defaults and flags come from one dataclass."""

from __future__ import annotations

import dataclasses

import pytest

from chute import ChuteError, LoadOptions
from chute.read.options import resolve


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("batch_size", 0, "a positive integer"),
        ("batch_size", 2.5, "a positive integer"),
        ("batch_size", True, "a positive integer"),
        ("training", "yes", "True, False or None"),
        ("image_size", (0, 4), "a positive integer H"),
        ("image_size", "big", "a positive integer H"),
        ("dtype", "float16", "one of {'uint8', 'float32', 'bfloat16'}"),
        (
            "label_mode",
            "sparse",
            "one of {'auto', 'int', 'categorical', 'binary', 'multi_hot', None}",
        ),
        ("augment", ["flip", "swirl"], "names from"),  # the name at fault is the one received
        ("augment", 3, "a list of names"),
        ("augment_on", "gpu", "one of {'host', 'device'}"),
        ("crop_scale", (0.5, 0.2), "a (min, max) pair with 0 < min <= max <= 1"),
        ("crop_scale", (0.0, 1.0), "a (min, max) pair"),
        ("crop_scale", 0.5, "a (min, max) pair"),
        ("crop_ratio", (1, 200), "a (min, max) pair with 0 < min <= max <= 100"),
        ("crop_fraction", 0, "a number in (0, 1]"),
        ("crop_fraction", 1.5, "a number in [0, 1]"),
        ("cache", "ram", "'auto', 'memory', 'disk:FOLDER' or None"),
        ("cache", "disk:", "'auto', 'memory', 'disk:FOLDER' or None"),
        ("cache", True, "'auto', 'memory', 'disk:FOLDER' or None"),
        ("seed", "1", "an integer or None"),
        ("seed", 1.5, "an integer or None"),
        ("shuffle_buffer", 0, "a positive integer"),
        ("pad_final_batch", 1, "True or False"),
        ("repeat", "no", "True or False"),
        ("skip_corrupt", None, "True or False"),
        ("data_service", "nowhere", "a dispatcher address grpc://HOST:PORT"),
    ],
)
def test_each_bad_value_names_the_option_the_value_and_what_is_allowed(name, value, allowed):
    with pytest.raises(ChuteError) as raised:
        LoadOptions(**{name: value})
    message = str(raised.value)
    assert message.startswith(f"`{name}` must be"), message
    assert allowed in message, message
    received = "swirl" if value == ["flip", "swirl"] else value
    assert message.endswith(f"Received: {name}={received!r}"), message


def test_options_that_exclude_each_other_are_refused_naming_both():
    with pytest.raises(ChuteError, match=r"needs label_mode='categorical'.*label_mode='int'"):
        LoadOptions(augment=["mixup"], label_mode="int")
    with pytest.raises(ChuteError, match=r"`pad_final_batch` applies to evaluation"):
        LoadOptions(pad_final_batch=True, training=True)
    with pytest.raises(ChuteError, match=r"`pad_final_batch`.*needs labels.*label_mode=None"):
        LoadOptions(pad_final_batch=True, label_mode=None, training=False)


def test_values_are_normalised():
    options = LoadOptions(
        image_size="75x100", augment="crop, flip", crop_scale=[0.2, 1], cache="none",
        data_service="10.0.0.2:5050",
    )  # fmt: skip
    assert options.image_size == (75, 100)
    assert options.augment == ("crop", "flip")
    assert options.augment_spec.crop and options.augment_spec.flip
    assert options.crop_scale == (0.2, 1.0)
    assert options.cache is None
    assert options.data_service == "grpc://10.0.0.2:5050"
    assert LoadOptions(augment=None).augment == ()


def test_the_defaults_are_the_documented_ones():
    options = LoadOptions()
    assert (options.batch_size, options.training, options.cache) == (128, None, "auto")
    assert (options.crop_scale, options.crop_ratio) == ((0.08, 1.0), (3 / 4, 4 / 3))
    assert (options.shuffle_buffer, options.augment, options.augment_on) == (8192, (), "host")
    assert not (options.pad_final_batch or options.repeat or options.skip_corrupt)
    from chute.read import options as options_lib

    assert LoadOptions is options_lib.LoadOptions  # the facade exports the one class


def test_overrides_replace_fields_and_unknown_ones_are_named():
    base = LoadOptions(batch_size=64, seed=1)
    assert resolve(base, {}) is base
    assert resolve(base, {"batch_size": 8}) == dataclasses.replace(base, batch_size=8)
    assert resolve(None, {"seed": 2}) == LoadOptions(seed=2)
    assert resolve({"seed": 2}, {"cache": None}) == LoadOptions(seed=2, cache=None)
    with pytest.raises(ChuteError, match=r"Unknown load option\(s\) \['epochs'\]"):
        resolve(base, {"epochs": 3})
    with pytest.raises(ChuteError, match=r"Unknown load option\(s\) \['epochs'\]"):
        LoadOptions.from_dict({"epochs": 3})
    with pytest.raises(ChuteError, match="`batch_size` must be"):
        resolve(base, {"batch_size": -1})  # an override is checked like any value


def test_every_field_has_help_for_the_flags_and_the_table():
    for field in dataclasses.fields(LoadOptions):
        assert field.metadata["help"], field.name
