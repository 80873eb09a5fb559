"""`epoch.parse` and `epoch.order`: ASCII digits only, kept as sent, ordered numerically
without converting (a hostile header past Python's int-conversion limit must not raise)."""

from __future__ import annotations

import itertools
import random

import pytest

from pinboard_worker.epoch import order, parse

HUGE = "9" * 5000
"""Past Python's 4300-digit int-conversion limit."""


@pytest.mark.parametrize(
    "good", ["0", "7", "000123", "1700000000123", "99999999999999999999999999999", HUGE]
)
def test_digits_parse_as_sent(good: str) -> None:
    assert parse(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " 1",
        "1 ",
        "-1",
        "+1",
        "1.0",
        "1e3",
        "0x10",
        "1_000",
        "12a",
        "\u0661\u0662",  # ARABIC-INDIC DIGITS ONE, TWO
        "\uff11\uff12",  # FULLWIDTH DIGITS
        "\u00b2",  # SUPERSCRIPT TWO: isdigit() but not a decimal digit
        "\u0967",  # DEVANAGARI DIGIT ONE
        "1\n",
        "\x00",
    ],
)
def test_anything_else_is_refused(bad: str) -> None:
    assert parse(bad) is None


def test_ordered_numerically_past_u64_and_leading_zeros() -> None:
    assert order("9") < order("10")
    assert order("1700000000123") < order("1700000000124")
    assert order("18446744073709551615") < order("18446744073709551616")
    assert order("99999999999999999999999") > order("18446744073709551616")
    assert order("007") == order("7")
    assert order("0") == order("000") == order("")
    assert order("0") < order("1")
    assert order("0009") < order("10")
    assert order(HUGE) > order("9" * 4999)
    assert order("1" + "0" * 5000) > order(HUGE)
    assert order("0" * 6000 + "5") == order("5")


def test_order_agrees_with_integers() -> None:
    rng = random.Random(7)
    values = [rng.randrange(0, 10**30) for _ in range(300)] + [0, 1, 9, 10]
    spelled = [("0" * rng.randrange(0, 4)) + str(v) for v in values]
    assert sorted(spelled, key=order) == sorted(spelled, key=int)
    for a, b in itertools.pairwise(spelled):
        assert (order(a) < order(b)) == (int(a) < int(b))
        assert (order(a) == order(b)) == (int(a) == int(b))
