"""The DDSP recipe: the --quick run's structure (instruments, arms, seeds, paired differences), the DDSP
metrics (f0 and loudness L1) on signals with known answers, the out-of-class instruments, and the noise
streams (the held-out notes' noise is neither the decoder's nor the training notes')."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe

SR = 8000


def test_quick_run_structure(tmp_path):
    # 5 training steps a run (the quick run's 20 only train further): nothing below depends on how far
    # the decoders trained, and the untrained and true-control arms train nothing.
    result, stdout = run_recipe("audio_synthesis", tmp_path, "--steps", "5")
    metrics = assert_finite_metrics(result)
    seeds = result["seeds"]
    assert seeds == [0, 1] and result["config"]["instruments"] == ["ddsp", "karplus"]
    expected_arms = {"ddsp": {"untrained", "constant", "decoder", "mean_timbre", "true_controls"},
                     "karplus": {"untrained", "constant", "decoder"}}
    for instrument, arms in expected_arms.items():
        per_seed = result["details"][instrument]["per_seed"]
        summary = result["summary"][instrument]
        assert set(per_seed) == arms and set(summary["arms"]) == arms
        runs = {f"seed{s}/{a}" for s in seeds for a in ("constant", "decoder")}
        assert set(result["details"][instrument]["runs"]) == runs
        for arm in arms:
            for name in ("spectral_loss", "loudness_l1_db"):
                values = per_seed[arm][name]
                assert len(values) == len(seeds) and all(np.isfinite(values)), (instrument, arm, name)
                assert summary["arms"][arm][name]["mean"] == pytest.approx(np.mean(values))
                assert summary["arms"][arm][name]["half"] > 0 or np.ptp(values) == 0
        bases = ["constant", "mean_timbre"] if instrument == "ddsp" else ["constant"]
        assert set(summary["paired"]) == {f"decoder - {b}" for b in bases}
        for base in bases:
            for name, diff in summary["paired"][f"decoder - {base}"].items():
                expected = np.subtract(per_seed["decoder"][name], per_seed[base][name])
                np.testing.assert_allclose(diff["values"], expected, rtol=1e-12, atol=1e-12)
                assert diff["mean"] == pytest.approx(expected.mean())
                assert metrics[f"{instrument}.decoder-{base}.{name}"] == pytest.approx(diff["mean"])
                assert diff["positive"] + diff["negative"] <= len(seeds)
        assert f"instrument {instrument}" in stdout
    ddsp = result["details"]["ddsp"]["per_seed"]
    # A perfect decoder's noise is independent of the target's: the true controls score well above 0, and
    # play the true harmonics (correlation 1) at the notes' pitch.
    for true, untrained in zip(ddsp["true_controls"]["spectral_loss"], ddsp["untrained"]["spectral_loss"]):
        assert 0.5 < true < untrained
    assert min(ddsp["true_controls"]["harmonic_correlation"]) > 0.999
    assert max(ddsp["true_controls"]["f0_l1_cents"]) < 20
    assert "harmonic_correlation" not in result["summary"]["karplus"]["arms"]["decoder"]  # no ground truth there
    assert result["pyin_s"] > 0 and "pyin:" in stdout
    assert len(result["wav_files"]) == 12
    for path in result["wav_files"]:
        with wave.open(str(Path(path))) as f:
            assert f.getnchannels() == 1 and f.getsampwidth() == 2 and f.getnframes() > 1000
    assert_plot(result)


def sine(f0: float, seconds: float = 0.4, amplitude: float = 0.3) -> np.ndarray:
    return amplitude * np.sin(2 * np.pi * f0 * np.arange(int(seconds * SR)) / SR)


def test_f0_l1_is_zero_for_identical_audio_and_100_cents_for_a_semitone():
    from recipes import ddsp

    a, b = np.stack([sine(220.0), sine(330.0)]), np.stack([sine(233.08), sine(349.23)])  # each a semitone up
    same = ddsp.f0_l1_cents(a, a)
    assert same["cents"] == 0.0 and same["voiced_both"] > 0.9
    shifted = ddsp.f0_l1_cents(a, b)
    assert shifted["voiced_both"] > 0.9
    assert shifted["cents"] == pytest.approx(100.0, abs=10.0)  # pyin's pitch grid is 10 cents
    # From tracks: a frame unvoiced in either track is left out, and no common voiced frame gives NaN.
    f0, voiced = np.array([[220.0, 220.0, np.nan]]), np.array([[True, True, False]])
    other = (np.array([[440.0, np.nan, np.nan]]), np.array([[True, False, False]]))
    assert ddsp.f0_l1_from_tracks((f0, voiced), other) == {"cents": 1200.0, "voiced_both": pytest.approx(1 / 3)}
    assert np.isnan(ddsp.f0_l1_from_tracks((f0, voiced), (f0, np.zeros_like(voiced)))["cents"])


def test_loudness_l1_is_zero_for_identical_audio_and_6_db_for_double_amplitude():
    from recipes import ddsp

    noise = np.random.default_rng(0).standard_normal((2, 3200)).astype(np.float32)  # every bin above the floor
    assert ddsp.loudness_l1_db(noise, noise) == 0.0
    assert ddsp.loudness_l1_db(noise, 2 * noise) == pytest.approx(20 * np.log10(2), abs=0.05)
    # The same frames as the pipeline's LoudnessOperator (one per hop, plus one).
    assert np.asarray(ddsp.frame_loudness(noise)).shape == (2, 3200 // ddsp.HOP + 1)


def test_karplus_strong_sounds_at_the_given_f0_and_fm_is_not_harmonic():
    from recipes import ddsp

    notes = ddsp.instrument_notes("karplus", 4, seed=3)
    assert notes["audio"].shape == (4, ddsp.FRAMES * ddsp.HOP) and notes["f0_hz"].shape == (4, ddsp.FRAMES)
    np.testing.assert_allclose(np.abs(notes["audio"]).max(axis=1), ddsp.make_notes(4, 3)["amplitude"].max(axis=1),
                               rtol=1e-5)
    f0, voiced = ddsp.pitch_track(notes["audio"])
    for i in range(4):
        assert voiced[i].mean() > 0.8
        assert abs(1200 * np.log2(np.nanmedian(f0[i]) / notes["f0_hz"][i, 0])) < 15  # within pyin's grid
    # FM with a sqrt(2) ratio and a small index: the strongest partials at f0 and f0 * (1 +- sqrt(2)).
    fm = ddsp.render_fm({"f0_hz": np.full((1, ddsp.FRAMES), 200.0, np.float32),
                         "amplitude": np.full((1, ddsp.FRAMES), 0.5, np.float32)}, seed=0)[0]
    spectrum = np.abs(np.fft.rfft(fm * np.hanning(len(fm))))
    freqs = np.fft.rfftfreq(len(fm), 1 / SR)
    peaks = sorted(freqs[np.argsort(spectrum)[-60:]])
    for partial in (200.0, 200.0 * (1 + np.sqrt(2)), 200.0 * (np.sqrt(2) - 1)):
        assert min(abs(p - partial) for p in peaks) < 5
    with pytest.raises(ValueError, match="with_reverb"):
        ddsp.note_pipeline(ddsp.instrument_notes("fm", 2, 0), 0, 2, split="eval", with_reverb=True)
    with pytest.raises(ValueError, match="instrument must be one of"):
        ddsp.instrument_notes("piano", 2, 0)


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
    noise = ddsp.Decoder(16, seed=seed).noise(Element(magnitudes), BatchContext.for_batch(4))
    decoder = np.asarray(noise.data["noise"])
    assert np.abs(held_out[0]).max() > 1e-4  # there is noise to compare
    for other in (training, decoder):
        # Same note, same filter: only the white noise under it can differ, and it must, sample by sample.
        assert np.abs(other[0] - held_out[0]).max() > 0.1 * np.abs(held_out[0]).max()
        assert abs(np.corrcoef(other[0], held_out[0])[0, 1]) < 0.2
    np.testing.assert_array_equal(rendered_noise(notes, seed, "eval"), held_out)  # a fresh pipeline: the same audio
