"""`scan`: a whole training epoch (pipeline + small MLP train step) as scanned compiled calls.

65,536 records x 64 float32 features, 10 classes, shuffled, batch 256 (256 steps per epoch).
Pipeline: a per-record keyed noise augmentation (x + 0.05 * normal). Train step: a 64-128-10 MLP,
softmax cross-entropy, SGD with momentum. datarax runs the epoch with
`ScanRunner(steps_per_call=len(pipeline))`: gather, augmentation and the step for all 256 steps
in one `lax.scan`, with the model and optimizer as NNX modules.

Floor: the same epoch hand-written as one jitted `lax.scan` over plain jax pytrees (params and
optax state), fed a precomputed permutation per epoch. Also reported: the per-step loop
(`for batch in pipeline: step(model, optimizer, batch)` with `nnx.jit`), for context.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.registry import BenchOptions
from benchmarks.timing import block, epoch_rate, row
from datarax import Pipeline
from datarax.core.element import Element
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.scan import ScanRunner
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS = 65_536
BATCH = 256
FEATURES, HIDDEN, CLASSES = 64, 128, 10


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
    return {"x": x, "y": np.argmax(x @ w, axis=1).astype(np.int32)}


def jitter(x: jax.Array, key: jax.Array) -> jax.Array:
    return x + 0.05 * jax.random.normal(key, x.shape)


def augment(element: Element, key: jax.Array) -> Element:
    return element.update_data({"x": jitter(element.data["x"], key)})


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(FEATURES, HIDDEN, rngs=rngs)
        self.out = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


def optimizer_tx() -> optax.GradientTransformation:
    return optax.sgd(0.05, momentum=0.9)


def train_step(model: MLP, optimizer: nnx.Optimizer, batch: dict) -> jax.Array:
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def build(data: dict, seed: int = 0):
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=augment, rngs=nnx.Rngs(seed))
    pipeline = Pipeline(source=source, stages=[op], batch_size=BATCH, drop_remainder=True)
    model = MLP(nnx.Rngs(seed))
    return pipeline, model, nnx.Optimizer(model, optimizer_tx(), wrt=nnx.Param)


def build_floor(n: int, model: MLP, seed: int = 0):
    """The same epoch in plain jax: params pytree, optax state, one jitted scan."""
    key = jax.random.key(seed)
    tx = optimizer_tx()
    params = jax.tree.map(jnp.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))

    def forward(params, x):
        h = jax.nn.relu(x @ params["hidden"]["kernel"] + params["hidden"]["bias"])
        return h @ params["out"]["kernel"] + params["out"]["bias"]

    @jax.jit
    def epoch_fn(params, opt_state, x, y, perm, epoch):
        base = jax.random.fold_in(key, epoch)

        def step(carry, idx):
            params, opt_state = carry
            keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(idx)
            xb = jax.vmap(jitter)(jnp.take(x, idx, axis=0), keys)
            yb = jnp.take(y, idx, axis=0)
            loss, grads = jax.value_and_grad(
                lambda p: optax.softmax_cross_entropy_with_integer_labels(forward(p, xb), yb).mean())(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), perm)
        return params, opt_state, losses

    state = {"params": params, "opt": tx.init(params)}

    def run_epoch(arrays, epoch):
        perm = np.random.default_rng((seed, epoch)).permutation(n)[: n // BATCH * BATCH].astype(np.int32)
        state["params"], state["opt"], losses = epoch_fn(state["params"], state["opt"], arrays["x"], arrays["y"],
                                                         perm.reshape(-1, BATCH), epoch)
        return [losses]

    return run_epoch


def run(options: BenchOptions) -> list[dict]:
    n = max(BATCH, options.records(NUM_RECORDS) // BATCH * BATCH)
    data = make_data(n)

    pipeline, model, optimizer = build(data)
    runner = ScanRunner(train_step, steps_per_call=len(pipeline))
    start = time.perf_counter()
    block(runner.run(iter(pipeline), model, optimizer))  # warm-up epoch, compiles
    first_epoch_s = time.perf_counter() - start
    ours = epoch_rate(lambda: [runner.run(iter(pipeline), model, optimizer)], n, options.repeats)

    loop_pipeline, loop_model, loop_opt = build(data)
    step = nnx.jit(train_step)
    def loop_epoch():
        return [step(loop_model, loop_opt, batch) for batch in loop_pipeline]
    block(loop_epoch())
    loop = epoch_rate(loop_epoch, n, options.repeats)

    trainer = {k: trainer_epoch(data, k) for k in (n // BATCH, 1)}
    rates = {k: epoch_rate(epoch, n, options.repeats) for k, epoch in trainer.items()}

    arrays = {k: jax.device_put(v) for k, v in data.items()}
    floor_epoch = build_floor(n, MLP(nnx.Rngs(0)))
    start = time.perf_counter()
    block(floor_epoch(arrays, 0))
    floor_first_s = time.perf_counter() - start
    counter = iter(range(1, 10**6))
    floor = epoch_rate(lambda: floor_epoch(arrays, next(counter)), n, options.repeats)
    return [row("scan", ours, floor, records=n, batch_size=BATCH, steps_per_call=len(pipeline),
                first_epoch_s=round(first_epoch_s, 3), floor_first_epoch_s=round(floor_first_s, 3),
                loop_el_s=round(loop["el_s"], 1), loop_ratio=round(loop["el_s"] / floor["el_s"], 3),
                trainer_el_s=round(rates[n // BATCH]["el_s"], 1), trainer_k1_el_s=round(rates[1]["el_s"], 1),
                trainer_ratio=round(rates[n // BATCH]["el_s"] / floor["el_s"], 3))]


def trainer_epoch(data: dict, steps_per_execution: int):
    """A warmed-up `Trainer` over `build`'s pipeline and model; returns a function training one more epoch."""
    from datarax.train import Trainer

    pipeline, model, _ = build(data)

    def loss_fn(model, batch):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    trainer = Trainer(model, optimizer_tx(), pipeline, loss_fn, compilation_cache=False,
                      steps_per_execution=steps_per_execution)
    trainer.fit(num_epochs=1)  # compiles

    def epoch():
        trainer.fit(num_steps=trainer.step + len(pipeline))
        return [nnx.state(model, nnx.Param)]

    return epoch
