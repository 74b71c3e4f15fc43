"""The DDSP recipe: the --quick run (the loss falls towards the true controls' loss, harmonics recovered, WAVs
written) and the noise streams (the held-out notes' noise is neither the decoder's nor the training notes')."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_lowers_the_loss_and_writes_wav_files(tmp_path):
    result, stdout = run_recipe("audio_synthesis", tmp_path)
    metrics = assert_finite_metrics(result)
    assert metrics["eval_loss"] < metrics["eval_loss_untrained"]
    # A perfect decoder's noise is independent of the target's, so the true controls score well above 0.
    assert 0.5 < metrics["eval_loss_true_controls"] < metrics["eval_loss_untrained"]
    assert metrics["eval_loss_above_true_controls"] == pytest.approx(
        metrics["eval_loss"] - metrics["eval_loss_true_controls"])
    assert metrics["harmonic_correlation"] > max(metrics["harmonic_correlation_untrained"], 0.3)
    assert "true controls score" in stdout
    assert len(result["wav_files"]) == 6
    for path in result["wav_files"]:
        with wave.open(str(Path(path))) as f:
            assert f.getnchannels() == 1 and f.getsampwidth() == 2 and f.getnframes() > 1000
    assert_plot(result)


def rendered_noise(notes: dict, seed: int, split: str) -> np.ndarray:
    """The breath noise the recipe's `split` pipeline renders for each note, in the notes' order (first pass)."""
    from recipes import ddsp

    batch = next(iter(ddsp.note_pipeline(notes, seed, len(notes["f0_hz"]), split=split, with_reverb=False)))
    # The training pipeline shuffles: find each note by its f0 curve, which is unique to it.
    rows = [int(np.flatnonzero((np.asarray(batch["f0_hz"]) == f0).all(axis=1))[0]) for f0 in notes["f0_hz"]]
    return np.asarray(batch["noise"])[rows]


def test_held_out_noise_is_neither_the_decoders_nor_the_training_noise_and_is_reproducible():
    from datarax.core.element import Element
    from datarax.core.operator import BatchContext
    from recipes import ddsp

    seed = 0  # the recipe's default; the recipe passes its one seed to every pipeline and the decoder
    notes = ddsp.make_notes(4, seed=seed + 1000)
    held_out = rendered_noise(notes, seed, "eval")
    training = rendered_noise(notes, seed, "train")
    magnitudes = {"noise_magnitudes": notes["noise_magnitudes"]}
    decoder = np.asarray(ddsp.Decoder(16, seed=seed).noise(Element(magnitudes), BatchContext.for_batch(4)).data["noise"])
    assert np.abs(held_out[0]).max() > 1e-4  # there is noise to compare
    for other in (training, decoder):
        # Same note, same filter: only the white noise under it can differ, and it must, sample by sample.
        assert np.abs(other[0] - held_out[0]).max() > 0.1 * np.abs(held_out[0]).max()
        assert abs(np.corrcoef(other[0], held_out[0])[0, 1]) < 0.2
    np.testing.assert_array_equal(rendered_noise(notes, seed, "eval"), held_out)  # a fresh pipeline: the same audio
