"""Trainer: exact resume, step counting, one-step-late metrics, evaluation, joint pipeline training,
several steps per call (steps_per_execution) and metrics read only when looked at."""

from __future__ import annotations

import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from trainer_helpers import METRICS, RECORD_METRICS, assert_bitwise_equal, loss_fn, make_setup

from datarax import Pipeline
from datarax.train import Trainer, joint_optimizer
from datarax.train.callbacks import Callback, CheckpointCallback


class Recorder(Callback):
    """Records every event, and the host metrics of every step."""

    def __init__(self):
        self.events, self.metrics, self.logs = [], {}, []

    def on_train_begin(self, trainer):
        self.events.append("train_begin")

    def on_data_wait_begin(self, trainer, step):
        self.events.append(("data_wait_begin", step))

    def on_data_wait_end(self, trainer, step, seconds):
        assert seconds >= 0
        self.events.append(("data_wait_end", step))

    def on_step_begin(self, trainer, step):
        self.events.append(("step_begin", step))

    def on_step_end(self, trainer, logs):
        self.events.append(("step_end", logs.step))
        self.logs.append(logs)
        if logs.metrics:
            self.metrics[logs.metrics_step] = dict(logs.metrics)

    def on_eval_begin(self, trainer, step):
        self.events.append(("eval_begin", step))

    def on_eval_end(self, trainer, step, metrics):
        self.events.append(("eval_end", step))

    def on_checkpoint_save(self, trainer, info):
        self.events.append(("checkpoint_save", info.step, info.forced))

    def on_checkpoint_restore(self, trainer, info):
        self.events.append(("checkpoint_restore", info.step))

    def on_train_end(self, trainer, logs):
        self.events.append(("train_end", logs.step))
        self.metrics[logs.metrics_step] = dict(logs.metrics)


def make_trainer(callbacks=(), *, joint=False, optimizer=None, eval_every_steps=None, trainer_kwargs=None,
                 **setup_kwargs):
    setup = make_setup(**setup_kwargs)
    optimizer = optax.adam(5e-2) if optimizer is None else optimizer
    trainer = Trainer(setup.model, optimizer, setup.pipeline, loss_fn, eval_pipeline=setup.eval_pipeline,
                      metrics={**METRICS, **RECORD_METRICS}, callbacks=callbacks, train_pipeline_params=joint,
                      eval_every_steps=eval_every_steps, **(trainer_kwargs or {}))
    return trainer, setup


@pytest.mark.parametrize("joint", [False, True], ids=["model", "joint"])
def test_resume_after_a_crash_matches_the_uninterrupted_run(tmp_path, joint):
    reference = Recorder()
    full, full_setup = make_trainer([reference], joint=joint)
    full.fit(num_steps=20)

    first = Recorder()
    part, _ = make_trainer([first, CheckpointCallback(tmp_path, every_steps=6)], joint=joint)
    part.fit(num_steps=14)
    # The final save at 14 never happened in a crash: resume from the step-12 checkpoint.
    shutil.rmtree(tmp_path / "14")
    second = Recorder()
    ckpt = CheckpointCallback(tmp_path, every_steps=6)
    resumed, resumed_setup = make_trainer([second, ckpt], joint=joint)
    result = resumed.fit(num_steps=20)

    assert ckpt.restored.step == 12 and result.step == 20
    assert ("checkpoint_restore", 12) in second.events
    assert_bitwise_equal(full_setup.model, resumed_setup.model)
    assert_bitwise_equal(full.optimizer, resumed.optimizer)
    if joint:
        assert_bitwise_equal(full_setup.pipeline, resumed_setup.pipeline)
    # The records (and their augmentation) trained on after the checkpoint are the same.
    for step in range(13, 21):
        assert second.metrics[step] == reference.metrics[step], step
    assert result.metrics == reference.metrics[20]


