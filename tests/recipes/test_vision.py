"""The vision recipe's --quick run: accuracy far above chance, throughput and goodput reported, resumable."""

from __future__ import annotations

import os

import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe

QUICK_STEPS = 150  # recipes.vision.QUICK["steps"]


@pytest.mark.skipif(not os.environ.get("DATARAX_SLOW_TESTS"), reason="a second quick run of the recipe to check its "
                    "resume (about 22 s; the trainer's resume is tested in tests/train); DATARAX_SLOW_TESTS=1 runs it")
def test_quick_run_then_rerun_resumes_from_its_checkpoint(tmp_path):
    result, stdout = run_recipe("vision", tmp_path)
    metrics = assert_finite_metrics(result)
    assert metrics["test_accuracy"] > 0.5 > metrics["chance_accuracy"]
    assert metrics["train_el_per_s"] > 0 and metrics["pipeline_el_per_s"] > 0
    assert result["run"]["step"] == QUICK_STEPS and result["run"]["resumed_from"] is None
    assert result["run"]["goodput"]["buckets_pct"]["goodput"] > 0
    assert_plot(result)
    for text in ("test accuracy", "throughput", "goodput:", "augmented - none", "steady: device busy"):
        assert text in stdout
    assert result["config"]["steps_per_execution"] == 1  # on the CPU (see recipes.vision)
    assert 0 < result["run"]["goodput"]["steady_busy_pct"] <= 100
    # Both arms on every seed, and the paired differences are those of the per-seed accuracies.
    seeds = result["config"]["seeds"]
    assert len(seeds) == 2
    accuracies = {arm: [result["runs"][arm][str(s)]["accuracy"] for s in seeds]
                  for arm in ("augmented", "no augmentation")}
    assert result["run"]["eval_metrics"]["accuracy"] == accuracies["augmented"][0]
    assert result["paired"]["values"] == pytest.approx(
        [a - b for a, b in zip(accuracies["augmented"], accuracies["no augmentation"])])
    assert result["table"]["no augmentation"]["values"] == accuracies["no augmentation"]
    assert min(accuracies["no augmentation"]) > 0.5

    # The same workdir with a larger step target continues from the saved checkpoint.
    resumed, stdout = run_recipe("vision", tmp_path, "--steps", str(QUICK_STEPS + 10))
    assert resumed["run"]["resumed_from"] == QUICK_STEPS and resumed["run"]["step"] == QUICK_STEPS + 10
    assert f"resumed from checkpoint step {QUICK_STEPS}" in stdout
    assert resumed["metrics"]["test_accuracy"] > 0.5


def write_digit_folder(root, scale: int = 3) -> None:
    """scikit-learn's digits as grayscale PNGs, `root/{train,test}/<digit>/<i>.png` (the recipe's 80/20 split)."""
    import numpy as np
    from PIL import Image

    from recipes.data import fraction_split, load_digits

    images, labels = load_digits()
    pixels = np.kron(images[..., 0], np.ones((scale, scale), np.uint8)) * 15  # 0..16 -> 0..240, upscaled
    for split, indices in zip(("train", "test"), fraction_split(len(labels), 0.2, seed=1234)):
        for i in indices:
            folder = root / split / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels[i], mode="L").save(folder / f"{i:04d}.png")


def test_quick_run_from_an_image_folder(tmp_path):
    folder = tmp_path / "digits"
    write_digit_folder(folder)
    # 50 steps (two calls of the quick run's 25): the folder's path in, and a test accuracy far above
    # chance (0.95 at 50 steps, 0.99 at the quick run's 150) in half the time.
    result, stdout = run_recipe("vision", tmp_path / "run", "--image-folder", str(folder), "--seeds", "1",
                                "--steps", "50")
    metrics = assert_finite_metrics(result)
    assert metrics["chance_accuracy"] == 0.1
    assert metrics["test_accuracy"] > 0.5
    assert metrics["train_el_per_s"] > 0 and metrics["pipeline_el_per_s"] > 0
    config = result["config"]
    assert config["classes"] == [str(d) for d in range(10)] and config["image_folder"] == str(folder)
    assert config["train_records"] + config["test_records"] == 1797
    assert_plot(result)
    assert "digits: " in stdout and "test accuracy" in stdout
