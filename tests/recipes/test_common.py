"""The recipes' shared pieces: command line, result.json, data splits, models and the policy stage."""

from __future__ import annotations

import argparse
import json
import statistics

import jax.numpy as jnp
import numpy as np
import pytest

from recipes import common
from recipes.data import fraction_split, load_digits, load_photograph, per_class_split
from recipes.models import ConvNet, host_lecun_normal


@pytest.mark.parametrize("name, shape", [("sklearn:china", (427, 640, 3)), ("coffee", (400, 600, 3)),
                                         ("brick", (512, 512))])
def test_bundled_photographs_load_as_uint8(name, shape):
    image = load_photograph(name)
    assert image.dtype == np.uint8 and image.shape == shape


@pytest.mark.parametrize("name, error", [("sklearn:nope", FileNotFoundError), ("horse", ValueError)])
def test_unusable_photographs_are_refused(name, error):
    with pytest.raises(error, match=name.split(":")[-1]):
        load_photograph(name)


def test_default_workdir_depends_on_quick():
    assert common.parse_args("vision", "", []).workdir == "runs/vision"
    assert common.parse_args("vision", "", ["--quick"]).workdir == "runs/vision-quick"
    assert common.parse_args("vision", "", ["--workdir", "x", "--seed", "3"]).seed == 3


@pytest.mark.parametrize("argv, message", [(["--steps", "0"], "--steps must be >= 1, got 0"),
                                           (["--seed", "-1"], "--seed must be >= 0, got -1")])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        common.parse_args("vision", "", argv)
    assert message in capsys.readouterr().err


def test_result_json_rejects_non_finite_metrics_and_keeps_details(tmp_path):
    args = argparse.Namespace(quick=True, seed=0)
    path = common.write_result(tmp_path, "vision", {"accuracy": np.float32(0.5)}, {"rate": float("inf")}, args)
    record = json.loads(path.read_text())
    assert record["metrics"] == {"accuracy": 0.5} and record["rate"] is None and record["recipe"] == "vision"
    with pytest.raises(ValueError, match=r"result metrics.loss is nan: the recipe diverged"):
        common.write_result(tmp_path, "vision", {"loss": float("nan")}, {}, args)


def test_mean_std_matches_statistics():
    values = [0.9, 0.8, 0.95]
    stats = common.mean_std(values)
    assert stats["mean"] == pytest.approx(statistics.mean(values))
    assert stats["std"] == pytest.approx(statistics.stdev(values)) and stats["n"] == 3
    assert common.mean_std([0.5])["std"] == 0.0


def test_goodput_digest_of_a_run_without_steps():
    assert common.goodput_digest(None)["steps"] == 0
    assert "no steps" in common.describe_goodput(common.goodput_digest({"steps": 0, "diagnosis": "no steps completed"}))


@pytest.mark.parametrize("interval, k, expected", [(300, 1, 300), (0, 1, 1), (300, 60, 300), (120, 60, 120),
                                                     (37, 25, 25), (15, 25, 25), (80, 25, 75), (90, 60, 120)])
def test_intervals_are_rounded_to_whole_calls(interval, k, expected):
    assert common.call_multiple(interval, k) == expected


def test_the_printed_goodput_line_gives_the_steady_device_busy_share():
    from datarax.train import GoodputLedger

    ledger = GoodputLedger()
    ledger.start(0.0)
    # Calls of 4 steps; steady: calls 2 and 3, from 1.0 to 2.8, busy 0.5 + 0.6 s over 8 steps.
    for i, (ready, dispatched) in enumerate([(1.0, 0.5), (2.0, 1.5), (2.8, 2.2)]):
        ledger.set_ready(ledger.add_step(4 * (i + 1), 32, dispatched - 0.1, dispatched, dispatched, 0.0, steps=4),
                         ready)
    ledger.finish(3.0)
    line = common.describe_goodput(common.goodput_digest(ledger.summary()))
    assert "; steady: device busy 61.1% of 1.80 s, 137.50 ms a step (4 steps a call); steady throughput" in line


def test_digits_match_scikit_learn():
    from sklearn.datasets import load_digits as reference

    images, labels = load_digits()
    bunch = reference()
    np.testing.assert_array_equal(images.reshape(len(images), -1), bunch.data.astype(np.uint8))
    np.testing.assert_array_equal(labels, bunch.target)


def test_per_class_split_takes_exactly_n_of_each_class():
    labels = np.repeat(np.arange(4), [5, 6, 7, 8])
    picked, rest = per_class_split(labels, 3, seed=1)
    assert np.bincount(labels[picked]).tolist() == [3, 3, 3, 3]
    assert sorted(np.concatenate([picked, rest]).tolist()) == list(range(len(labels)))
    with pytest.raises(ValueError, match="per_class=6 but class 0 has only 5 records"):
        per_class_split(labels, 6, seed=1)
    with pytest.raises(ValueError, match="test_fraction must be in"):
        fraction_split(10, 1.5, seed=0)


def test_host_initialiser_is_a_truncated_lecun_normal():
    x = np.asarray(host_lecun_normal(np.random.default_rng(0))(None, (200, 300)))
    std = np.sqrt(1.0 / 200)
    assert abs(x.std() / std - 1) < 0.02 and np.abs(x).max() <= 2 * std / 0.8796 + 1e-6


def test_convnet_shapes_and_bad_pool():
    model = ConvNet(1, 6, widths=(4, 8), image_size=(10, 12), hidden=0, pool="width", seed=0)
    assert model(jnp.zeros((2, 10, 12, 1))).shape == (2, 6)
    with pytest.raises(ValueError, match="pool must be 'flatten' or 'width', got 'max'"):
        ConvNet(1, 6, pool="max")


@pytest.mark.parametrize("backend, quick, schedule", [("cpu", False, {"every_steps": 2}), ("tpu", False, {
    "every_secs": common.ACCELERATOR_CHECKPOINT_SECS}), ("tpu", True, {"every_steps": 8})])
def test_checkpoints_come_every_quarter_run_on_the_cpu_and_by_time_on_an_accelerator(tmp_path, monkeypatch, backend,
                                                                                    quick, schedule):
    """On a chip a quarter of a run can be shorter than one checkpoint write (docs/tpu.md)."""
    import optax
    from flax import nnx

    from datarax import Pipeline
    from datarax.sources import MemorySource
    from datarax.train.callbacks import CheckpointCallback

    monkeypatch.setattr(common, "_quick", quick)
    monkeypatch.setattr(common, "on_accelerator", lambda: backend != "cpu")
    source = MemorySource(data={"x": np.ones((16, 2), np.float32), "y": np.zeros(16, np.float32)})
    trainer, outcome = common.train_run(
        tmp_path, nnx.Linear(2, 1, rngs=nnx.Rngs(0)), optax.sgd(0.1), Pipeline(source, batch_size=4),
        lambda model, batch: ((model(batch["x"])[:, 0] - batch["y"]) ** 2).mean(), steps=8, goodput_plot=False)
    (callback,) = [cb for cb in trainer.callbacks if isinstance(cb, CheckpointCallback)]
    assert {k: v for k, v in vars(callback.schedule).items() if k in ("every_steps", "every_secs") and v} == schedule
    assert outcome.step == 8 and (tmp_path / "checkpoints" / "8").is_dir()  # the end of the run is always saved