def test_events_order_and_one_step_late_metrics(tmp_path):
    rec = Recorder()
    trainer, _ = make_trainer([rec, CheckpointCallback(tmp_path, on_steps=(2,))], eval_every_steps=3)
    trainer.fit(num_steps=3)
    expected = ["train_begin"]
    for step in (1, 2, 3):
        expected += [("data_wait_begin", step), ("data_wait_end", step), ("step_begin", step)]
        if step == 2:  # the checkpoint callback (order -100) saves before the recorder's step_end
            expected.append(("checkpoint_save", 2, False))
        expected.append(("step_end", step))
        if step == 3:
            expected += [("eval_begin", 3), ("eval_end", 3)]
    expected += [("checkpoint_save", 3, True), ("train_end", 3)]
    assert rec.events == expected
    assert [(logs.step, logs.metrics_step) for logs in rec.logs] == [(1, None), (2, 1), (3, 2)]
    assert sorted(rec.metrics) == [1, 2, 3]
    assert all(logs.batch_size == 8 and logs.dispatched_at >= logs.data_wait[1] for logs in rec.logs)


def test_first_step_metrics_match_an_independent_computation():
    rec = Recorder()
    trainer, setup = make_trainer([rec], seed=3)
    initial = nnx.clone(setup.model)
    batch = next(make_setup(seed=3).pipeline.epochs(None))
    trainer.fit(num_steps=2)
    expected_loss, logits = loss_fn(initial, batch)
    np.testing.assert_allclose(rec.metrics[1]["loss"], float(expected_loss), rtol=1e-6)
    np.testing.assert_allclose(rec.metrics[1]["accuracy"], float((logits.argmax(-1) == batch["y"]).mean()))
    assert rec.metrics[1]["rid_sum"] == float(np.asarray(batch["rid"]).sum())


def test_num_epochs_counts_batches_and_totals_are_absolute():
    trainer, setup = make_trainer(num_records=40)
    assert trainer.fit(num_epochs=2).step == 2 * len(setup.pipeline) == 10
    assert trainer.epoch == 1
    assert trainer.fit(num_steps=12).step == 12
    assert trainer.fit(num_steps=12).step == 12


def test_weights_on_a_device_beside_a_fresh_optimizer_state_compile_the_step_once():
    """Restored weights are committed to a device, a fresh optimizer state is not; the step's outputs
    all are. The trainer commits the state before the first step, so the second step does not compile."""
    trainer, setup = make_trainer()
    nnx.update(setup.model, jax.device_put(nnx.state(setup.model), jax.devices()[0]))
    trainer.fit(num_steps=3)
    assert trainer._train_step._jit._cache_size() == 1


def test_evaluations_of_a_fresh_restored_and_trained_model_compile_each_batch_shape_once():
    """A fresh model's arrays are uncommitted, restored ones committed to a device, as are a trained
    model's when it began from them: evaluate commits them all, so its step compiles once per shape."""
    trainer, setup = make_trainer()
    before = trainer.evaluate()
    nnx.update(setup.model, jax.device_put(nnx.state(setup.model), jax.devices()[0]))  # as a restore leaves them
    assert trainer.evaluate() == before
    trainer.fit(num_steps=2)
    trainer.evaluate()
    assert trainer._eval_step._jit._cache_size() == 2  # batches of 8 and the epoch's last 4


def test_evaluate_is_the_batch_weighted_mean():
    trainer, setup = make_trainer()
    metrics = trainer.evaluate()
    data = {k: np.concatenate([b[k] for b in setup.eval_pipeline]) for k in ("x", "y")}
    assert len(data["y"]) == 20  # batches of 8, 8 and 4
    loss, logits = loss_fn(setup.model, data)
    np.testing.assert_allclose(metrics["loss"], float(loss), rtol=1e-5)
    np.testing.assert_allclose(metrics["accuracy"], float((logits.argmax(-1) == data["y"]).mean()), rtol=1e-6)


