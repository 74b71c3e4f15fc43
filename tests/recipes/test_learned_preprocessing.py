"""The learned-preprocessing recipe's --quick run: image and audio front ends beat chance."""

from __future__ import annotations

import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_trains_every_front_end_on_every_seed(tmp_path):
    result, stdout = run_recipe("learned_preprocessing", tmp_path)
    metrics = assert_finite_metrics(result)
    chance = metrics["chance_accuracy"]
    seeds = result["config"]["seeds"]
    assert len(seeds) == 2
    for key in ("image_fixed_accuracy", "image_learned_accuracy", "image_oracle_accuracy",
                "audio_log_mel_matched_accuracy", "audio_log_mel_normalised_matched_accuracy",
                "audio_pcen_learned_matched_accuracy", "audio_pcen_learned_mean_accuracy"):
        assert metrics[key] > chance + 0.1, key
    image = result["image"]
    for name, table in image["table"].items():
        per_seed = [next(r for r in image["runs"][str(s)] if r["front_end"] == name)["test_accuracy"] for s in seeds]
        assert table["values"] == per_seed
    fixed, learned = image["table"]["fixed"]["values"], image["table"]["learned"]["values"]
    assert image["paired"]["learned - fixed"]["values"] == pytest.approx([a - b for a, b in zip(learned, fixed)])
    audio = result["audio"]
    condition = "gain +15 dB, snr 10 dB"
    diff = audio["paired_conditions"]["pcen (learned) - log-mel"][condition]
    runs = {name: [next(r for r in audio["runs"][str(s)] if r["front_end"] == name)["accuracy"][condition]
                   for s in seeds] for name in ("pcen (learned)", "log-mel")}
    assert diff["values"] == pytest.approx([a - b for a, b in zip(runs["pcen (learned)"], runs["log-mel"])])
    learned_values = image["runs"][str(seeds[0])][1]["learned"]
    assert len(learned_values["matrix"]) == 3 and all(0 < g for g in learned_values["gamma"])
    assert "per condition" in stdout
    assert_plot(result)


def test_the_oracle_undoes_the_corruption_up_to_noise_and_quantisation(monkeypatch):
    import numpy as np

    from recipes import preprocessing_image as image

    rng = np.random.default_rng(0)
    clean = rng.uniform(0.2, 1.0, (64, 4, 4, 3))
    monkeypatch.setattr(image, "NOISE_STD", 0.0)  # quantisation only
    corrupted, exposure = image.corrupt(clean, rng)
    restored = np.asarray(image.uncorrupt(corrupted / 255.0, exposure[:, None, None, None]))
    # 8-bit steps of the corrupted image, scaled back through the inverse: a few hundredths at most.
    assert np.abs(restored - clean).max() < 0.05
    assert np.abs(corrupted / 255.0 - clean).mean() > 0.1  # and the corruption itself was large


def test_mean_normalised_log_mel_ignores_a_playback_gain():
    import jax.numpy as jnp
    import numpy as np

    from datarax.core.element import Element
    from recipes import preprocessing_audio as audio

    log_mel = jnp.asarray(np.random.default_rng(1).uniform(-60, 0, (32, 20)), jnp.float32)
    a = audio.mean_normalised(Element(data={"log_mel": log_mel}))
    b = audio.mean_normalised(Element(data={"log_mel": log_mel + 15.0}))  # +15 dB
    np.testing.assert_allclose(np.asarray(a.data["image"]), np.asarray(b.data["image"]), atol=1e-5)
