"""`train_step`: what the input pipeline adds to a small ResNet's training step.

A ResNet (CIFAR layout: a 3x3 stem, four stages of two basic blocks, global pooling) trains with
SGD + momentum on 32x32x3 uint8 records, shuffled, augmented as in `cifar` (reflect-pad 4 random
crop, flip, normalise), batch 256. Sides, timed in alternating epochs:

* `step alone`: the same jitted step on one batch already on the device (no input pipeline):
  the model's own rate, the ceiling of every other side;
* `step alone, guarded`: the same with `datarax.train`'s bad-step guard compiled in (`StepGuard`:
  the gradients' global norm, the finiteness checks and the keep-or-drop of the update), its
  `guard_cost_pct` the share of the step time the guard adds;
* `datarax`: the `cifar_builtin` pipeline (device-resident data, built-in operators) feeding the step;
* on an accelerator, host-side peers feeding the step as their users do (a NumPy loader on every
  host core, Grain at its default and with a worker per core, tf.data when installed), each batch
  `device_put` before the step; each peer alternates with `step alone` after the datarax rounds,
  and its loader is stopped before the next one is built.

`pipeline_share_pct` is `100 * (1 - side / step alone)`: the share of the training time the
pipeline costs, against the `step alone` of the datarax rounds (the one timed beside a peer,
while its loader works in the background, is in the peer's settings). On the CPU the model is
narrower (widths 8-64) and the epoch shorter, so the scenario stays quick where it only checks
that it runs.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time

import jax
import optax
from flax import nnx

from benchmarks.peers.common import PeerOptions
from benchmarks.peers.runner import holds_accelerator, installed, processes_off_the_chip, workload
from benchmarks.registry import BenchOptions
from benchmarks.scenarios.cifar import BATCH, HOST_PEERS, build_builtin_pipeline, make_data

RECORDS = {"cpu": 2_048}
DEFAULT_RECORDS = 50_000
WIDTHS = {"cpu": (8, 16, 32, 64)}
DEFAULT_WIDTHS = (64, 128, 256, 512)  # ResNet-18's


class Block(nnx.Module):
    def __init__(self, cin: int, cout: int, stride: int, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=stride, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(cout, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(cout, rngs=rngs)
        self.skip = (nnx.Conv(cin, cout, (1, 1), strides=stride, use_bias=False, rngs=rngs)
                     if stride != 1 or cin != cout else None)

    def __call__(self, x):
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nnx.relu(y + (x if self.skip is None else self.skip(x)))


class ResNet(nnx.Module):
    """ResNet-18's layout for 32x32 inputs (two basic blocks per stage)."""

    def __init__(self, widths: tuple[int, ...], num_classes: int = 10, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, widths[0], (3, 3), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(widths[0], rngs=rngs)
        blocks, cin = [], widths[0]
        for i, width in enumerate(widths):
            blocks += [Block(cin, width, 1 if i == 0 else 2, rngs), Block(width, width, 1, rngs)]
            cin = width
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(cin, num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2)))


def make_step(model: ResNet, tx: optax.GradientTransformation, guard: bool = False):
    """A jitted, buffer-donating `step(state, batch) -> (state, loss)` over the split model; with
    `guard`, the trainer's bad-step check decides inside it whether the update applies."""
    from datarax.train.loop.guard import GuardState, StepGuardConfig, check_step
    from datarax.train.loop.precision import keep_if

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    guard_def, guard_state = nnx.split(GuardState(StepGuardConfig().window))

    def loss_fn(params, rest, batch):
        model = nnx.merge(graphdef, params, rest, copy=True)
        logits = model(batch["image"])
        labels = jax.nn.one_hot(batch["label"], logits.shape[-1])
        loss = optax.softmax_cross_entropy(logits, labels).mean()
        return loss, nnx.split(model, nnx.Param, ...)[2]  # the batch statistics it updated

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, batch):
        params, rest, opt_state, *checked = state
        (loss, new_rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, batch)
        updates, new_opt = tx.update(grads, opt_state, params)
        new = (optax.apply_updates(params, updates), new_rest, new_opt)
        if not guard:
            return new, loss
        checker = nnx.merge(guard_def, checked[0])
        applies, _ = check_step(checker, StepGuardConfig(), loss, grads, check_grads=True)
        old, new = jax.tree.leaves((params, rest, opt_state)), jax.tree.leaves(new)
        kept = jax.tree.unflatten(jax.tree.structure((params, rest, opt_state)),
                                  keep_if(applies, new, old, [False] * len(new)))
        return (*kept, nnx.state(checker)), loss

    return step, (params, rest, tx.init(params), *([guard_state] if guard else []))


COMPILES = [0]  # backend compiles in this process since `count_compiles` first ran


def _on_event(name: str, _secs: float, **_kwargs) -> None:
    COMPILES[0] += "backend_compile" in name


@functools.cache
def count_compiles() -> None:
    """Counts backend compiles from here on (the listener is registered once per process)."""
    jax.monitoring.register_event_duration_secs_listener(_on_event)


def log(text: str) -> None:
    """A progress line on stderr (a side's epoch on a chip can take a while)."""
    print(f"train_step: {text}", file=sys.stderr, flush=True)


