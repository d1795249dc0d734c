"""Image size arguments: the forms ``image_size`` accepts, and what it refuses."""

from __future__ import annotations

import pytest

from chute import ChuteError
from chute.image.size import parse_image_size


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (75, (75, 75)),
        ("75", (75, 75)),
        ("75x100", (75, 100)),
        ("32X48", (32, 48)),
        ((10, 20), (10, 20)),
        ([10, 20], (10, 20)),
        (None, None),
    ],
)
def test_image_size_forms(value, expected):
    assert parse_image_size(value) == expected


@pytest.mark.parametrize("value", ["abc", "75x", True, (1, 2, 3), (0, 5), 70000])
def test_bad_image_size_names_the_argument_and_the_value(value):
    with pytest.raises(ChuteError, match=r"`image_size` must be .*Received: image_size="):
        parse_image_size(value)
