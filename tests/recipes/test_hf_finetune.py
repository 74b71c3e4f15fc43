"""The HF fine-tuning recipe's --quick run: HF Image parquet in, Orbax export out, both fine-tuning arms beat chance."""

from __future__ import annotations

from pathlib import Path

import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_pretrains_exports_and_fine_tunes(tmp_path):
    result, stdout = run_recipe("hf_finetune", tmp_path)
    metrics = assert_finite_metrics(result)
    assert metrics["pretrain_test_accuracy"] > metrics["pretrain_chance_accuracy"] + 0.2  # six photographs
    chance = metrics["photos_chance_accuracy"]
    for key in ("photos_finetuned_accuracy_mean", "photos_scratch_accuracy_mean"):
        assert metrics[key] > chance + 0.1, key
    assert Path(result["pretrain"]["export"]).is_dir()
    [row] = result["tasks"]["photos"]["per_seed"]
    assert row["seed"] == 0 and row["difference"] == row["fine_tuned"] - row["scratch"]
    assert len(result["data_files"]) == 4 and all(p.endswith(".parquet") for p in result["data_files"])
    assert "fine-tuned" in stdout and "difference" in stdout
    assert_plot(result)


def test_the_parquet_holds_an_hf_image_feature_of_jpeg_bytes(tmp_path):
    import datasets

    from recipes.hf_finetune import TASKS, write_task

    files = write_task(tmp_path, "photos", seed=3)
    train = datasets.Dataset.from_parquet(str(files["train"]))
    assert isinstance(train.features["image"], datasets.Image)
    first = train.cast_column("image", datasets.Image(decode=False))[0]["image"]
    assert first["bytes"][:2] == b"\xff\xd8" and first["path"].endswith(".jpg")  # a JPEG, named for its photograph
    assert sorted(set(train["label"])) == list(range(len(TASKS["photos"])))


@pytest.mark.parametrize("differences, verdict", [
    ([0.05], "one seed"),
    ([0.08, 0.10, 0.11], ("fine-tuning beats training from scratch on every seed (per-seed differences +0.0800 "
                          "to +0.1100)")),
    ([-0.02, -0.01, -0.5], "training from scratch beats fine-tuning on every seed"),  # mean +- std covers zero
    ([-0.025, 0.0, -0.045], "no measurable difference (per-seed differences -0.0450 to +0.0000 cover zero)"),
    ([-0.025, -7.15e-9, -0.045], "no measurable difference"),  # 359/400 vs 359/400 in float32: a tie
    ([0.0025, 0.005, 0.0025], "fine-tuning beats"),  # one test patch in 400 is a difference
    ([0.05, -0.04, 0.01], "no measurable difference"),
    ([0.02, 0.02, -0.001, 0.03, 0.02], "no measurable difference"),  # mean - std > 0, but one seed disagrees
])
def test_a_difference_counts_only_when_every_seed_finds_it_with_the_same_sign(differences, verdict):
    from recipes.hf_finetune import verdict as judge

    assert judge(differences).startswith(verdict)