@pytest.mark.parametrize("split", [False, True], ids=["one_rule", "joint_optimizer"])
def test_joint_step_matches_a_hand_computed_gradient(split):
    """With SGD, one joint step moves the pipeline's parameter by -lr * dloss/dp, computed here by hand.

    With `joint_optimizer(sgd(0), sgd(lr))` the model keeps its parameters bitwise while the
    pipeline's moves by the same amount: the pipeline has its own rule.
    """
    lr = 0.5
    optimizer = joint_optimizer(optax.sgd(0.0), optax.sgd(lr)) if split else optax.sgd(lr)
    trainer, setup = make_trainer(joint=True, optimizer=optimizer, seed=4)
    pipeline = setup.pipeline
    p0 = float(pipeline.stages[0].p[...])
    model0 = nnx.clone(setup.model)
    # The raw first batch and its context, computed independently of the trainer's loader.
    raw_pipeline = Pipeline(pipeline.source, batch_size=8, sampler=pipeline.sampler, drop_remainder=True)
    raw = next(raw_pipeline.epochs(None))
    ids = pipeline.sampler.indices(np.arange(8), 0)

    def objective(p):
        stage = nnx.clone(pipeline.stages[0])
        stage.p[...] = p
        from datarax.core.element import Element
        from datarax.core.operator import BatchContext
        ctx = BatchContext(jnp.asarray(ids, jnp.int32), jnp.asarray(0, jnp.int32), jnp.ones(8, bool))
        data = stage.apply_batch(Element(dict(raw), {}), ctx).data
        return loss_fn(model0, data)[0]

    grad = float(jax.grad(objective)(jnp.asarray(p0)))
    trainer.fit(num_steps=1)
    assert grad != 0.0
    np.testing.assert_allclose(float(pipeline.stages[0].p[...]), p0 - lr * grad, rtol=1e-5, atol=1e-7)
    model_changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.any(a != b)),
                                                 nnx.state(model0, nnx.Param), nnx.state(setup.model, nnx.Param)))
    assert any(model_changed) != split


def test_joint_optimizer_argument_errors():
    with pytest.raises(TypeError, match=r"pipeline must be an optax GradientTransformation, got float"):
        joint_optimizer(optax.adam(1e-3), 1e-2)
    with pytest.raises(TypeError, match=r"model must be an optax GradientTransformation, got str"):
        joint_optimizer("adam", optax.adam(1e-2))


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, logs):
        if logs.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_stops_after_the_step_and_forces_a_save(tmp_path):
    rec = Recorder()
    ckpt = CheckpointCallback(tmp_path, every_steps=100)
    trainer, _ = make_trainer([rec, ckpt, StopAt(4)])
    before = signal.getsignal(signal.SIGTERM)
    result = trainer.fit(num_steps=50)
    assert result.step == 4 and result.stop_reason == "SIGTERM"
    assert ("checkpoint_save", 4, True) in rec.events
    assert sorted(int(name) for name in os.listdir(tmp_path) if name.isdigit()) == [4]
    assert signal.getsignal(signal.SIGTERM) is before


def test_request_stop_ends_the_run():
    class Stop(Callback):
        def on_step_end(self, trainer, logs):
            if logs.step == 3:
                trainer.request_stop("enough")

    trainer, _ = make_trainer([Stop()])
    result = trainer.fit(num_steps=10)
    assert (result.step, result.stop_reason) == (3, "enough")


def test_argument_errors():
    setup = make_setup()
    with pytest.raises(TypeError, match=r"train_pipeline_params=True needs an optax transformation"):
        Trainer(setup.model, nnx.Optimizer(setup.model, optax.sgd(0.1), wrt=nnx.Param), setup.pipeline,
                loss_fn, train_pipeline_params=True)
    with pytest.raises(TypeError, match=r"optimizer must be an optax GradientTransformation or an nnx.Optimizer, "
                                        r"got str"):
        Trainer(setup.model, "adam", setup.pipeline, loss_fn)
    with pytest.raises(TypeError, match=r"train_pipeline must be a datarax Pipeline, got list"):
        Trainer(setup.model, optax.sgd(0.1), [1, 2], loss_fn)
    with pytest.raises(TypeError, match=r"metrics must map names \(not 'loss'\)"):
        Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, metrics={"loss": lambda b, a: 0.0})
    with pytest.raises(ValueError, match=r"eval_every_steps=5 needs an eval_pipeline"):
        Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, eval_every_steps=5)
    with pytest.raises(TypeError, match=r"callbacks\[0\] must be a trainers Callback, got int"):
        Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, callbacks=[3])
    trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn)
    with pytest.raises(ValueError, match=r"give exactly one of num_steps or num_epochs, got num_steps=None, "
                                         r"num_epochs=None"):
        trainer.fit()
    with pytest.raises(ValueError, match=r"num_steps must be an int >= 0 .*, got -1"):
        trainer.fit(num_steps=-1)
    with pytest.raises(ValueError, match=r"evaluate needs a pipeline"):
        trainer.evaluate()


