"""The wire's key pattern: exactly 32 lowercase hex characters, one name per digest."""

from __future__ import annotations

import pytest

from fcache.protocol.limits import MAX_ARTIFACT_BYTES, is_valid_key


def test_a_key_is_32_lowercase_hex_characters() -> None:
    assert is_valid_key("0123456789abcdef" * 2)


@pytest.mark.parametrize(
    "key",
    [
        "0123456789abcdef" * 2 + "\n",  # `$` would take it: a second key for one digest
        "\n" + "0123456789abcdef" * 2,
        "0123456789ABCDEF" * 2,
        "0123456789abcdef" * 2 + "0",
        "0123456789abcdef",
        "../" + "0" * 29,
        "",
        None,
        b"0" * 32,
    ],
)
def test_anything_else_is_not_a_key(key: object) -> None:
    assert not is_valid_key(key)


def test_the_artifact_bound_is_2_gib() -> None:
    assert MAX_ARTIFACT_BYTES == 2 << 30
