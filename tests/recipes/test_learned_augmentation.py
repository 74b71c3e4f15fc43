"""The learned-augmentation recipe's --quick run: all three policies beat chance; learned values stay in bounds."""

from __future__ import annotations

from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_reports_three_policies_and_the_learned_magnitudes(tmp_path):
    result, stdout = run_recipe("learned_augmentation", tmp_path)
    metrics = assert_finite_metrics(result)
    for policy in ("none", "fixed", "learned"):
        assert metrics[f"{policy}_accuracy_mean"] > 3 * metrics["chance_accuracy"], policy
    learned = result["learned_policy"]
    assert 0 < learned["Affine.degrees"]["mean"] < 180 and 0 < learned["Affine.translate"]["mean"] < 1
    probabilities = learned["selection_probabilities"]
    assert set(probabilities) == {"identity", "blur", "hflip"} and abs(sum(probabilities.values()) - 1) < 1e-5
    history = [r for r in result["runs"] if r["policy"] == "learned"][0]["history"]
    assert history[0]["step"] == 1 and history[-1]["step"] == result["runs"][0]["run"]["step"]
    assert_plot(result)
    assert "the learned policy" in stdout