def test_non_scalar_loss_is_reported():
    setup = make_setup()
    trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline,
                      lambda model, batch: model(batch["x"]))
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar loss \(shape \(\)\) or one loss per record "
                                         r"\(shape \(8,\)\), got shape \(8, 3\)"):
        trainer.fit(num_steps=1)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"model": "net"}, TypeError, r"model must be an nnx.Module, got str"),
    ({"train_pipeline": None}, TypeError, r"train_pipeline must be a datarax Pipeline, got None"),
    ({"eval_pipeline": 3}, TypeError, r"eval_pipeline must be a datarax Pipeline, got int"),
    ({"loss_fn": 1.5}, TypeError, r"loss_fn must be callable as loss_fn\(model, batch\), got 1.5"),
    ({"train_pipeline_params": 1}, TypeError, r"train_pipeline_params must be True or False, got 1"),
    ({"steps_per_execution": 0}, ValueError,
     r"steps_per_execution must be an int >= 1 \(optimizer steps per jitted call\), got 0"),
])
def test_constructor_argument_errors(kwargs, error, match):
    setup = make_setup()
    args = {"model": setup.model, "optimizer": optax.sgd(0.1), "train_pipeline": setup.pipeline,
            "loss_fn": loss_fn, **kwargs}
    with pytest.raises(error, match=match):
        Trainer(args.pop("model"), args.pop("optimizer"), args.pop("train_pipeline"), args.pop("loss_fn"), **args)


def test_loss_fn_returning_three_values_is_reported():
    setup = make_setup()
    trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline, lambda model, batch: (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar loss or \(loss, aux\), got a tuple of 3"):
        trainer.fit(num_steps=1)


def test_loss_fn_adding_variables_is_reported():
    def sneaky(model, batch):
        model.counter = nnx.Variable(jnp.zeros(()))
        return loss_fn(model, batch)

    setup = make_setup()
    trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline, sneaky)
    with pytest.raises(RuntimeError, match=r"a loss_fn must not add or remove Variables"):
        trainer.fit(num_steps=1)



def test_a_resume_is_reported_where_it_happens(tmp_path, caplog):
    import io
    import logging

    from datarax.train.callbacks import ProgressBar

    first, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=2)])
    assert first.fit(num_steps=4).resumed_from is None
    stream = io.StringIO()
    bar = ProgressBar(mode="bar", file=stream, mininterval=0)
    second, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=2), bar])
    with caplog.at_level(logging.INFO, logger="datarax.train"):
        result = second.fit(num_steps=6)
    assert result.resumed_from == 4 and result.step == 6
    assert any("resumed from the checkpoint at step 4" in r.getMessage() for r in caplog.records)
    shown = stream.getvalue()
    # The bar says where it resumed, then that the first step is compiling, before any step ends.
    assert shown.index("resumed from the checkpoint at step 4") < shown.index("compiling the first step")


def test_clu_metrics_through_a_real_fit_and_evaluate():
    """A real clu.metrics.Collection: per-step values in fit, CLU's merge across eval batches."""
    import flax.struct
    from clu import metrics as clu_metrics

    # Built with type() because this module's `from __future__ import annotations` would turn
    # class-body annotations into strings, which CLU reads as the metric classes.
    hit = clu_metrics.Average.from_fun(lambda logits, y, **_: (logits.argmax(-1) == y).astype(jnp.float32))
    Metrics = flax.struct.dataclass(type("Metrics", (clu_metrics.Collection,), {
        "__annotations__": {"loss_avg": clu_metrics.Average.from_output("loss"), "accuracy": hit}}))

    def cross_entropy(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), logits  # aux -> logits

    setup = make_setup()
    trainer = Trainer(setup.model, optax.adam(5e-2), setup.pipeline, cross_entropy,
                      eval_pipeline=setup.eval_pipeline, metrics=Metrics)
    result = trainer.fit(num_steps=3)
    assert set(result.metrics) == {"loss", "loss_avg", "accuracy"}
    assert result.metrics["loss_avg"] == pytest.approx(result.metrics["loss"], rel=1e-6)
    evaluated = trainer.evaluate()
    # The reference: every eval record's hit, averaged once over the whole epoch (20 records in
    # batches of 8, 8, 4: a mean of batch means would weigh the last batch's records double).
    hits, losses, sizes = [], [], []
    for batch in setup.eval_pipeline:
        logits = setup.model(batch["x"])
        hits.append(np.asarray(logits.argmax(-1) == batch["y"], np.float64))
        losses.append(float(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()))
        sizes.append(len(hits[-1]))
    assert sizes == [8, 8, 4]
    assert evaluated["accuracy"] == pytest.approx(float(np.concatenate(hits).mean()), rel=1e-6)
    assert evaluated["loss"] == pytest.approx(float(np.average(losses, weights=sizes)), rel=1e-5)
    with pytest.raises(TypeError, match=r"a mapping of name -> fn\(batch, aux\) or a clu.metrics.Collection"):
        Trainer(setup.model, optax.adam(5e-2), setup.pipeline, cross_entropy, metrics=dict)


