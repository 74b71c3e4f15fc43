"""The learned-preprocessing recipe's --quick run: image and audio front ends beat chance."""

from __future__ import annotations

from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_trains_image_and_audio_front_ends(tmp_path):
    result, _ = run_recipe("learned_preprocessing", tmp_path)
    metrics = assert_finite_metrics(result)
    chance = metrics["chance_accuracy"]
    for key in ("image_fixed_accuracy", "image_learned_accuracy", "audio_log_mel_matched_accuracy",
                "audio_pcen_learned_matched_accuracy", "audio_pcen_learned_mean_accuracy"):
        assert metrics[key] > chance + 0.1, key
    learned = next(r for r in result["image"] if r["front_end"] == "learned")["learned"]
    assert len(learned["matrix"]) == 3 and all(0 < g for g in learned["gamma"])
    pcen = next(r for r in result["audio"] if r["front_end"] == "pcen (learned)")["learned"]
    assert 0 < pcen["alpha"]["min"] <= pcen["alpha"]["max"] < 1
    assert_plot(result)
