"""Type checking of configuration values against hints, TOML paths and suggestions."""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import pytest

from datarax.config.schema import (
    ConfigError,
    FieldError,
    Problems,
    build_dataclass,
    convert,
    describe_hint,
    format_path,
    suggestion,
)

# (value, hint, expected converted value); expected values are written out by hand.
ACCEPTED = [
    (3, int, 3),
    (3, float, 3.0),
    (2.5, float, 2.5),
    (True, bool, True),
    ("x", str, "x"),
    ([1, 2], tuple[int, ...], (1, 2)),
    ([1, 2.5], tuple[float, float], (1.0, 2.5)),
    ([1, 2], list[int], [1, 2]),
    (["a"], Sequence[str], ("a",)),
    ({"a": 1}, dict[str, float], {"a": 1.0}),
    ({"a": 1}, Mapping[str, Any], {"a": 1}),
    (4, int | None, 4),
    (3, bool | int | float | None, 3),
    (0.9, bool | int | float | None, 0.9),
    ("a", int | str, "a"),
    (True, bool | tuple[str, ...], True),
    (["max_delta"], bool | tuple[str, ...], ("max_delta",)),
    ("reflect", Literal["constant", "reflect"], "reflect"),
    ({"anything": [1]}, Any, {"anything": [1]}),
]

# (value, hint, the words the message must contain)
REJECTED = [
    ("high", float, "must be a number, got 'high'"),
    (True, int, "must be an integer, got True"),
    (True, float, "must be a number, got True"),
    (1, bool, "must be true or false, got 1"),
    (3, str, "must be a string, got 3"),
    ([1, 2, 3], tuple[float, float], "must be a list of 2 items (a number, a number), got [1, 2, 3]"),
    ("abc", list[int], "must be a list of integers, got 'abc'"),
    ("wrap", Literal["constant", "reflect"], "must be one of 'constant', 'reflect', got 'wrap'"),
    ([1], int | str, "must be an integer or a string, got [1]"),
    (3, Callable, "must be an import path 'package.module:function', got 3"),
    # A union of numbers that lists bool (optax's Numeric, e.g. sgd's momentum) takes no true/false.
    (True, bool | int | float | None, "must be a number, got True"),
    (False, bool | int, "must be an integer, got False"),
]


@pytest.mark.parametrize("value,hint,expected", ACCEPTED)
def test_convert_accepts_and_normalises(value, hint, expected):
    problems = Problems()
    out = convert(value, hint, ("k",), problems)
    assert not problems.items
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize("value,hint,words", REJECTED)
def test_convert_rejects_with_the_path(value, hint, words):
    problems = Problems()
    convert(value, hint, ("stages", 2, "brightness", "max_delta"), problems)
    assert problems.items == [f"stages[2].brightness.max_delta {words}"]


def test_items_of_a_list_are_reported_at_their_index():
    problems = Problems()
    convert([1.0, "x", 2.0], tuple[float, ...], ("normalize", "mean"), problems)
    assert problems.items == ["normalize.mean[1] must be a number, got 'x'"]


@pytest.mark.parametrize("path,text", [
    (("batch_size",), "batch_size"),
    (("stages", 0, "element", "fn"), "stages[0].element.fn"),
    (("dag", "nodes", "my node", "inputs", 1), 'dag.nodes."my node".inputs[1]'),
    (("stages", 1, "pkg.mod:Op"), 'stages[1]."pkg.mod:Op"'),
    ((), "(top level)"),
])
def test_format_path_writes_toml_paths(path, text):
    assert format_path(path) == text


def test_suggestion_names_the_closest_choice_or_nothing():
    assert suggestion("max_detla", ["max_delta", "field"]) == "; did you mean 'max_delta'?"
    assert suggestion("zzz", ["max_delta", "field"]) == ""


@pytest.mark.parametrize("hint,words", [
    (tuple[float, ...], "a list of numbers"),
    (int | None, "an integer"),
    (dict[str, int], "a table"),
    (bool | tuple[str, ...], "true or false or a list of strings"),
    (int | float, "a number"),
    (bool | int | float | None, "a number"),
    (bool | None, "true or false"),
])
def test_describe_hint(hint, words):
    assert describe_hint(hint) == words


@dataclasses.dataclass(frozen=True)
class Section:
    size: int
    scale: float = 1.0
    name: str = "x"

    def __post_init__(self):
        if self.size < 1:
            raise FieldError("size", f"must be >= 1, got {self.size}")
        if self.scale > 10:
            raise ValueError(f"Section.scale must be <= 10, got {self.scale}")


def test_build_dataclass_reports_every_kind_of_problem_at_its_path():
    problems = Problems("f.toml")
    build_dataclass(Section, {"size": 1, "scael": 2.0, "name": 3}, ("sec",), problems)
    build_dataclass(Section, {"scale": 1.0}, ("missing",), problems)
    build_dataclass(Section, {"size": 0}, ("low",), problems)
    build_dataclass(Section, {"size": 2, "scale": 50}, ("high",), problems)
    assert problems.items == [
        "sec.scael is not a known key; did you mean 'scale'? (known: name, scale, size)",
        "sec.name must be a string, got 3",
        "missing.size is required (an integer) but missing",
        "low.size must be >= 1, got 0",
        "high.scale is rejected by Section: Section.scale must be <= 10, got 50.0",
    ]
    with pytest.raises(ConfigError, match=r"f\.toml: 5 problems:\n  sec\.scael is not a known key"):
        problems.raise_if_any()


def test_range_checks_still_run_when_another_field_has_the_wrong_type():
    problems = Problems()
    build_dataclass(Section, {"size": 0, "name": 3}, (), problems)
    assert problems.items == ["name must be a string, got 3", "size must be >= 1, got 0"]


def test_build_dataclass_returns_the_instance_when_all_is_well():
    problems = Problems()
    assert build_dataclass(Section, {"size": 2, "scale": 3}, (), problems) == Section(2, 3.0)
    assert not problems.items