def test_close_stops_the_reader_and_a_later_fit_goes_on_from_the_same_record():
    reference = Recorder()
    full, full_setup = make_trainer([reference])
    full.fit(num_steps=9)

    rec = Recorder()
    with make_trainer([rec])[0] as part:
        part.fit(num_steps=4)
        reader = part.iterator
    assert part._iterator is None  # closed on leaving the block
    close = getattr(reader, "close", None)
    assert close is not None  # the pipeline iterator has a reader to stop
    part.fit(num_steps=9)  # a new iterator, set to where the closed one stood
    part.close()
    part.close()  # idempotent
    assert_bitwise_equal(full_setup.model, part.model)
    assert rec.metrics == reference.metrics


# The trainer's options that change the step, each trained with K = 1 and K = 4 steps per call.
OPTIONS = {"plain": {}, "joint": {"joint": True}, "ema": {"trainer_kwargs": {"ema_decay": 0.9}},
           "bf16": {"trainer_kwargs": {"precision": "bf16"}}, "f16": {"trainer_kwargs": {"precision": "f16"}},
           "accumulate": {"trainer_kwargs": {"accumulate_steps": 2}},
           "short_batches": {"drop_remainder": False, "num_records": 60}}


def with_k(options: dict, k: int) -> dict:
    return {**options, "trainer_kwargs": {**options.get("trainer_kwargs", {}), "steps_per_execution": k}}


# XLA does not promise to compile a step inside the loop as it compiles it alone (docs/trainers.md): on a TPU
# v5e, float16 with loss scaling differs after 18 steps (loss 0.2551 against 0.2549; at 3eab970 and 2ce9ccf),
# every other option is bitwise equal there.
TPU_DIFFERS = pytest.mark.xfail(jax.default_backend() == "tpu", strict=True,
                                reason="float16 steps in the loop round otherwise than alone on a TPU v5e")


@pytest.mark.filterwarnings("ignore::datarax.train.ShortFinalBatchWarning")
@pytest.mark.parametrize("options", [pytest.param(v, marks=TPU_DIFFERS) if k == "f16" else v
                                     for k, v in OPTIONS.items()], ids=OPTIONS.keys())
def test_steps_per_execution_trains_bitwise_like_single_steps(options):
    """18 steps: four calls of 4 and the last 2 as single steps (with short batches: every call that
    holds an epoch's short final batch runs its steps singly)."""
    single, single_setup = make_trainer(**options)
    many, many_setup = make_trainer(**with_k(options, 4))
    assert many.fit(num_steps=18).metrics == single.fit(num_steps=18).metrics
    assert_bitwise_equal(single_setup.model, many_setup.model)
    assert_bitwise_equal(single.optimizer, many.optimizer)
    assert many.iterator.get_state() == single.iterator.get_state()
    if many.joint:
        assert_bitwise_equal(single_setup.pipeline, many_setup.pipeline)
    if many.ema is not None:
        assert_bitwise_equal(single.ema, many.ema)
    assert many.config_fingerprint == single.config_fingerprint  # K changes no result


