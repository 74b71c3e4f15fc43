"""`MarginalLikelihood` through the real `Trainer`: the width it learns on toys with a known answer, the
training loss never moving the hyperparameters, resume, refusals, and `[trainer.marglik]` files."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.cli.main import main
from datarax.operators.image import RotationOperator
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer, load_trainer
from datarax.train.callbacks import CheckpointCallback
from datarax.train.invariance import InvariantModel, MarginalLikelihood, MarginalLikelihoodConfig, with_prior
from datarax.train.invariance import marglik as marglik_module

SIZE = 9


def bars(n: int, invariant: bool, seed: int = 0) -> dict:
    """Noisy bars through the centre of 9x9 images. `invariant`: the class is the bar's length, its angle
    uniform (rotation keeps the label); else the class is horizontal or vertical (rotation changes it)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] - (SIZE - 1) / 2
    labels = rng.integers(0, 2, n)
    if invariant:
        angle, length = rng.uniform(0, np.pi, n), np.where(labels == 1, 7.0, 2.5)
    else:
        angle, length = np.where(labels == 1, np.pi / 2, 0.0) + rng.uniform(-0.3, 0.3, n), np.full(n, 6.0)
    along = xx[None] * np.cos(angle)[:, None, None] + yy[None] * np.sin(angle)[:, None, None]
    across = yy[None] * np.cos(angle)[:, None, None] - xx[None] * np.sin(angle)[:, None, None]
    image = np.exp(-across**2 / 0.8) / (1 + np.exp(3 * (np.abs(along) - length[:, None, None] / 2)))
    image = image + 0.05 * rng.normal(size=image.shape)
    return {"image": image[..., None].astype(np.float32), "label": labels.astype(np.int32)}


class MLP(nnx.Module):
    def __init__(self, seed: int = 0):
        self.hidden = nnx.Linear(SIZE * SIZE, 32, rngs=nnx.Rngs(seed))
        self.out = nnx.Linear(32, 2, rngs=nnx.Rngs(seed + 1))

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x.reshape(x.shape[0], -1))))


def loss_fn(model, batch):
    logits = model(batch)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


def build(invariant: bool, start: float, seed: int = 0, **config):
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=bars(128, invariant, seed)),
                        [RotationOperator(degrees=start, learnable=True, parameterisation="triangle",
                                          rngs=nnx.Rngs(seed))], batch_size=32, drop_remainder=True)
    model = InvariantModel(MLP(seed), pipeline, copies=4)
    settings = {"every": 5, "burn_in": 20, "records": 32, "subset_size": 32, "kernel": "full", "learning_rate": 0.1,
                "seed": seed, **config}
    return model, pipeline, MarginalLikelihood(model, pipeline, MarginalLikelihoodConfig(**settings))


def width(model: InvariantModel) -> float:
    return model.widths()["stages.0.magnitudes.degrees"]


@pytest.mark.parametrize("invariant,start", [(True, 0.0), (False, 60.0)], ids=["invariant-grows", "not-shrinks"])
def test_the_width_grows_from_zero_where_labels_are_invariant_and_shrinks_where_not(invariant, start):
    model, pipeline, marglik = build(invariant, start)
    with Trainer(model, optax.adam(1e-2), pipeline.raw_loader(), with_prior(loss_fn), callbacks=[marglik]) as trainer:
        trainer.fit(100)
    widths = [h["stages.0.magnitudes.degrees"] for h in marglik.history]
    assert len(widths) == 17  # steps 20, 25, ..., 100
    # One program for all 17 hyper-steps: the optimiser's fresh state is placed as the step's outputs are, so
    # the second hyper-step does not compile again.
    assert marglik._step._cache_size() == 1
    if invariant:  # a width of exactly 0 leaves (the triangle magnitude's gradient is not flat there) and grows
        assert min(widths[-4:]) > 60, widths
    else:
        assert max(widths[-4:]) < 30, widths


