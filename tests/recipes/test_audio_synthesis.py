"""The DDSP recipe's --quick run: the loss falls, harmonics are recovered better than untrained, WAVs written."""

from __future__ import annotations

import wave
from pathlib import Path

from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_lowers_the_loss_and_writes_wav_files(tmp_path):
    result, _ = run_recipe("audio_synthesis", tmp_path)
    metrics = assert_finite_metrics(result)
    assert metrics["eval_loss"] < metrics["eval_loss_untrained"]
    assert metrics["harmonic_correlation"] > max(metrics["harmonic_correlation_untrained"], 0.3)
    assert len(result["wav_files"]) == 6
    for path in result["wav_files"]:
        with wave.open(str(Path(path))) as f:
            assert f.getnchannels() == 1 and f.getsampwidth() == 2 and f.getnframes() > 1000
    assert_plot(result)
