"""Composition strategies against numpy references, their gradients, and their error messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from on_cpu import float64_on_cpu

from datarax import Pipeline
from datarax.core.operator import BatchContext, OperatorConfig, PerRecordOperator, record_keys
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.strategies import (
    BranchOperator,
    BranchOperatorConfig,
    EnsembleOperator,
    EnsembleOperatorConfig,
    ParallelOperator,
    ParallelOperatorConfig,
    ProbabilisticOperator,
    ProbabilisticOperatorConfig,
    SelectorOperator,
    SelectorOperatorConfig,
    SequentialOperator,
    WeightedParallelOperator,
    WeightedParallelOperatorConfig,
)
from datarax.sources import MemorySource
from datarax.typing import Element

B = 6
X = np.arange(B * 2, dtype=np.float32).reshape(B, 2) - 5
LABEL = np.array([0, 1, 2, 3, 4, 5], np.int32)
CTX = BatchContext.for_batch(B, record_ids=[10, 11, 12, 13, 14, 15])


def batch():
    return Element({"x": jnp.asarray(X), "label": jnp.asarray(LABEL)})


def affine(mul, add=0.0):
    return ElementOperator(fn=lambda el: el.update_data({"x": el.data["x"] * mul + add}))


def noisy(seed):
    return ElementOperator(ElementOperatorConfig(stochastic=True),
                           fn=lambda el, key: el.update_data({"x": el.data["x"] + jax.random.normal(key, (2,))}),
                           rngs=nnx.Rngs(seed))


class Gain(PerRecordOperator):
    """x -> sin(w * x) with a learnable w."""

    def __init__(self, w):
        self._init_rng(OperatorConfig(), None)
        self.w = nnx.Param(jnp.asarray(w))

    def apply_element(self, element, key):
        return element.update_data({"x": jnp.sin(element.data["x"] * self.w[...])})


def test_sequential_applies_in_order():
    out = SequentialOperator(operators=[affine(2.0), affine(1.0, 3.0), affine(-1.0)]).apply_batch(batch(), CTX)
    np.testing.assert_allclose(out.data["x"], -(X * 2 + 3))
    np.testing.assert_array_equal(out.data["label"], LABEL)


PARALLEL = [
    ("concat", None, np.concatenate([X * 2, X + 1], axis=-1)),
    ("stack", None, np.stack([X * 2, X + 1], axis=1)),
    ("sum", None, X * 2 + X + 1),
    ("mean", None, (X * 2 + X + 1) / 2),
    ("concat", 0, np.concatenate([X * 2, X + 1], axis=1)),
]


@pytest.mark.parametrize("mode,axis,want", PARALLEL)
def test_parallel_merges_float_fields_and_passes_others(mode, axis, want):
    op = ParallelOperator(ParallelOperatorConfig(merge=mode, axis=axis), operators=[affine(2.0), affine(1.0, 1.0)])
    out = op.apply_batch(batch(), CTX)
    np.testing.assert_allclose(out.data["x"], want)
    np.testing.assert_array_equal(out.data["label"], LABEL)  # int field from the first branch, unmerged


def test_parallel_dict_merge_and_explicit_fields():
    op = ParallelOperator(ParallelOperatorConfig(merge="dict", names=("a", "b"), fields=("x", "label")),
                          operators=[affine(2.0), affine(1.0, 1.0)])
    out = op.apply_batch(batch(), CTX)
    np.testing.assert_allclose(out.data["x"]["a"], X * 2)
    np.testing.assert_allclose(out.data["x"]["b"], X + 1)
    np.testing.assert_array_equal(out.data["label"]["b"], LABEL)


@pytest.mark.parametrize("how,ref", [("mean", np.mean), ("sum", np.sum), ("max", np.max), ("min", np.min)])
def test_ensemble_reductions(how, ref):
    muls = [2.0, -1.0, 0.5]
    op = EnsembleOperator(EnsembleOperatorConfig(reduce=how), operators=[affine(m) for m in muls])
    out = op.apply_batch(batch(), CTX)
    np.testing.assert_allclose(out.data["x"], ref(np.stack([X * m for m in muls]), axis=0), rtol=1e-6)


def test_weighted_parallel_fixed_weights_used_as_given():
    op = WeightedParallelOperator(WeightedParallelOperatorConfig(weights=(0.25, 2.0)),
                                  operators=[affine(2.0), affine(1.0, 1.0)])
    np.testing.assert_allclose(op.apply_batch(batch(), CTX).data["x"], 0.25 * X * 2 + 2.0 * (X + 1))
    assert nnx.state(op, nnx.Param) == nnx.State({})


def central_difference(f, x, eps=1e-6):
    x = np.asarray(x, np.float64)
    grads = np.zeros_like(x)
    for i in range(x.size):
        step = np.zeros_like(x)
        step.flat[i] = eps
        grads.flat[i] = (f(x + step) - f(x - step)) / (2 * eps)
    return grads


def test_weighted_parallel_learnable_weight_gradient_matches_finite_differences():
    with float64_on_cpu():
        x = Element({"x": jnp.asarray(X, jnp.float64) / 7})
        op = WeightedParallelOperator(WeightedParallelOperatorConfig(weights=(1.0, 3.0), learnable=True),
                                      operators=[Gain(0.9), affine(-1.5, 0.25)])
        np.testing.assert_allclose(op.weights(), [0.25, 0.75], rtol=1e-12)

        @nnx.jit
        def loss(module):
            return jnp.sum(module.apply_batch(x, CTX).data["x"] ** 3)

        grad = nnx.grad(loss)(op)
        logits = np.asarray(op.logits[...])

        def loss_at(values):
            op.logits[...] = jnp.asarray(values)
            return float(loss(op))

        fd = central_difference(loss_at, logits)
        op.logits[...] = jnp.asarray(logits)
        assert np.all(np.abs(grad.logits[...]) > 1e-3)
        np.testing.assert_allclose(grad.logits[...], fd, rtol=1e-6)
        # The Param inside a branch gets its gradient too.
        w = float(op.operators[0].w[...])
        fd_w = central_difference(lambda v: (op.operators[0].w.__setitem__(..., v[0]), float(loss(op)))[1], [w])
        op.operators[0].w[...] = w
        np.testing.assert_allclose(grad.operators[0].w[...], fd_w[0], rtol=1e-6)


def ROUTER(el):
    return el.data["label"] % 3


def test_branch_picks_the_routed_branch_per_record():
    op = BranchOperator(router=ROUTER, branches=[affine(1.0), affine(10.0), affine(0.0, -1.0)])
    out = op.apply_batch(batch(), CTX)
    route = LABEL % 3
    want = np.where((route == 0)[:, None], X, np.where((route == 1)[:, None], X * 10, -1.0))
    np.testing.assert_allclose(out.data["x"], want)
    np.testing.assert_array_equal(out.data["label"], LABEL)


def test_branch_clips_out_of_range_indices():
    op = BranchOperator(router=lambda el: el.data["label"] - 2, branches=[affine(1.0), affine(10.0)])
    want = np.where((LABEL - 2 >= 1)[:, None], X * 10, X)
    np.testing.assert_allclose(op.apply_batch(batch(), CTX).data["x"], want)


def test_stochastic_router_draws_by_record_identity():
    def coin(el, key):
        return jax.random.bernoulli(key, 0.5)

    op = BranchOperator(BranchOperatorConfig(stochastic=True), router=coin, branches=[affine(1.0), affine(-1.0)],
                        rngs=nnx.Rngs(3))
    coins = np.asarray(jax.vmap(lambda k: jax.random.bernoulli(k, 0.5))(record_keys(op.key, CTX)))
    np.testing.assert_allclose(op.apply_batch(batch(), CTX).data["x"], np.where(coins[:, None], -X, X))


def test_gradient_of_param_inside_branch_matches_finite_differences():
    with float64_on_cpu():
        x = Element({"x": jnp.asarray(X, jnp.float64) / 5, "label": jnp.asarray(LABEL)})
        op = BranchOperator(router=lambda el: el.data["label"] % 2, branches=[affine(3.0), Gain(1.3)])

        @nnx.jit
        def loss(module):
            return jnp.sum(module.apply_batch(x, CTX).data["x"] ** 2)

        grad = float(nnx.grad(loss)(op).branches[1].w[...])
        branch = op.branches[1]

        def loss_at(v):
            branch.w[...] = v[0]
            return float(loss(op))

        fd = central_difference(loss_at, [1.3])[0]
        odd = np.asarray(x.data["x"])[LABEL % 2 == 1]
        by_hand = np.sum(2 * np.sin(1.3 * odd) * np.cos(1.3 * odd) * odd)  # only routed records contribute
        assert abs(grad) > 1e-3
        np.testing.assert_allclose(grad, fd, rtol=1e-6)
        np.testing.assert_allclose(grad, by_hand, rtol=1e-10)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_probabilistic_applies_with_per_record_coin(p):
    op = ProbabilisticOperator(ProbabilisticOperatorConfig(probability=p), operator=affine(-1.0),
                               rngs=nnx.Rngs(0))
    draws = np.asarray(jax.vmap(jax.random.uniform)(record_keys(op.key, CTX)))
    np.testing.assert_allclose(op.apply_batch(batch(), CTX).data["x"], np.where((draws < p)[:, None], -X, X))


def test_probabilistic_decision_does_not_depend_on_batch_composition():
    op = ProbabilisticOperator(operator=affine(-1.0), rngs=nnx.Rngs(0))
    full = op.apply_batch(batch(), CTX).data["x"]
    part = op.apply_batch(Element({"x": jnp.asarray(X[3:]), "label": jnp.asarray(LABEL[3:])}),
                          BatchContext.for_batch(3, record_ids=[13, 14, 15])).data["x"]
    np.testing.assert_array_equal(full[3:], part)


@pytest.mark.parametrize("learnable", [False, True])
def test_selector_chooses_one_operator_per_record(learnable):
    probs = (0.2, 0.5, 0.3)
    op = SelectorOperator(SelectorOperatorConfig(probabilities=probs, learnable=learnable),
                          operators=[affine(1.0), affine(2.0), affine(3.0)], rngs=nnx.Rngs(5))
    logits = np.log(np.asarray(probs) / sum(probs))
    choice = np.asarray(jax.vmap(lambda k: jax.random.categorical(k, logits))(record_keys(op.key, CTX)))
    out = op.apply_batch(batch(), CTX).data["x"]
    np.testing.assert_array_equal(out, X * (choice + 1)[:, None])  # exact, also with straight-through


def test_selector_learnable_logits_get_the_soft_mixture_gradient():
    op = SelectorOperator(SelectorOperatorConfig(learnable=True), operators=[affine(1.0), affine(-2.0)],
                          rngs=nnx.Rngs(5))
    grad = nnx.jit(nnx.grad(lambda m: jnp.sum(m.apply_batch(batch(), CTX).data["x"])))(op).logits[...]

    def soft(logits):
        w = jax.nn.softmax(logits)
        return jnp.sum(w[0] * X + w[1] * (-2.0 * X))

    np.testing.assert_allclose(grad, jax.grad(soft)(op.logits[...]), rtol=1e-6)


def test_strategies_work_as_linear_stages_and_dag_nodes():
    data = {"x": X, "label": LABEL}
    parallel = ParallelOperator(ParallelOperatorConfig(merge="sum"), operators=[affine(2.0), affine(3.0)])
    branch = BranchOperator(router=ROUTER, branches=[affine(1.0), affine(10.0), affine(0.0, -1.0)])
    linear = Pipeline(MemorySource(data=data), stages=[SequentialOperator(operators=[parallel, branch])], batch_size=4)
    dag = Pipeline.from_dag(source=MemorySource(data=data), nodes={"p": parallel, "b": branch},
                            edges={"p": [], "b": ["p"]}, sink="b", batch_size=4)
    route = LABEL % 3
    want = np.where((route == 0)[:, None], 5 * X, np.where((route == 1)[:, None], 50 * X, -1.0))
    for pipeline in (linear, dag):
        got = np.concatenate([np.asarray(b["x"]) for b in pipeline])
        np.testing.assert_allclose(got, want)


CONFIG_ERRORS = [
    (lambda: ParallelOperatorConfig(merge="zip"), ValueError,
     r"ParallelOperatorConfig.merge must be one of \('concat', 'stack', 'sum', 'mean', 'dict'\), got 'zip'"),
    (lambda: ParallelOperatorConfig(axis=1.5), TypeError, r"ParallelOperatorConfig.axis must be an int or None"),
    (lambda: ParallelOperatorConfig(fields="x"), TypeError, r"ParallelOperatorConfig.fields must be None or a tuple"),
    (lambda: EnsembleOperatorConfig(reduce="median"), ValueError,
     r"EnsembleOperatorConfig.reduce must be one of \('mean', 'sum', 'max', 'min'\), got 'median'"),
    (lambda: WeightedParallelOperatorConfig(weights=(1.0, float("nan"))), TypeError,
     r"weights must be None or a tuple of finite numbers"),
    (lambda: WeightedParallelOperatorConfig(weights=(1.0, 0.0), learnable=True), ValueError,
     r"weights must all be > 0 when learnable=True"),
    (lambda: WeightedParallelOperatorConfig(learnable=1), TypeError, r"learnable must be True or False, got 1"),
    (lambda: ProbabilisticOperatorConfig(probability=1.5), ValueError,
     r"probability must be a number in \[0, 1\], got 1.5"),
    (lambda: ProbabilisticOperatorConfig(stream_name=""), ValueError, r"stream_name must be a non-empty string"),
    (lambda: SelectorOperatorConfig(probabilities=(0.5, -1)), ValueError, r"probabilities must be None or a tuple"),
    (lambda: SelectorOperatorConfig(learnable="yes"), TypeError, r"learnable must be True or False"),
]


@pytest.mark.parametrize("make,error,message", CONFIG_ERRORS)
def test_config_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


class Reshape(PerRecordOperator):
    def __init__(self):
        self._init_rng(OperatorConfig(), None)

    def apply_element(self, element, key):
        return element.update_data({"x": element.data["x"][:1]})


OPERATOR_ERRORS = [
    (lambda: SequentialOperator(operators=affine(1.0)), TypeError, r"operators must be a list of operators, got "),
    (lambda: SequentialOperator(operators=[]), ValueError, r"SequentialOperator needs at least 1 operator\(s\), got 0"),
    (lambda: EnsembleOperator(operators=[affine(1.0), "x"]), TypeError, r"operators\[1\] must be an operator"),
    (lambda: BranchOperator(router=ROUTER, branches=[affine(1.0)]), ValueError,
     r"BranchOperator branches needs at least 2 operator\(s\), got 1"),
    (lambda: BranchOperator(BranchOperatorConfig(stochastic=True), router=ROUTER,
                            branches=[affine(1.0), affine(2.0)], rngs=nnx.Rngs(0)),
     TypeError,
     r"BranchOperator is stochastic but router .* takes no key argument; define it as router\(element, key\)"),
    (lambda: ParallelOperator(ParallelOperatorConfig(merge="dict", names=("a",)), operators=[affine(1.0), affine(2.0)]),
     ValueError, r"names has 1 names \('a',\) for 2 operators; give one name per operator"),
    (lambda: WeightedParallelOperator(WeightedParallelOperatorConfig(weights=(1.0,)), operators=[affine(1.0),
                                                                                                 affine(2.0)]),
     ValueError, r"weights has 1 weights \(1.0,\) for 2 operators; give one weight per operator"),
    (lambda: SelectorOperator(SelectorOperatorConfig(probabilities=(1.0,)), operators=[affine(1.0), affine(2.0)],
                              rngs=nnx.Rngs(0)),
     ValueError, r"probabilities has 1 entries \(1.0,\) for 2 operators; give one per operator"),
    (lambda: ProbabilisticOperator(operator=lambda el: el, rngs=nnx.Rngs(0)), TypeError,
     r"ProbabilisticOperator operator must be an operator"),
    (lambda: ParallelOperator(EnsembleOperatorConfig(), operators=[affine(1.0)]), TypeError,
     r"config must be a ParallelOperatorConfig, got EnsembleOperatorConfig"),
    (lambda: EnsembleOperator(ParallelOperatorConfig(), operators=[affine(1.0)]), TypeError,
     r"config must be an EnsembleOperatorConfig"),
    (lambda: WeightedParallelOperator(ParallelOperatorConfig(), operators=[affine(1.0)]), TypeError,
     r"config must be a WeightedParallelOperatorConfig"),
    (lambda: SelectorOperator(ParallelOperatorConfig(), operators=[affine(1.0)]), TypeError,
     r"config must be a SelectorOperatorConfig"),
    (lambda: ProbabilisticOperator(ParallelOperatorConfig(), operator=affine(1.0)), TypeError,
     r"config must be a ProbabilisticOperatorConfig"),
    (lambda: BranchOperator(ParallelOperatorConfig(), router=ROUTER, branches=[affine(1.0)]), TypeError,
     r"config must be a BranchOperatorConfig"),
]


@pytest.mark.parametrize("make,error,message", OPERATOR_ERRORS)
def test_operator_construction_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def drop_label():
    return ElementOperator(fn=lambda el: Element({"x": el.data["x"]}, el.state))


APPLY_ERRORS = [
    (lambda: ParallelOperator(operators=[affine(1.0), drop_label()]), ValueError,
     r"branch outputs must have the same fields: branch 0 gives \['label', 'x'\], branch 1 gives \['x'\]"),
    (lambda: EnsembleOperator(EnsembleOperatorConfig(fields=("y",)), operators=[affine(1.0)]), KeyError,
     r"merges fields \['y'\], but the branch outputs have fields \['label', 'x'\]; fix EnsembleOperatorConfig.fields"),
    (lambda: BranchOperator(router=ROUTER, branches=[affine(1.0), Reshape()]), ValueError,
     r"BranchOperator branches must produce the same fields .* branch 0 gives \(\"\[0\]\['x'\]\", \(6, 2\), "
     r"'float32'\), branch 1 gives \(\"\[0\]\['x'\]\", \(6, 1\), 'float32'\)"),
    (lambda: BranchOperator(router=lambda el: jnp.float32(0.0), branches=[affine(1.0), affine(2.0)]), TypeError,
     r"router .* must return one integer per record, got .*float32"),
    (lambda: ProbabilisticOperator(operator=Reshape(), rngs=nnx.Rngs(0)), ValueError,
     r"ProbabilisticOperator \(input vs. operator output\) branches must produce the same fields"),
]


@pytest.mark.parametrize("make,error,message", APPLY_ERRORS)
def test_errors_when_applied(make, error, message):
    with pytest.raises(error, match=message):
        make().apply_batch(batch(), CTX)


def test_structure_names_config_and_children():
    op = ParallelOperator(ParallelOperatorConfig(merge="mean"), operators=[noisy(0), affine(2.0)])
    assert op.structure().startswith("Parallel(ParallelOperatorConfig(merge='mean'")
    assert "ElementOperator(ElementOperatorConfig(stochastic=True" in op.structure()


