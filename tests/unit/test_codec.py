"""The codec: what can be stored as a job's arguments, and reading them back."""

from __future__ import annotations

import pytest

import asyncq
from asyncq import codec


@pytest.mark.parametrize(
    "value",
    ["C:\\u0000dir", "\\\\u0000", "u0000", "\\\\\\\\u0000", "plain"],
)
def test_backslashes_and_the_letters_u0000_are_text(value: str) -> None:
    text = codec.encode("t", {"v": value}, 1000)
    assert codec.decode(text) == {"v": value}


@pytest.mark.parametrize("value", ["\x00", "a\x00b", "\\\x00", "\\\\\x00"])
def test_a_real_nul_is_refused(value: str) -> None:
    with pytest.raises(asyncq.ArgumentsError, match="NUL"):
        codec.encode("t", {"v": value}, 1000)
    with pytest.raises(asyncq.ArgumentsError, match="NUL"):
        codec.encode_many("t", [{"v": "ok"}, {"v": value}], 1000)


def test_a_lone_surrogate_is_refused_and_a_pair_is_text() -> None:
    with pytest.raises(asyncq.ArgumentsError, match="surrogate"):
        codec.encode("t", {"v": "\ud800"}, 1000)
    with pytest.raises(asyncq.ArgumentsError, match="surrogate"):
        codec.encode_many("t", [{"v": "ok"}, {"v": "x\udfff"}], 1000)
    assert codec.decode(codec.encode("t", {"v": "🙂"}, 1000)) == {"v": "🙂"}


def test_size_is_counted_in_utf8_bytes() -> None:
    assert codec.encode("t", ["é" * 4], 12)  # 8 characters as JSON, 12 bytes
    with pytest.raises(asyncq.PayloadTooLarge, match="12 bytes"):
        codec.encode("t", ["é" * 4], 11)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"x": ' + "9" * 5000 + "}", "digits"),
        ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ("{not json", "cannot be decoded"),
    ],
)
def test_arguments_that_cannot_be_decoded_say_why(text: str, says: str) -> None:
    with pytest.raises(asyncq.UndecodableArguments, match=says):
        codec.decode(text)


def test_names_refuse_control_characters_and_lone_surrogates() -> None:
    for bad in ("", "a\nb", "x\ud800", "a" * 201):
        with pytest.raises(asyncq.InvalidName):
            codec.validate_name("queue", bad)
    assert codec.validate_name("queue", "очередь 🙂") == "очередь 🙂"
