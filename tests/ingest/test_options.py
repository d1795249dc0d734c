"""ConvertOptions: every value checked up front, messages name option, value and what is allowed."""

from __future__ import annotations

import pytest

from chute import ChuteError, ConvertOptions


@pytest.mark.parametrize("value", ["abc", "0", "75x", "-3", 0, True, (1, 2, 3), 1.5, (0, 5), 70000])
def test_bad_image_size_names_option_and_value(value):
    with pytest.raises(ChuteError, match=r"`image_size` must be .*Received: image_size="):
        ConvertOptions(image_size=value)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("resize", "squash", "stretch"),
        ("interpolation", "cubic", "bilinear"),
        ("color_mode", "cmyk", "grayscale"),
        ("encoding", "webp", "raw"),
        ("quality", 0, "from 1 to 100"),
        ("quality", 101, "from 1 to 100"),
        ("val_fraction", 1.0, r"\[0, 1\)"),
        ("test_fraction", -0.1, r"\[0, 1\)"),
        ("val_fraction", "0.1", r"\[0, 1\)"),
        ("seed", -1, "integer"),
        ("shard_size_mb", 0, "positive"),
        ("shard_size_mb", float("nan"), "positive"),
        ("min_shards", 0, "integer"),
        ("max_pixels", 0, "integer"),
    ],
)
def test_each_bad_value_is_named(field, value, allowed):
    with pytest.raises(ChuteError) as caught:
        ConvertOptions(**{field: value})
    message = str(caught.value)
    assert f"`{field}`" in message
    assert f"Received: {field}={value!r}" in message
    assert __import__("re").search(allowed, message)


def test_fractions_must_leave_training_data():
    with pytest.raises(ChuteError, match="val_fraction \\+ test_fraction"):
        ConvertOptions(val_fraction=0.6, test_fraction=0.4)


def test_keep_size_conflicts():
    with pytest.raises(ChuteError, match="`keep_size` and `image_size`"):
        ConvertOptions(keep_size=True, image_size=32)
    with pytest.raises(
        ChuteError, match="`encoding` must be 'png', 'jpeg' or 'auto' when keep_size"
    ):
        ConvertOptions(keep_size=True, encoding="raw")
    with pytest.raises(ChuteError, match="`resize` only applies with `image_size`"):
        ConvertOptions(resize="crop")


def test_round_trip_through_dict():
    options = ConvertOptions(image_size="20x30", interpolation="lanczos", val_fraction=0.1)
    assert ConvertOptions.from_dict(options.to_dict()) == options
    assert options.to_dict()["image_size"] == [20, 30]


def test_label_options_at_their_defaults_leave_the_stored_options_as_they_were():
    from chute.ingest.options import LABEL_OPTIONS, ConvertOptions

    stored = ConvertOptions().to_dict()
    assert not set(LABEL_OPTIONS) & set(stored)  # what an older chute wrote and compares
    asked = ConvertOptions(allow_empty_labels=True, weight_column="w").to_dict()
    assert asked["allow_empty_labels"] is True and asked["weight_column"] == "w"
    assert "label_separator" not in asked
    assert ConvertOptions.from_dict(asked) == ConvertOptions(
        allow_empty_labels=True, weight_column="w"
    )