def test_the_forward_mode_hyper_step_equals_the_reverse_mode_one(monkeypatch):
    # One magnitude: its gradient in forward mode (the default); FORWARD_MAGNITUDES = 0 forces reverse mode.
    def step(forward: int):
        monkeypatch.setattr(marglik_module, "FORWARD_MAGNITUDES", forward)
        model, _, marglik = build(True, 30.0, kernel="single_output", records=16, subset_size=8, prior_steps=0)
        out = marglik.hyper_step(0)
        return out, model.widths(), marglik.opt_state

    (out_f, widths_f, state_f), (out_r, widths_r, state_r) = step(2), step(0)
    np.testing.assert_allclose(list(out_f.values()), list(out_r.values()), rtol=1e-5)  # the same evidence
    np.testing.assert_allclose(list(widths_f.values()), list(widths_r.values()), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state_f), jax.tree.leaves(state_r)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    assert widths_f["stages.0.magnitudes.degrees"] != 30.0  # the magnitude moved


def test_warmup_ramps_both_rates_from_one_step_in_warmup_to_full():
    # Adam's first update is minus the rate times the gradient over its own size (bias-corrected): each
    # raw number moves by the rate, here a quarter of it under a warmup of 4 (prior_steps=0: one prior step).
    model, _, marglik = build(True, 30.0, warmup=4, prior_steps=0, kernel="single_output", records=8,
                              subset_size=8)
    raw = np.asarray(model.augment.stages[0].magnitudes["degrees"].raw[...])
    prior = np.asarray(model.log_prior_precision[...])
    marglik.hyper_step(0)
    moved_raw = np.asarray(model.augment.stages[0].magnitudes["degrees"].raw[...]) - raw
    moved_prior = np.asarray(model.log_prior_precision[...]) - prior
    np.testing.assert_allclose(np.abs(moved_raw), 0.1 / 4, rtol=1e-3)  # build's learning_rate 0.1
    np.testing.assert_allclose(np.abs(moved_prior), 0.1 / 4, rtol=1e-3)  # the default prior_learning_rate 0.1
    rate = marglik_module.ramp(0.05, 4)
    np.testing.assert_allclose([float(rate(k)) for k in range(6)], [0.0125, 0.025, 0.0375, 0.05, 0.05, 0.05])
    assert marglik_module.ramp(0.05, 0) == 0.05


def test_the_training_loss_never_moves_the_hyperparameters():
    model, pipeline, marglik = build(True, 40.0, burn_in=1000)  # no hyper-step within the run
    before = {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.Param)))}
    raw = np.asarray(model.augment.stages[0].magnitudes["degrees"].raw[...])
    weights = np.asarray(model.model.hidden.kernel[...])
    with Trainer(model, optax.adamw(1e-2, weight_decay=0.1), pipeline.raw_loader(), with_prior(loss_fn),
                 callbacks=[marglik]) as trainer:
        trainer.fit(12)
    assert marglik.count == 0
    assert np.array_equal(np.asarray(model.augment.stages[0].magnitudes["degrees"].raw[...]), raw)
    after = {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.Param)))}
    assert np.array_equal(after[("log_prior_precision",)], before[("log_prior_precision",)])
    assert not np.array_equal(np.asarray(model.model.hidden.kernel[...]), weights)


