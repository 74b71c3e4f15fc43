"""A small CNN trained through a datarax pipeline, resumable after any crash.

    python examples/train_demo.py --workdir /tmp/run --steps 200

Run it again with the same --workdir (and the same arguments: --steps shapes the learning-rate
schedule) and it resumes from the latest checkpoint, also after SIGKILL; SIGTERM/SIGINT save and
exit 0. A finished run writes `<workdir>/result.json` with the
step, final metrics and `params_sha256`, which equals that of an uninterrupted run, and
`goodput.json` / `goodput.png` with the data-stall report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.checkpoint import run_script, state_sha256
from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator
from datarax.monitoring.writers import ConsoleWriter, JsonlWriter
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train.callbacks import CheckpointCallback, GoodputMonitor, LearningRateLogger, MetricLogger, ProgressBar
from datarax.train.loop.trainer import Trainer
from datarax.train.metrics.writers import TensorBoardWriter, tensorboard_available

NUM_CLASSES = 4
SIZE = 8


def make_images(num: int, seed: int) -> dict[str, np.ndarray]:
    """8x8 grey images of four flip-invariant patterns (row stripes, column stripes, checkers, blob) + noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    patterns = np.stack([(yy % 2 == 0), (xx % 2 == 0), ((yy + xx) % 2 == 0),
                         ((yy - 3.5) ** 2 + (xx - 3.5) ** 2 < 6)]).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, num)
    images = 150 * patterns[labels] + rng.normal(40, 25, (num, SIZE, SIZE))
    return {"image": np.clip(images, 0, 255).astype(np.uint8)[..., None], "label": labels.astype(np.int32)}


class SlowSource(MemorySource):
    """A host-resident MemorySource whose every batch read sleeps (to show an input-bound run)."""

    def __init__(self, data: dict, *, seed: int, delay_s: float):
        super().__init__(MemorySourceConfig(shuffle=True, seed=seed, device_resident=False), data=data)
        self.delay_s = delay_s

    def get_batch(self, indices, out=None):
        time.sleep(self.delay_s)
        return super().get_batch(indices, out)


class LearnableNoise(PerRecordOperator):
    """Adds Gaussian noise of a learnable, bounded strength: sigmoid(p) * max_std."""

    def __init__(self, max_std: float = 0.3, *, rngs: nnx.Rngs):
        self.max_std = max_std
        self.p = nnx.Param(jnp.asarray(-1.0))
        self._init_rng(OperatorConfig(stochastic=True), rngs)

    def apply_element(self, element: Element, key: jax.Array) -> Element:
        std = jax.nn.sigmoid(self.p[...]) * self.max_std
        image = element.data["image"]
        return element.update_data({"image": image + std * jax.random.normal(key, image.shape)})


def to_float(element: Element) -> Element:
    return element.update_data({"image": element.data["image"].astype(jnp.float32) / 255.0})


def random_flip(element: Element, key: jax.Array) -> Element:
    image = element.data["image"]
    flip = jax.random.bernoulli(key)
    return element.update_data({"image": jnp.where(flip, image[:, ::-1], image)})


class SmallCNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, (3, 3), strides=2, rngs=rngs)
        self.head = nnx.Linear(16, NUM_CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        return self.head(x.mean(axis=(1, 2)))


def loss_fn(model: SmallCNN, batch: dict):
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


METRICS = {"accuracy": lambda batch, logits: (logits.argmax(-1) == batch["label"]).mean()}


def build_pipelines(args) -> tuple[Pipeline, Pipeline]:
    train_data, eval_data = make_images(args.num_records, args.seed), make_images(128, args.seed + 1)
    if args.input_delay_ms > 0:
        source = SlowSource(train_data, seed=args.seed, delay_s=args.input_delay_ms / 1000)
    else:
        source = MemorySource(MemorySourceConfig(shuffle=True, seed=args.seed), data=train_data)
    stages = [ElementOperator(ElementOperatorConfig(), fn=to_float),
              ElementOperator(ElementOperatorConfig(stochastic=True), fn=random_flip, rngs=nnx.Rngs(args.seed)),
              LearnableNoise(rngs=nnx.Rngs(args.seed + 1))]
    train = Pipeline(source, stages, batch_size=args.batch_size, drop_remainder=True)
    evaluation = Pipeline(MemorySource(data=eval_data), [ElementOperator(ElementOperatorConfig(), fn=to_float)],
                          batch_size=64)
    return train, evaluation


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="checkpoints, logs and result.json go here")
    parser.add_argument("--steps", type=int, default=200, help="total training steps (counted from step 0)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-records", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--input-delay-ms", type=float, default=0.0,
                        help="sleep per batch in a host-resident source (simulates a slow input pipeline)")
    parser.add_argument("--joint", action="store_true", help="train the pipeline's noise strength with the model")
    parser.add_argument("--accumulate-steps", type=int, default=1,
                        help="micro-batches per step (gradient accumulation; --batch-size must divide by it)")
    parser.add_argument("--ema-decay", type=float, default=None, help="keep a moving average of the parameters")
    parser.add_argument("--precision", choices=("f32", "bf16", "f16"), default="f32")
    parser.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps during training")
    parser.add_argument("--keep-best", type=int, default=None,
                        help="also keep the N best checkpoints by eval/loss (needs --eval-every)")
    parser.add_argument("--sync-checkpoints", action="store_true", help="block on every checkpoint write")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events")
    parser.add_argument("--no-plot", action="store_true", help="skip goodput.png (matplotlib is slow to import)")
    parser.add_argument("--compile-cache", default=None,
                        help="directory of JAX's persistent compilation cache (default <workdir>/jax_cache); "
                             "a restarted run loads its compiled programs from it instead of compiling again")
    parser.add_argument("--no-compile-cache", action="store_true", help="do not use a compilation cache")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "num_records", "checkpoint_every", "keep", "log_every", "accumulate_steps"):
        if getattr(args, name) < (0 if name == "steps" else 1):
            parser.error(f"--{name.replace('_', '-')} must be {'>= 0' if name == 'steps' else '>= 1'}, "
                         f"got {getattr(args, name)}")
    if args.keep_best is not None and args.eval_every is None:
        parser.error("--keep-best ranks checkpoints by eval/loss: give --eval-every N too")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    result_path = workdir / "result.json"
    result_path.unlink(missing_ok=True)
    if not args.no_compile_cache:
        # A restarted run loads its compiled step instead of compiling again: restarts stay cheap.
        cache = args.compile_cache if args.compile_cache is not None else workdir / "jax_cache"
        jax.config.update("jax_compilation_cache_dir", str(cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    train, evaluation = build_pipelines(args)
    # Built inside one jitted call: one compiled program instead of one per initializer op, which
    # keeps a restart's start-up short (with the compilation cache it is loaded, not compiled).
    model = nnx.jit(lambda: SmallCNN(rngs=nnx.Rngs(args.seed)))()
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.learning_rate, min(10, max(args.steps, 1)),
                                                  max(args.steps, 1))
    writers = [ConsoleWriter(), JsonlWriter(workdir / "metrics.jsonl")]
    if args.tensorboard:
        if not tensorboard_available():
            raise SystemExit("--tensorboard needs tensorboardX (pip install tensorboardX) or torch")
        writers.append(TensorBoardWriter(workdir / "tensorboard"))
    best = {} if args.keep_best is None else {"keep_best": args.keep_best, "best_metric": "eval/loss"}
    checkpoints = CheckpointCallback(workdir / "checkpoints", every_steps=args.checkpoint_every,
                                     max_to_keep=args.keep, asynchronous=not args.sync_checkpoints, **best)
    plot = not args.no_plot and importlib.util.find_spec("matplotlib") is not None
    goodput = GoodputMonitor(workdir, plot=plot)
    callbacks = [checkpoints, goodput, LearningRateLogger(schedule), MetricLogger(writers, every_steps=args.log_every)]
    if not args.no_progress and sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None:
        callbacks.append(ProgressBar())
    # The warmup starts at 0, so the optimizer alone does not show the rate: a rerun with another
    # --learning-rate (or model seed) is refused instead of adopting this run's checkpoint.
    run_config = {"learning_rate": args.learning_rate, "seed": args.seed, "joint": args.joint}
    trainer = Trainer(model, optax.adam(schedule), train, loss_fn, eval_pipeline=evaluation, metrics=METRICS,
                      callbacks=callbacks, train_pipeline_params=args.joint, run_config=run_config,
                      eval_every_steps=args.eval_every, accumulate_steps=args.accumulate_steps,
                      ema_decay=args.ema_decay, precision=args.precision)
    result = trainer.fit(num_steps=args.steps)
    resumed_from = checkpoints.restored.step if checkpoints.restored is not None else None
    if result.stop_reason is not None:
        print(f"stopped by {result.stop_reason} at step {result.step}; checkpoint saved in "
              f"{checkpoints.directory}; run again to resume", flush=True)
        return 0
    eval_metrics = trainer.evaluate()
    summary = goodput.report or {}
    record = {
        "step": result.step, "train_metrics": result.metrics, "eval_metrics": eval_metrics,
        "params_sha256": state_sha256(model), "resumed_from": resumed_from,
        "checkpoints": checkpoints.checkpointer.steps(),
        "goodput": {"diagnosis": summary.get("diagnosis"), "buckets_pct": summary.get("buckets_pct")},
    }
    if args.joint:
        record["pipeline_sha256"] = state_sha256(train)
    if trainer.ema is not None:
        record["ema_sha256"] = state_sha256(trainer.ema)
        record["ema_eval_metrics"] = trainer.evaluate(ema=True)
    checkpoints.close()
    tmp = result_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, result_path)
    print(f"done: step {result.step}, eval accuracy {eval_metrics['accuracy']:.3f}, "
          f"params_sha256 {record['params_sha256'][:16]}... -> {result_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
