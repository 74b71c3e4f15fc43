"""The learned-augmentation recipe's --quick run: every method at every hidden range, the table, widths, costs, plot."""

from __future__ import annotations

import math

from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe

METHODS = ("none", "grid", "learned", "learned_tta")


def test_quick_run_reports_the_table_over_hidden_ranges_and_methods(tmp_path):
    result, stdout = run_recipe("learned_augmentation", tmp_path)
    metrics = assert_finite_metrics(result)
    config = result["config"]
    ranges = [f"{t:g}" for t in config["hidden_ranges"]]
    assert set(result["table"]) == set(ranges)
    for t in ranges:
        row = result["table"][t]
        assert set(row["test"]) == set(METHODS)
        for method in METHODS:
            stats = row["test"][method]
            assert stats["n"] == len(config["seeds"])
            assert metrics[f"T{t}_{method}_test_accuracy_mean"] == stats["mean"]
            assert stats["mean"] > 3 * metrics["chance_accuracy"], (t, method)
        width = row["learned_width_degrees"]["mean"]
        assert 0.0 <= width <= 180.0, width
        assert row["grid_ranges"][0] in config["grid"] and row["lams"][0] in config["lambdas"]
        costs = row["cost_s"]
        assert all(math.isfinite(costs[m]["mean"]) and costs[m]["mean"] > 0 for m in ("none", "grid", "learned"))
        # The grid's cost covers all its trainings, the none run (its r = 0 point) included.
        assert costs["grid"]["mean"] > costs["none"]["mean"]
        assert row["steps"]["grid"] == len(config["grid"]) * config["steps"]
    runs = result["runs"]
    expected = len(ranges) * len(config["seeds"]) * (len(config["grid"]) + len(config["lambdas"]))
    assert len(runs) == expected
    history = result["histories"][ranges[0]]
    assert history[0]["step"] == 1 and history[-1]["step"] == config["steps"]
    assert_plot(result)
    assert "paired differences" in stdout and "learned / grid" in stdout
