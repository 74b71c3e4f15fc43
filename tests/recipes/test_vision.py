"""The vision recipe's --quick run: accuracy far above chance, throughput and goodput reported, resumable."""

from __future__ import annotations

from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe

QUICK_STEPS = 150  # recipes.vision.QUICK["steps"]


def test_quick_run_then_rerun_resumes_from_its_checkpoint(tmp_path):
    result, stdout = run_recipe("vision", tmp_path)
    metrics = assert_finite_metrics(result)
    assert metrics["test_accuracy"] > 0.5 > metrics["chance_accuracy"]
    assert metrics["train_el_per_s"] > 0 and metrics["pipeline_el_per_s"] > 0
    assert result["run"]["step"] == QUICK_STEPS and result["run"]["resumed_from"] is None
    assert result["run"]["goodput"]["buckets_pct"]["goodput"] > 0
    assert_plot(result)
    for text in ("test accuracy", "throughput", "goodput:"):
        assert text in stdout

    # The same workdir with a larger step target continues from the saved checkpoint.
    resumed, stdout = run_recipe("vision", tmp_path, "--steps", str(QUICK_STEPS + 10))
    assert resumed["run"]["resumed_from"] == QUICK_STEPS and resumed["run"]["step"] == QUICK_STEPS + 10
    assert f"resumed from checkpoint step {QUICK_STEPS}" in stdout
    assert resumed["metrics"]["test_accuracy"] > 0.5