def test_optimizers_that_would_move_the_magnitudes_are_refused():
    model, pipeline, _ = build(True, 40.0)
    with pytest.raises(ValueError, match="wrt=InvariantModel.trained"):
        Trainer(model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param), pipeline.raw_loader(), loss_fn)
    with pytest.raises(ValueError, match="MarginalLikelihood callback learns them"):
        Trainer(model, optax.adam(1e-2), pipeline, loss_fn, train_pipeline_params=True)
    Trainer(model, nnx.Optimizer(model, optax.adam(1e-2), wrt=InvariantModel.trained), pipeline.raw_loader(),
            loss_fn).close()


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    def fit(directory, steps):
        model, pipeline, marglik = build(True, 0.0, every=3, burn_in=3, until=9, records=8, subset_size=8,
                                         warmup=2)
        callbacks = [marglik, CheckpointCallback(directory, every_steps=6, asynchronous=False)]
        with Trainer(model, optax.adam(1e-2), pipeline.raw_loader(), with_prior(loss_fn),
                     callbacks=callbacks) as trainer:
            trainer.fit(steps)
        # Settling changes no placement: the training step is one program before and after it.
        assert trainer._train_step._jit._cache_size() == 1
        return model, marglik

    whole, whole_marglik = fit(tmp_path / "whole", 12)
    first, _ = fit(tmp_path / "split", 6)  # saved at step 6, its hyper-step of step 6 included
    assert float(first.settled[...]) == 0.0  # not before `until`
    resumed, resumed_marglik = fit(tmp_path / "split", 12)
    assert resumed_marglik.count == whole_marglik.count == 3  # hyper-steps at 3, 6 and 9 (until), none at 12
    assert resumed_marglik.history == whole_marglik.history
    assert float(resumed.settled[...]) == float(whole.settled[...]) == 1.0  # settled from step 9 on
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(whole)), nnx.to_flat_state(nnx.state(resumed))):
        assert np.array_equal(np.asarray(a), np.asarray(b)), path


def test_a_non_finite_estimate_raises_and_changes_nothing():
    model, pipeline, marglik = build(True, 40.0)
    model.model.out.kernel[...] = jnp.full_like(model.model.out.kernel[...], jnp.nan)
    raw = np.asarray(model.augment.stages[0].magnitudes["degrees"].raw[...])
    with pytest.raises(FloatingPointError, match="non-finite"):
        marglik.hyper_step(epoch=0)
    assert np.array_equal(np.asarray(model.augment.stages[0].magnitudes["degrees"].raw[...]), raw)
    assert marglik.count == 0


def test_grouped_draws_fill_each_block_from_one_class_in_a_random_class_order():
    _, pipeline, marglik = build(True, 30.0, grouped=True, records=96, subset_size=8)
    labels = np.asarray(pipeline.source.read(np.arange(len(pipeline.source)), 0)["label"])
    counts = np.bincount(labels)
    first_classes = []
    for count in range(6):
        marglik.count = count
        for epoch in (0, 3):
            batch = marglik.draw(epoch)
            ids = batch["record_ids"]
            assert len(set(ids.tolist())) == 96  # distinct records
            epoch_ids = pipeline.sampler.indices(np.arange(len(pipeline.sampler)), epoch)
            assert set(ids.tolist()) <= set(np.asarray(epoch_ids).tolist())
            np.testing.assert_array_equal(batch["label"], labels[ids])  # read from the source
            # Classes come in runs: every record of the first class (96 records outnumber either class of
            # the 128), then the next class's.
            drawn = batch["label"]
            first = drawn[0]
            assert counts[first] < 96
            assert np.all(drawn[:counts[first]] == first) and np.all(drawn[counts[first]:] != first)
            first_classes.append(int(first))
    assert set(first_classes) == {0, 1}  # the class order is drawn, not fixed


@pytest.mark.parametrize("settings,words", [
    ({"every": 0}, "every must be an int >= 1"),
    ({"records": 30, "subset_size": 16}, "must divide records=30"),
    ({"kernel": "kron"}, "kernel must be one of ('full', 'single_output')"),
    ({"likelihood": "poisson"}, "likelihood must be one of"),
    ({"prior_learning_rate": 0.0}, "prior_learning_rate must be in (0.0, inf], got 0.0"),
    ({"grouped": True, "likelihood": "gaussian"}, "grouped=True groups records by class"),
    ({"grouped": 1}, "grouped"),
    ({"warmup": -1}, "warmup must be an int >= 0"),
    ({"burn_in": 20, "until": 10}, "until must be an int >= 20 (the last step a hyper-step runs at"),
])
def test_bad_settings_name_the_field(settings, words):
    with pytest.raises((TypeError, ValueError), match=words.replace("(", r"\(").replace(")", r"\)")):
        MarginalLikelihoodConfig(**settings)


