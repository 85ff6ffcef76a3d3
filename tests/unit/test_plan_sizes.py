"""Parsing the sizes users type for `hpctrain plan`, and the assumed model shapes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.errors import PlanError
from hpctrain.planner.model import KNOWN_SHAPES, resolve_arch
from hpctrain.planner.sizes import human_count, parse_count, parse_gb


@pytest.mark.parametrize("text, value", [
    ("70B", 70e9), ("7b", 7e9), ("350M", 350e6), ("1.5T", 1.5e12), ("1T tokens", 1e12),
    ("2e12", 2e12), ("125M params", 125e6), (" 13 B ", 13e9), ("4K", 4e3), (42, 42.0),
])
def test_parse_count(text: str, value: float) -> None:
    assert parse_count(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["-7B", "0", "0B", "seven", "7X", "", "7BB", "nan", True])
def test_parse_count_rejects_nonsense_naming_the_value(text: object) -> None:
    with pytest.raises(PlanError, match="--params"):
        parse_count(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("text, gb", [
    ("80GB", 80.0), ("80gb", 80.0), ("40", 40.0), ("80GiB", 80 * 2**30 / 1e9),
    ("0.5TB", 500.0), ("24000MB", 24.0), ("1TiB", 2**40 / 1e9),
])
def test_parse_gb_is_si_with_exact_binary_units(text: str, gb: float) -> None:
    assert parse_gb(text) == pytest.approx(gb)


@pytest.mark.parametrize("text", ["-80GB", "0GB", "80 potatoes", "GB", "inf"])
def test_parse_gb_rejects_nonsense(text: str) -> None:
    with pytest.raises(PlanError, match=r"--gpu-mem=.*e\.g\. 80GB"):
        parse_gb(text)


@given(st.floats(min_value=1e3, max_value=1e15))
def test_human_count_parses_back_within_display_precision(value: float) -> None:
    assert parse_count(human_count(value)) == pytest.approx(value, rel=1e-3)


@pytest.mark.parametrize("params, layers, hidden, heads, name", KNOWN_SHAPES)
def test_known_sizes_assume_the_published_shape_and_say_so(params, layers, hidden, heads,
                                                           name) -> None:
    arch = resolve_arch(params, None, None, None)
    assert (arch.layers, arch.hidden, arch.heads) == (layers, hidden, heads)
    assert name in arch.assumed and "--layers --hidden --heads" in arch.assumed


@given(st.floats(min_value=1e7, max_value=1e13))
def test_assumed_shape_is_consistent_and_close_to_the_count(params: float) -> None:
    arch = resolve_arch(params, None, None, None)
    assert arch.hidden % arch.heads == 0
    # 12 L h^2 is the transformer-layer count; within 2.5x covers the known shapes'
    # embeddings and rounding
    assert 0.4 < arch.layers * arch.layer_params() / params < 2.5


def test_given_shape_is_used_and_not_called_assumed() -> None:
    arch = resolve_arch(7e9, 30, 4000, 40)
    assert (arch.layers, arch.hidden, arch.heads, arch.assumed) == (30, 4000, 40, "")


def test_partial_shape_keeps_heads_consistent_with_hidden() -> None:
    arch = resolve_arch(7e9, None, 3072, None)
    assert arch.hidden == 3072 and arch.hidden % arch.heads == 0
    assert "layers, heads assumed" in arch.assumed


@pytest.mark.parametrize("kwargs, match", [
    ({"layers": 0}, "--layers=0"), ({"heads": -1}, "--heads=-1"),
    ({"hidden": 100, "heads": 3}, "not divisible by --heads=3"),
])
def test_bad_shapes_are_refused(kwargs: dict, match: str) -> None:
    args = {"layers": None, "hidden": None, "heads": None, **kwargs}
    with pytest.raises(PlanError, match=match):
        resolve_arch(7e9, args["layers"], args["hidden"], args["heads"])