def test_steps_per_execution_checkpoints_and_resumes_like_single_steps(tmp_path):
    """The K = 4 run's checkpoint at step 8 holds K = 1's arrays and iterator state (the integrity
    hashes written with them); resumed from it, and from K = 1's checkpoint at step 6 (not a multiple
    of K: steps 7 and 8 are a call of two single steps, then calls of 4 again), K = 4 ends bitwise
    equal to K = 1."""
    from datarax.train.checkpointing.checkpointer import Checkpointer

    reference = Recorder()
    single, single_setup = make_trainer([reference, CheckpointCallback(tmp_path / "k1", on_steps=(6, 8))])
    single.fit(num_steps=18)
    first = Recorder()
    many, _ = make_trainer([first, CheckpointCallback(tmp_path / "k4", every_steps=4)], trainer_kwargs={
        "steps_per_execution": 4})
    assert many.fit(num_steps=10).step == 10
    assert [(logs.step, logs.steps) for logs in first.logs] == [(4, 4), (8, 4), (10, 2)]
    written = {}
    for name in ("k1", "k4"):
        checkpointer = Checkpointer(tmp_path / name)
        written[name] = checkpointer.read_metadata(8)
        checkpointer.close()
    assert written["k4"][1] == written["k1"][1]  # the iterator state
    assert written["k4"][0]["integrity"] == written["k1"][0]["integrity"]
    shutil.rmtree(tmp_path / "k4" / "10")  # a crash before the final save
    shutil.copytree(tmp_path / "k1", tmp_path / "from6", ignore=shutil.ignore_patterns("8", "18", ".lock"))
    for directory, resumed_at, calls in (("k4", 8, [(12, 4), (16, 4), (18, 2)]),
                                        ("from6", 6, [(8, 2), (12, 4), (16, 4), (18, 2)])):
        rec, ckpt = Recorder(), CheckpointCallback(tmp_path / directory, every_steps=4)
        resumed, resumed_setup = make_trainer([rec, ckpt], trainer_kwargs={"steps_per_execution": 4})
        assert resumed.fit(num_steps=18).resumed_from == resumed_at
        assert [(logs.step, logs.steps) for logs in rec.logs] == calls
        assert_bitwise_equal(single_setup.model, resumed_setup.model)
        assert_bitwise_equal(single.optimizer, resumed.optimizer)
        assert resumed.iterator.get_state() == single.iterator.get_state()
        assert rec.metrics[18] == reference.metrics[18]


def test_callbacks_see_one_call_and_schedules_fire_where_their_step_was_crossed(tmp_path):
    rec = Recorder()
    trainer, _ = make_trainer([rec, CheckpointCallback(tmp_path, on_steps=(3,))], eval_every_steps=3,
                              trainer_kwargs={"steps_per_execution": 2})
    trainer.fit(num_steps=5)
    assert rec.events == [
        "train_begin",
        ("data_wait_begin", 1), ("data_wait_end", 1), ("step_begin", 1), ("step_end", 2),
        ("data_wait_begin", 3), ("data_wait_end", 3), ("step_begin", 3),
        ("checkpoint_save", 4, False), ("step_end", 4), ("eval_begin", 4), ("eval_end", 4),  # step 3 crossed
        ("data_wait_begin", 5), ("data_wait_end", 5), ("step_begin", 5), ("step_end", 5),  # the last step alone
        ("checkpoint_save", 5, True), ("train_end", 5)]
    assert [(logs.step, logs.steps, logs.batch_size, logs.metrics_step) for logs in rec.logs] == [
        (2, 2, 16, None), (4, 2, 16, 2), (5, 1, 8, 4)]
    assert sorted(rec.metrics) == [2, 4, 5]


class CountReads:
    """Counts the trainer's reads of step metrics from the device."""

    def __init__(self, monkeypatch):
        import datarax.train.loop.step as step_module

        self.reads, original = [], step_module.host_metrics

        def counted(out, metric_fns):
            self.reads.append(out)
            return original(out, metric_fns)

        monkeypatch.setattr(step_module, "host_metrics", counted)


@pytest.mark.parametrize("k", [1, 4])
def test_metrics_are_read_from_the_device_only_when_looked_at(monkeypatch, k):
    from datarax.train.callbacks import MetricLogger

    class Quiet:
        def write_scalars(self, step, scalars):
            self.written.append((step, scalars))

    writer = Quiet()
    writer.written = []
    counter = CountReads(monkeypatch)
    trainer, _ = make_trainer([MetricLogger([writer], every_steps=8)], trainer_kwargs={"steps_per_execution": k})
    result = trainer.fit(num_steps=20)
    # The logger's schedule (steps 8 and 16, seen one call late) and the end of fit: three reads in 20 steps.
    assert [step for step, _ in writer.written] == [8, 16, 20]
    assert len(counter.reads) == 3
    assert writer.written[-1][1] == {f"train/{k}": v for k, v in result.metrics.items()}
    assert trainer.last_metrics == result.metrics