def timed_epochs(sides: dict, step, state, steps: int, repeats: int, own: dict | None = None
                 ) -> tuple[dict, dict, object]:
    """Records per second of `steps` training steps per side (each side a callable giving an
    iterator of device batches), sides alternating, after one untimed warm-up epoch each.
    Returns the median rates, every run's rate and the trained state (the step donates it).
    `own` gives a side its own `[step, state]` (trained in place) instead of the shared ones."""
    runs = {name: [] for name in sides}
    own = own or {}
    for round_ in range(repeats + 1):
        for name, batches in sides.items():
            compiles, start = COMPILES[0], time.perf_counter()
            loss = None
            for _, batch in zip(range(steps), batches()):
                if name in own:
                    own[name][1], loss = own[name][0](own[name][1], batch)
                    continue
                state, loss = step(state, batch)
            jax.block_until_ready(loss)
            seconds = time.perf_counter() - start
            log(f"{name}, {'warm-up' if not round_ else f'round {round_}'}: {steps} steps in {seconds:.2f} s"
                f" ({COMPILES[0] - compiles} compiles)")
            if round_:
                runs[name].append(steps * BATCH / seconds)
    return {name: statistics.median(r) for name, r in runs.items()}, runs, state


def row(name: str, rate: float, runs: list, alone: float, datarax: float, setting: str) -> dict:
    return {"scenario": "train_step", "framework": name, "el_s": round(rate, 1),
            "ratio_to_datarax": round(rate / datarax, 3), "ratio_to_floor": round(rate / alone, 3),
            "el_s_runs": [round(r, 1) for r in runs], "pipeline_share_pct": round(100 * (1 - rate / alone), 2),
            "settings": setting}


def run(options: BenchOptions) -> list[dict]:
    """`step alone` and `datarax` alternate; then each host peer alternates with `step alone` on
    its own, its loader stopped before the next is built: a loader's threads or worker processes
    left running take the host cores that dispatch the step (and compile it) from every side timed
    after it (on a TPU v5e host: 48 steps of `step alone` took 25 s after Grain's 13 workers had
    started, against 0.5 s before)."""
    count_compiles()
    backend = jax.default_backend()
    data = make_data(options.records(RECORDS.get(backend, DEFAULT_RECORDS)))
    steps = len(data["label"]) // BATCH
    widths = WIDTHS.get(backend, DEFAULT_WIDTHS)
    model = ResNet(widths, rngs=nnx.Rngs(0))
    step, state = make_step(model, optax.sgd(0.05, momentum=0.9))
    guarded = list(make_step(ResNet(widths, rngs=nnx.Rngs(0)), optax.sgd(0.05, momentum=0.9), guard=True))
    # Full batches only, as every other side gives: an epoch's short last batch would compile the
    # step again inside a timed epoch.
    pipeline = build_builtin_pipeline(data, drop_remainder=True)
    fixed = jax.device_put(next(iter(pipeline)))

    def alone_side():
        return iter(lambda: fixed, None)  # one batch, forever

    log(f"{len(data['label'])} records, widths {widths}: data and pipeline ready")
    described = f"ResNet widths {widths}, batch {BATCH}, {steps} steps an epoch"
    iterator = pipeline.epochs(None)
    try:
        rates, runs, state = timed_epochs({"step alone": alone_side, "step alone, guarded": alone_side,
                                           "datarax": lambda: iterator}, step, state, steps, options.repeats,
                                          own={"step alone, guarded": guarded})
    finally:
        iterator.close()
    alone, datarax = rates["step alone"], rates["datarax"]
    checked = rates["step alone, guarded"]
    guard_row = row("step alone, guarded", checked, runs["step alone, guarded"], alone, datarax,
                    f"{described}; the step with StepGuard's check, {100 * (1 - checked / alone):.1f}% slower")
    guard_row["guard_cost_pct"] = round(100 * (1 - checked / alone), 2)
    rows = [row("step alone", alone, runs["step alone"], alone, datarax, f"{described}; the step on one device batch"),
            guard_row,
            row("datarax", datarax, runs["datarax"], alone, datarax,
                f"{described}; adds {100 * (1 - datarax / alone):.1f}% to the step")]
    if not holds_accelerator():
        return rows
    for peer, label, workers in HOST_PEERS:
        fn = workload(peer, "cifar")
        if fn is None or not installed(peer):
            continue
        with processes_off_the_chip():
            loader = fn(data, PeerOptions(BATCH, options.repeats, workers=workers))
            log(f"{label}: loader built")
            try:
                peer_rates, peer_runs, state = timed_epochs(
                    {"step alone": alone_side, label: lambda: (jax.device_put(b) for b in loader.epoch())},
                    step, state, steps, options.repeats)
            finally:
                loader.close()
        rate = peer_rates[label]
        rows.append(row(label, rate, peer_runs[label], alone, datarax,
                        f"{described}; adds {100 * (1 - rate / alone):.1f}% to the step (step alone timed beside "
                        f"it, its loader working: {peer_rates['step alone']:,.0f} el/s); {loader.settings}; "
                        "host -> device_put"))
    return rows
