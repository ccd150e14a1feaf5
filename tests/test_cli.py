"""The command-line scripts' number types: bad values are argparse usage errors."""

from __future__ import annotations

import argparse

import pytest

from metasampler.cli import positive_float, positive_int


@pytest.mark.parametrize("text", ["0", "-3", "x", "1.5", ""])
def test_positive_int_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="integer > 0"):
        positive_int(text)


@pytest.mark.parametrize("text", ["0", "-0.1", "nan", "inf", "x"])
def test_positive_float_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="number > 0"):
        positive_float(text)


def test_positive_numbers_pass_through():
    assert positive_int("12000") == 12000
    assert positive_float("0.025") == 0.025
    assert positive_float("3") == 3.0
