"""The HF fine-tuning recipe: its --quick run's structure (not its values), and its pieces against references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_pretrains_exports_selects_on_validation_and_compares_four_arms(tmp_path):
    from recipes.hf_finetune import ARMS, COMPARISONS, QUICK

    result, stdout = run_recipe("hf_finetune", tmp_path)
    metrics = assert_finite_metrics(result)
    assert metrics["pretrain_test_accuracy"] > metrics["pretrain_chance_accuracy"] + 0.2  # six photographs
    pretrain = result["pretrain"]
    assert Path(pretrain["orbax_export"]).is_dir() and Path(pretrain["safetensors_export"]).is_file()
    assert pretrain["export_check"]["equal"] and metrics["export_max_abs_logit_difference"] == 0.0
    assert abs(pretrain["test_accuracy_from_logits"] - pretrain["test_accuracy"]) < 1e-6  # the model was trained

    task = result["tasks"]["photos"]
    seeds = task["seeds"]
    assert seeds == [0, 1] and task["selection_seed"] not in seeds and task["colour_cue"] is True
    grid = [(lr, wd) for lr in QUICK["lr_grid"] for wd in QUICK["wd_grid"]]
    for arm in ARMS:
        # The same grid for every arm, and the chosen setting is the validation-best of it.
        tried = task["selection"][arm]
        assert [(r["learning_rate"], r["weight_decay"]) for r in tried] == grid
        best = max(tried, key=lambda r: r["accuracy"])
        assert (task["chosen"][arm]["learning_rate"], task["chosen"][arm]["weight_decay"]) == \
               (best["learning_rate"], best["weight_decay"])
        assert task["cost"][arm]["runs"] == len(grid) + len(seeds)
        assert task["cost"][arm]["steps"] == task["cost"]["scratch"]["steps"]
        stats = task["accuracy"][arm]
        assert len(stats["per_seed"]) == len(seeds) and stats["low"] <= stats["mean"] <= stats["high"]
        assert stats["mean"] > task["chance_accuracy"] + 0.1, arm
    # The frozen arms train fewer parameters than the full ones.
    trained = {arm: task["cost"][arm]["trained_parameters"] for arm in ARMS}
    assert trained["probe"] < trained["lora"] < trained["finetune"] == trained["scratch"]
    assert set(task["paired"]) == {f"{a}-{b}" for a, b in COMPARISONS}
    for a, b in COMPARISONS:
        paired = task["paired"][f"{a}-{b}"]
        assert paired["per_seed"] == [x - y for x, y in zip(task["accuracy"][a]["per_seed"],
                                                            task["accuracy"][b]["per_seed"])]
        assert paired["t_interval"]["mean"] == pytest.approx(np.mean(paired["per_seed"]), abs=1e-12)
        boot = paired["cell_bootstrap"]
        assert boot["estimate"] == pytest.approx(paired["t_interval"]["mean"], abs=1e-9)  # same test patches
        assert boot["low"] <= boot["estimate"] <= boot["high"]
        assert len(paired["signs"]) == len(seeds)
    assert set(task["distinct_cells"]["test"]) == set(task["classes"])
    assert all(n >= 10 for n in task["distinct_cells"]["test"].values())
    assert len(result["data_files"]) == 2 + 3 + 2  # pretrain train/test; val, test, selection seed; two seeds
    assert "t-interval" in stdout and "cell bootstrap" in stdout and "chosen on validation" in stdout
    assert_plot(result)


def test_test_validation_and_training_cells_are_disjoint_and_cover_the_grid():
    from recipes.hf_finetune import split_cells

    for rows, cols in ((9, 12), (13, 20), (16, 16)):
        cells = split_cells(rows, cols)
        together = np.concatenate([cells["test"], cells["val"], cells["train"]])
        assert sorted(together.tolist()) == list(range(rows * cols))  # disjoint and complete
        assert len(cells["test"]) == round(0.25 * rows * cols) and len(cells["val"]) == round(0.15 * rows * cols)


def test_the_parquet_holds_an_hf_image_feature_and_the_cells_of_each_split(tmp_path):
    import datasets

    from recipes.hf_finetune import CELL, TASKS, write_task

    files = write_task(tmp_path, "photos_gray", seed=3)
    train = datasets.Dataset.from_parquet(str(files["train"]))
    assert isinstance(train.features["image"], datasets.Image)
    first = train.cast_column("image", datasets.Image(decode=False))[0]["image"]
    assert first["bytes"][:2] == b"\xff\xd8" and first["path"].endswith(".jpg")  # a JPEG, named for its photograph
    assert sorted(set(train["label"])) == list(range(len(TASKS["photos_gray"][0])))
    cells = {split: set(zip(*[datasets.Dataset.from_parquet(str(files[split]))[k] for k in ("label", "cell")]))
             for split in ("train", "val", "test")}
    assert not cells["train"] & cells["val"] and not cells["train"] & cells["test"] and not cells["val"] & cells["test"]
    image = train[0]["image"]
    assert image.mode == "L" and max(image.size) <= CELL  # the grayscale task: no colour left


def test_the_safetensors_export_reloads_to_the_same_network(tmp_path):
    import jax.numpy as jnp

    from datarax.train.pretrained import export_table, load_safetensors, load_table, save_safetensors
    from recipes.hf_finetune import convnet_table, new_model

    model, other = new_model(6, seed=0), new_model(6, seed=5)
    tensors = export_table(model, convnet_table(model))
    assert tensors["convs.0.weight"].shape == (32, 3, 3, 3) and tensors["hidden.weight"].shape[0] == 128  # torch layout
    save_safetensors(tensors, tmp_path / "m.safetensors")
    load_table(other, load_safetensors(tmp_path / "m.safetensors"), convnet_table(other))
    x = jnp.asarray(np.random.default_rng(0).random((5, 24, 24, 3), np.float32))
    assert np.array_equal(np.asarray(model(x)), np.asarray(other(x)))


@pytest.mark.parametrize("learning_rate, weight_decay", [(1e-3, 1e-4), (1e-2, 0.1)])
def test_the_injected_adamw_equals_optax_adamw_with_the_schedule(learning_rate, weight_decay):
    import jax.numpy as jnp
    import optax

    from recipes.hf_finetune import adamw

    steps = 40
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, steps // 20, steps)
    ours, reference = adamw(learning_rate, weight_decay, steps), optax.adamw(schedule, weight_decay=weight_decay)
    params = {"w": jnp.linspace(-1.0, 1.0, 7)}
    p1, p2, s1, s2 = params, params, ours.init(params), reference.init(params)
    for step in range(steps):
        grads = {"w": jnp.sin(p1["w"] * (step + 1))}
        u1, s1 = ours.update(grads, s1, p1)
        u2, s2 = reference.update(grads, s2, p2)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    np.testing.assert_allclose(p1["w"], p2["w"], rtol=1e-6, atol=1e-7)


def test_the_t_interval_is_scipys():
    from scipy import stats

    from recipes.hf_finetune import t_interval

    values = [0.02, -0.01, 0.05, 0.03, 0.0]
    got = t_interval(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert got["low"] == pytest.approx(low, abs=1e-12) and got["high"] == pytest.approx(high, abs=1e-12)


def test_the_cell_bootstrap_matches_a_plain_resampling_loop():
    from recipes.hf_finetune import cell_bootstrap

    rng = np.random.default_rng(1)
    labels = np.repeat([0, 1, 2], 40)
    cells = rng.integers(0, 12, size=labels.size)  # cell ids repeat across classes: a cell is (label, cell)
    a, b = rng.random((3, labels.size)) < 0.7, rng.random((3, labels.size)) < 0.5
    got = cell_bootstrap(a, b, labels, cells, draws=4000, seed=0)
    diff = (a.astype(float) - b).mean(axis=0)
    assert got["estimate"] == pytest.approx(diff.mean())
    assert got["cells"] == len(set(zip(labels.tolist(), cells.tolist())))
    # The reference: draw each class's cells with replacement, pool the drawn cells' patches.
    groups = {c: [np.flatnonzero((labels == c) & (cells == k)) for k in np.unique(cells[labels == c])]
              for c in (0, 1, 2)}
    ref_rng, stats = np.random.default_rng(7), []
    for _ in range(4000):
        picked = np.concatenate([members[i] for c, members in groups.items()
                                 for i in ref_rng.integers(0, len(members), len(members))])
        stats.append(diff[picked].mean())
    low, high = np.percentile(stats, [2.5, 97.5])
    assert got["low"] == pytest.approx(low, abs=0.01) and got["high"] == pytest.approx(high, abs=0.01)
    # A difference every patch shares has no spread to resample.
    same = cell_bootstrap(np.ones((2, labels.size), bool), np.zeros((2, labels.size), bool), labels, cells, 100)
    assert same["low"] == same["high"] == same["estimate"] == 1.0


@pytest.mark.parametrize("differences, boot, verdict", [
    ([0.05, 0.06, 0.04, 0.05, 0.07], (0.02, 0.08),
     "higher: t-interval excludes zero (on all 5 seeds; cell bootstrap excludes zero)"),
    ([0.05, 0.06, 0.04, 0.05, 0.07], (-0.01, 0.08), "higher: t-interval excludes zero (on all 5 seeds; cell "
                                                     "bootstrap covers zero)"),
    ([-0.05, -0.06, -0.04, 0.0, -0.07], (-0.08, -0.02), "lower: t-interval excludes zero (on 4 of 5 seeds"),  # a tie
    ([0.05, -0.04, 0.01, 0.02, -0.03], (-0.02, 0.03),
     "no measurable difference: t-interval covers zero (cell bootstrap covers zero)"),
    ([0.13, 0.0025, 0.0325, 0.19, 0.04], (0.03, 0.12), "no measurable difference: t-interval covers zero (cell "
                                                       "bootstrap excludes zero; though all 5 seeds agree in sign)"),
])
def test_the_verdict_is_worded_at_the_strength_of_the_evidence(differences, boot, verdict):
    from recipes.hf_finetune import judge, t_interval

    assert judge(t_interval(differences), {"low": boot[0], "high": boot[1]}, differences).startswith(verdict)