HELPERS = '''
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

def make_data():
    rng = np.random.default_rng(0)
    return {"image": rng.random((64, 6, 6, 1)).astype(np.float32), "label": rng.integers(0, 3, 64).astype(np.int32)}

class Net(nnx.Module):
    def __init__(self, rngs):
        self.out = nnx.Linear(36, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(x.reshape(x.shape[0], -1))

def make_model(rngs):
    return Net(rngs)

def xent(model, batch):
    logits = model(batch)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits
'''

CONFIG = """allow = ["ml_helpers"]
batch_size = 16
drop_remainder = true
[source.memory]
data = "ml_helpers:make_data"
shuffle = true
[[stages]]
rotation = {{ degrees = 0.0, learnable = true, parameterisation = "triangle" }}
[eval.source.memory]
shuffle = false
[trainer]
model = "ml_helpers:make_model"
loss = "ml_helpers:xent"
optimizer = {{ adam = {{ learning_rate = 0.01 }} }}
steps = 8
compilation_cache = false
[trainer.marglik]
{marglik}
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    import importlib
    import sys

    (tmp_path / "ml_helpers.py").write_text(HELPERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ml_helpers", None)
    importlib.invalidate_caches()
    return tmp_path


def job(folder, marglik: str) -> str:
    path = folder / "run.toml"
    path.write_text(CONFIG.format(marglik=marglik))
    return str(path)


def test_a_configuration_file_trains_an_invariant_model_with_its_hyper_step(folder):
    run = load_trainer(job(folder, "copies = 2\ncopies_per_call = 1\nprior_precision = 3.0\nevery = 4\nburn_in = 4\n"
                                   "records = 8\n"
                                   "subset_size = 8\nkernel = \"full\""))
    model = run.trainer.model
    assert isinstance(model, InvariantModel) and model.copies == 2 and model.copies_per_call == 1
    # exp(log(3)): a TPU's float32 exp and log are off by up to about 1e-4 (relative; 6e-5 seen)
    rtol = 1e-6 if jax.default_backend() == "cpu" else 1e-4
    np.testing.assert_allclose(np.asarray(model.prior_precision), 3.0, rtol=rtol)
    (marglik,) = [cb for cb in run.trainer.callbacks if isinstance(cb, MarginalLikelihood)]
    assert marglik.config.records == 8 and marglik.config.kernel == "full"
    run.fit()
    run.trainer.close()
    assert marglik.count == 2  # steps 4 and 8
    assert width(model) > 0.0  # left 0
    assert np.isfinite(run.trainer.last_eval_metrics["loss"])  # [eval]'s raw records, scored by the invariant model
    assert run.trainer.eval_pipeline.stages[0].ids_key == "record_ids"


@pytest.mark.parametrize("marglik,key,words", [
    ("copies = 0", "copies", "must be an int >= 1"),
    ("copies = 4\ncopies_per_call = 5", "copies_per_call", "must be an int in [1, 4]"),
    ("prior = \"diagonal\"", "prior", "must be one of ('layerwise', 'scalar')"),
    ("every = -1", "every", "every must be an int >= 1"),
    ("records = 7\nsubset_size = 2", "subset_size", "must divide records=7"),
    ("colour = 1", "colour", "is not a known key (known: burn_in, copies"),
    ("field = \"pixels\"", "", "field 'pixels' is not an output of the pipeline's stages"),
])
def test_validate_rejects_each_bad_value_at_its_key(folder, capsys, marglik, key, words):
    assert main(["validate", job(folder, marglik)]) == 1
    err = capsys.readouterr().err
    assert f"trainer.marglik{'.' + key if key else ''}" in err and words in err, err


def test_validate_accepts_a_good_table(folder, capsys):
    table = "copies = 4\nrecords = 16\ncopies_per_call = 2"
    assert main(["validate", job(folder, table)]) == 0, capsys.readouterr().err
