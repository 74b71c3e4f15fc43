"""The vision recipe's training loop with a linear model: the steady device-busy share of its goodput
report under each loop setting, one JSON line a run (docs/tpu.md, "The vision recipe").

    python benchmarks/tpu/busy_probe.py [--runs 2]

Settings: `fused` (the Trainer makes each call's 60 batches inside it) or `iterator` (the batches
come from the pipeline's iterator), with checkpoints by time (`recipes.common`'s accelerator rule)
or every 300 steps (its CPU rule). The model is the 64-10 linear layer so the CPU can run 60 steps
a call (its convolutions are slow inside a loop); on a chip the recipe itself is the measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import optax  # noqa: E402  (after the path: the repository's packages)
from flax import nnx  # noqa: E402

import datarax.train.loop.trainer as trainer_module  # noqa: E402
from recipes import common, vision  # noqa: E402
from recipes.models import CLASSIFICATION_METRICS, classification_loss  # noqa: E402


class Linear(nnx.Module):
    def __init__(self):
        self.layer = nnx.Linear(64, 10, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.layer(x.reshape(x.shape[0], -1))


def measure(fused: bool, by_time: bool) -> dict:
    supports = trainer_module.FusedSteps.supports
    on_accelerator = common.on_accelerator
    if not fused:
        trainer_module.FusedSteps.supports = staticmethod(lambda loader: False)
    common.on_accelerator = lambda: by_time  # the checkpoint rule only; the pipeline sees the real backend
    try:
        train, test, _ = vision.build_pipelines(0, 64)
        with tempfile.TemporaryDirectory() as directory:
            _, outcome = common.train_run(Path(directory), Linear(), optax.adam(1e-3), train, classification_loss,
                                          steps=1200, eval_pipeline=test, metrics=CLASSIFICATION_METRICS,
                                          steps_per_execution=60, goodput_plot=False)
            steady = json.loads((Path(directory) / "goodput.json").read_text())["steady"]
    finally:
        trainer_module.FusedSteps.supports = supports
        common.on_accelerator = on_accelerator
    return {"fused": fused, "checkpoints": "every 60 s" if by_time else "every 300 steps",
            "backend": common.jax.default_backend(), **{k: round(steady[k], 6) for k in (
                "goodput_pct", "data_stall_pct", "checkpoint_idle_pct", "loop_idle_pct", "span_s", "step_time_s",
                "host_next_s")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.runs):
        for fused, by_time in ((True, True), (False, True), (True, False)):
            print(json.dumps(measure(fused, by_time)), flush=True)


if __name__ == "__main__":
    main()
