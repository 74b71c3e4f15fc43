"""The shared argument checks: each message names the argument, shows the value and says the fix."""

import numpy as np
import pytest

from datarax.core.checks import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_positive_int,
    check_probability,
    check_range,
    check_size,
)


@pytest.mark.parametrize("call, error, match", [
    (lambda: check_int(True, "n", 1), ValueError, r"n must be an int >= 1, got True"),
    (lambda: check_int(0, "n", 1, allow_none=True), ValueError, r"n must be an int >= 1 or None, got 0"),
    (lambda: check_int(5, "n", 1, high=4), ValueError, r"n must be an int in \[1, 4\], got 5"),
    (lambda: check_int(1, "k", 2, why=" (pairs)", hint="; e.g. k=2"), ValueError, r"k must be an int >= 2 \(pairs\), "
                                                                                  r"got 1; e.g. k=2"),
    (lambda: check_positive_int(2.0, "rate", unit="Hz"), ValueError, r"rate must be a positive int \(Hz\), got 2.0"),
    (lambda: check_number("3", "x", 0, 1), TypeError, r"x must be a number in \[0, 1\], got '3'"),
    (lambda: check_number(float("nan"), "x", 0, 1), TypeError, r"x must be a number"),
    (lambda: check_number(0.0, "x", 0.0, 1.0, open_low=True), ValueError, r"x must be in \(0.0, 1.0\], got 0.0; pick"),
    (lambda: check_probability(1.5, "p"), ValueError, r"p must be a number in \[0, 1\], got 1.5"),
    (lambda: check_bool(1, "shuffle"), TypeError, r"shuffle must be True or False, got 1"),
    (lambda: check_bool("x", "d", allow_none=True), TypeError, r"d must be None, True or False, got 'x'"),
    (lambda: check_choice("zip", "mode", ("a", "b")), ValueError, r"mode must be one of \('a', 'b'\), got 'zip'"),
    (lambda: check_size((3, 0), "size"), ValueError, r"size must be a positive int or a \(height, width\) pair"),
    (lambda: check_range((0.5, 0.2), "scale", 0.0, 1.0), ValueError,
     r"scale must be a pair \(a, b\) with 0.0 < a <= b"),
])
def test_messages_name_argument_and_value(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("call, expected", [
    (lambda: check_int(np.int64(3), "n", 1), 3),
    (lambda: check_int(None, "n", 1, allow_none=True), None),
    (lambda: check_positive_int(7, "n"), 7),
    (lambda: check_number(2, "x", 0, 3), 2.0),
    (lambda: check_size(4, "size"), (4, 4)),
    (lambda: check_size([2, 3], "size"), (2, 3)),
    (lambda: check_range([0.1, 1], "scale", 0.0, 1.0), (0.1, 1.0)),
])
def test_valid_values_come_back_normalised(call, expected):
    assert call() == expected


def hand_rolled_int_checks(path) -> list[str]:
    """`isinstance(x, bool) ... isinstance(x, int)` in one boolean expression, or `isinstance(x, int)` /
    `isinstance(x, (int, ...))` compared or negated: int checks that bypass `core/checks.py`."""
    import ast

    def isinstance_of(node, name):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2):
            return False
        kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        return any(getattr(k, "id", None) == name for k in kinds)

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BoolOp):
            calls = [n for v in node.values for n in ast.walk(v)]
            if any(isinstance_of(c, "bool") for c in calls) and any(isinstance_of(c, "int") for c in calls):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:80]}")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and isinstance_of(node.operand, "int"):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_no_int_check_is_hand_rolled_outside_core_checks():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "datarax"
    offenders = [hit for path in sorted(root.rglob("*.py")) if path != root / "core" / "checks.py"
                 for hit in hand_rolled_int_checks(path)]
    assert offenders == []


@pytest.mark.parametrize("values, refused", [
    (np.array([0, 2**31 - 1, -(2**31)], np.int64), None),  # int32's whole range fits
    (np.array([0, 2**31], np.int64), 2**31),
    (np.array([-(2**31) - 1], np.int64), -(2**31) - 1),
    (np.array([[1, 2], [3, 2**40]], np.int64), 2**40),
    (np.array([2**32 - 1], np.uint64), None),  # uint64 becomes uint32
    (np.array([2**32], np.uint64), 2**32),
    (np.array([2**40], np.float64), None),  # only 64-bit integers are narrowed
    (np.array([2**31 - 1], np.int32), None),
])
def test_check_int_range_against_numpys_own_wrap(values, refused):
    from datarax.core.checks import IntegerRangeError, check_int_range

    if refused is None:
        check_int_range(values, "Src", "f", fix="cast it")
        return
    narrow = np.int32 if values.dtype.kind == "i" else np.uint32
    wrapped = int(np.asarray(refused, values.dtype).astype(narrow))
    assert wrapped != refused
    with pytest.raises(IntegerRangeError, match=rf"^Src field 'f' holds {refused} \(row \d\), outside .* wrap it to "
                                                rf"{wrapped}\. Fix: .*jax_enable_x64.*; or cast it$"):
        check_int_range(values, "Src", "f", fix="cast it", where=lambda row: f"row {row}")
