"""The HF fine-tuning recipe's --quick run: Parquet in, Orbax export out, both fine-tuning arms beat chance."""

from __future__ import annotations

from pathlib import Path

from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_pretrains_exports_and_fine_tunes(tmp_path):
    result, stdout = run_recipe("hf_finetune", tmp_path)
    metrics = assert_finite_metrics(result)
    chance = metrics["parity_chance_accuracy"]
    assert metrics["parity_pretrain_test_accuracy"] > 0.5  # ten classes: chance is 0.1
    for key in ("parity_finetuned_accuracy_mean", "parity_scratch_accuracy_mean"):
        assert metrics[key] > chance + 0.1, key
    assert Path(result["pairs"]["parity"]["export"]).is_dir()
    assert len(result["data_files"]) == 4 and all(p.endswith(".parquet") for p in result["data_files"])
    assert "fine-tuning" in stdout
    assert_plot(result)
