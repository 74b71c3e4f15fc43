"""`InvariantModel`: copies keyed by record identity (each copy's outputs and their average), S = 1 as the
pipeline itself, where gradients reach, the prior penalty, and its refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.image import RotationOperator, TranslateOperator
from datarax.sources import MemorySource
from datarax.train.invariance import InvariantModel, with_prior

COPIES = 3
# A TPU's float32 exp and log are off by up to about 1e-4 (relative; 6e-5 seen), and it may round a bilinear sum
# otherwise than another program does; a CPU's to float32's last bits.
RTOL = 1e-6 if jax.default_backend() == "cpu" else 1e-4


class Flatten(nnx.Module):
    """Returns the images themselves (flattened), so the averaged outputs are the mean of the copies."""

    def __init__(self):
        self.scale = nnx.Param(jnp.ones(()))

    def __call__(self, x):
        return self.scale[...] * x.reshape(x.shape[0], -1)


def build(copies=COPIES, stages=None, **kwargs):
    rng = np.random.default_rng(0)
    data = {"image": rng.random((10, 5, 5, 1)).astype(np.float32), "label": np.arange(10, dtype=np.int32)}
    stages = [RotationOperator(degrees=50.0, learnable=True, rngs=nnx.Rngs(4)),
              TranslateOperator(translate=0.2, rngs=nnx.Rngs(5))] if stages is None else stages
    pipeline = Pipeline(MemorySource(data=data), stages, batch_size=5)
    return InvariantModel(Flatten(), pipeline, copies=copies, **kwargs), pipeline, data


def raw(data, ids, epoch):
    ids = np.asarray(ids)
    return {"image": jnp.asarray(data["image"][ids]), "label": jnp.asarray(data["label"][ids]),
            "record_ids": jnp.asarray(ids, jnp.int32), "epoch": jnp.full(ids.shape, epoch, jnp.int32)}


def test_copy_s_of_record_i_is_drawn_as_record_i_times_s_plus_s_whatever_the_batch():
    model, pipeline, data = build()
    outputs = nnx.jit(lambda model, batch: model(batch))

    @jax.jit
    def by_hand(image, record_id, epoch):  # the stages on one record, under the copy's record id
        ctx = BatchContext(record_id[None], epoch, jnp.ones((1,), bool))
        element = Element({"image": image[None]})
        for stage in pipeline.stages:
            element = stage(element, ctx)
        return element.data["image"].reshape(-1)

    each = nnx.jit(lambda model, batch: model.copy_outputs(batch))
    for ids, epoch in (([0, 1, 2, 3], 0), ([3, 0, 9], 0), ([3, 0, 9], 2)):
        out = np.asarray(outputs(model, raw(data, ids, epoch)))
        per_copy = np.asarray(each(model, raw(data, ids, epoch)))
        assert per_copy.shape == (COPIES, len(ids), 25)
        for row, i in enumerate(ids):
            copies = [by_hand(jnp.asarray(data["image"][i]), jnp.int32(i * COPIES + s), jnp.int32(epoch))
                      for s in range(COPIES)]
            np.testing.assert_allclose(out[row], np.mean(copies, axis=0), rtol=1e-5, atol=1e-6)
            for s in range(COPIES):  # copy_outputs: each copy before the average (a TPU rounds one copy's
                # bilinear sums otherwise than the by-hand program by up to 1e-5: RTOL there)
                np.testing.assert_allclose(per_copy[s, row], copies[s], rtol=max(RTOL, 1e-5), atol=max(RTOL, 1e-6))


def test_one_copy_is_the_pipeline_itself():
    model, pipeline, data = build(copies=1)
    batch = raw(data, [4, 1, 8], 3)
    expected = jax.jit(lambda b: pipeline.transform({"image": b["image"], "label": b["label"]},
                                                    record_ids=b["record_ids"], epoch=3)["image"])(batch)
    # The same draws; the two programs may round the bilinear sums differently.
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, b: m(b))(model, batch)),
                               np.asarray(expected).reshape(3, -1), rtol=RTOL, atol=RTOL)


def test_the_magnitudes_get_a_gradient_only_through_augmentation():
    model, _, data = build()
    batch = raw(data, [0, 1, 2], 0)

    def grads(through):
        def loss(model):
            return jnp.sum(jnp.square(model.outputs(batch, through_augmentation=through)))

        return nnx.jit(nnx.grad(loss))(model)

    magnitude = ("augment", "stages", 0, "magnitudes", "degrees", "raw")
    plain = dict(nnx.to_flat_state(grads(False)))
    through = dict(nnx.to_flat_state(grads(True)))
    assert float(plain[magnitude][...]) == 0.0 and float(through[magnitude][...]) != 0.0
    np.testing.assert_allclose(float(plain[("model", "scale")][...]), float(through[("model", "scale")][...]),
                               rtol=1e-6)


@pytest.mark.parametrize("per_call", [1, 2, 3])
def test_copies_per_call_runs_the_network_in_pieces_with_the_same_outputs_and_gradients(per_call):
    class Rows(Flatten):  # records the row count of each call (at trace time)
        calls: list = []

        def __call__(self, x):
            Rows.calls.append(x.shape[0])
            return super().__call__(x)

    whole, _, data = build()  # COPIES = 3 in one call
    _, pipeline, _ = build()
    pieces = InvariantModel(Rows(), pipeline, copies=COPIES, copies_per_call=per_call)
    batch = raw(data, [4, 0, 7, 2], 1)

    def grads(model):
        return nnx.grad(lambda m: jnp.sum(jnp.square(m.outputs(batch, through_augmentation=True))))(model)

    Rows.calls = []
    np.testing.assert_array_equal(np.asarray(pieces(batch)), np.asarray(whole(batch)))
    assert Rows.calls == [per_call * 4] * (COPIES // per_call) + [COPIES % per_call * 4] * (COPIES % per_call > 0)
    for (path, a), (_, b) in zip(nnx.to_flat_state(grads(pieces)), nnx.to_flat_state(grads(whole))):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), rtol=RTOL, err_msg=str(path))


@pytest.mark.parametrize("prior", ["layerwise", "scalar"])
def test_the_prior_penalty_is_the_prior_per_training_record(prior):
    class Two(nnx.Module):
        def __init__(self):
            self.a = nnx.Param(jnp.arange(3.0))
            self.b = nnx.Param(jnp.full((2, 2), 0.5))

        def __call__(self, x):
            return x.reshape(x.shape[0], -1)[:, :2] * self.a[...][:2] + self.b[...][0]

    _, pipeline, data = build()
    model = InvariantModel(Two(), pipeline, copies=2, prior=prior, prior_precision=2.0)
    deltas = [2.0, 2.0]
    if prior == "layerwise":
        model.log_prior_precision[...] = jnp.log(jnp.asarray([2.0, 5.0]))
        deltas = [2.0, 5.0]
    expected = (deltas[0] * 5.0 + deltas[1] * 1.0) / (2 * 10)  # ||a||^2 = 5, ||b||^2 = 1, N = 10
    np.testing.assert_allclose(float(model.prior_penalty()), expected, rtol=RTOL)

    def loss(model, batch):
        return jnp.float32(1.5)

    np.testing.assert_allclose(float(with_prior(loss)(model, raw(data, [0], 0))), 1.5 + expected, rtol=RTOL)
    model.settled[...] = jnp.ones(())  # once the marginal likelihood is done (`until`), the loss alone
    assert float(with_prior(loss)(model, raw(data, [0], 0))) == 1.5
    np.testing.assert_allclose(float(model.prior_penalty()), expected, rtol=RTOL)  # the prior itself unchanged


def test_refusals_name_the_argument_and_the_fix():
    model, pipeline, data = build()
    with pytest.raises(KeyError, match="pipeline.raw_loader"):
        model({"image": jnp.asarray(data["image"][:2])})
    with pytest.raises(ValueError, match="field 'pixels' is not an output"):
        InvariantModel(Flatten(), pipeline, field="pixels")
    with pytest.raises(ValueError, match="copies must be an int >= 1"):
        InvariantModel(Flatten(), pipeline, copies=0)
    with pytest.raises(ValueError, match=r"copies_per_call must be an int in \[1, 3\]"):
        InvariantModel(Flatten(), pipeline, copies=3, copies_per_call=4)
    with pytest.raises(ValueError, match="prior must be one of"):
        InvariantModel(Flatten(), pipeline, prior="diagonal")
    with pytest.raises(TypeError, match="InvariantModel: pipeline must be a datarax Pipeline"):
        InvariantModel(Flatten(), pipeline.program)
    with pytest.raises(TypeError, match="must be an InvariantModel"):
        with_prior(lambda model, batch: 0.0)(Flatten(), {})
    assert jax.tree.leaves(nnx.state(model, InvariantModel.trained))  # the network's parameters only
    assert len(jax.tree.leaves(nnx.state(model, InvariantModel.trained))) == 1
