"""Learned augmentation: augmentation magnitudes trained jointly with a classifier on 10 digits per class.

    python -m recipes.learned_augmentation [--workdir DIR] [--quick] [--seed N] [--steps N] [--reward R]

Three policies, each trained from the same start on the same small labelled subset (10 images
per class of scikit-learn's digits; every other digit is the test set), over several seeds:

* none: the images as they are;
* fixed: a hand-tuned affine warp (rotation 15 degrees, shift 10%, zoom 15%) plus brightness
  and contrast jitter of 30%;
* learned: the same operators with learnable, bounded magnitudes starting near zero, plus a
  learnable choice among identity, a light blur and a horizontal flip (selection logits with a
  straight-through gradient), all trained jointly with the classifier by
  `Trainer(train_pipeline_params=True)` under the Augerino-style width reward (see
  `recipes.augerino`).

It reports the test accuracy of each policy (mean, spread over seeds) and the learned
magnitudes and selection probabilities, and plots both.
"""

from __future__ import annotations

import sys

import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.image import (AffineConfig, AffineOperator, BrightnessConfig, BrightnessOperator, ContrastConfig,
                                     ContrastOperator, GaussianBlurConfig, GaussianBlurOperator, HorizontalFlipConfig,
                                     HorizontalFlipOperator)
from datarax.operators.strategies import SelectorOperator, SelectorOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig
from recipes import common
from recipes.augerino import AugmentationPolicy, PolicyTracker, policy_values, width_rewarded_loss
from recipes.data import load_digits, per_class_split
from recipes.models import CLASSIFICATION_METRICS, ConvNet, as_float_image, classification_loss
from datarax.train import joint_optimizer

NAME = "learned_augmentation"
NUM_CLASSES = 10
POLICIES = ("none", "fixed", "learned")
DEFAULT = {"steps": 500, "seeds": 3, "per_class": 10, "batch_size": 50, "learning_rate": 2e-3, "policy_learning_rate": 0.03,
           "reward": 0.5}
QUICK = {"steps": 60, "seeds": 1, "per_class": 10, "batch_size": 50, "learning_rate": 3e-3, "policy_learning_rate": 0.03,
         "reward": 0.5}
FIXED = {"degrees": 15.0, "translate": 0.1, "scale": 0.15, "brightness": 0.3, "contrast": 0.3}
LEARNED_START = {"degrees": 3.0, "translate": 0.02, "scale": 0.03, "brightness": 0.05, "contrast": 0.05}
CHOICES = ("identity", "blur", "hflip")
CHOICE_START = (0.8, 0.1, 0.1)


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 16.0)})


def identity(element):
    return element


def policy_stages(policy: str, seed: int) -> list:
    """The pipeline stages of one policy (after the uint8 -> float conversion)."""
    if policy == "none":
        return []
    rngs = nnx.Rngs(augment=seed)
    learn = policy == "learned"
    m = LEARNED_START if learn else FIXED
    affine = ("degrees", "translate", "scale") if learn else False
    ops = [
        AffineOperator(AffineConfig(degrees=m["degrees"], translate=m["translate"], scale=m["scale"],
                                    learnable=affine), rngs=rngs),
        BrightnessOperator(BrightnessConfig(max_delta=m["brightness"], learnable=learn), rngs=rngs),
        ContrastOperator(ContrastConfig(max_delta=m["contrast"], learnable=learn), rngs=rngs),
    ]
    if not learn:
        return ops
    choices = [ElementOperator(ElementOperatorConfig(), fn=identity),
               GaussianBlurOperator(GaussianBlurConfig(sigma=0.6, stochastic=False, kernel_size=3)),
               HorizontalFlipOperator(HorizontalFlipConfig(stochastic=False))]
    selector = SelectorOperator(SelectorOperatorConfig(probabilities=CHOICE_START, learnable=True), operators=choices, rngs=rngs)
    scales = {"Affine.degrees": FIXED["degrees"], "Affine.translate": FIXED["translate"], "Affine.scale": FIXED["scale"],
              "Brightness.max_delta": FIXED["brightness"], "Contrast.max_delta": FIXED["contrast"]}
    return [AugmentationPolicy([*ops, selector], scales=scales)]


def build(policy: str, seed: int, cfg: dict) -> tuple[Pipeline, Pipeline]:
    images, labels = load_digits()
    train_idx, test_idx = per_class_split(labels, cfg["per_class"], seed=seed)
    to_float_op = ElementOperator(ElementOperatorConfig(), fn=to_float)
    train = MemorySource(MemorySourceConfig(shuffle=True, seed=seed),
                         data={"image": images[train_idx], "label": labels[train_idx]})
    test = MemorySource(MemorySourceConfig(), data={"image": images[test_idx], "label": labels[test_idx]})
    train_pipeline = Pipeline(train, [to_float_op, *policy_stages(policy, seed)], batch_size=cfg["batch_size"],
                              drop_remainder=True)
    eval_pipeline = Pipeline(test, [ElementOperator(ElementOperatorConfig(), fn=to_float)], batch_size=512)
    return train_pipeline, eval_pipeline


def optimizer(cfg: dict, learned: bool) -> optax.GradientTransformation:
    """AdamW with warm-up and cosine decay for the classifier; Adam at a larger, constant rate for the policy."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])
    classifier = optax.adamw(schedule, weight_decay=1e-4)
    return joint_optimizer(classifier, optax.adam(cfg["policy_learning_rate"])) if learned else classifier


def run_policy(workdir, policy: str, seed: int, cfg: dict) -> dict:
    train_pipeline, eval_pipeline = build(policy, seed, cfg)
    model = ConvNet(1, NUM_CLASSES, seed=seed)
    learned = policy == "learned"
    policy_stage = train_pipeline.stages[-1] if learned else None
    tracker = [PolicyTracker(policy_stage, every=max(1, cfg["steps"] // 25))] if learned else []
    loss = width_rewarded_loss(cfg["reward"]) if learned else classification_loss
    _, run = common.train_run(workdir / "runs" / f"{policy}-seed{seed}", model, optimizer(cfg, learned),
                              train_pipeline, loss, steps=cfg["steps"], eval_pipeline=eval_pipeline,
                              metrics=CLASSIFICATION_METRICS, joint=learned, label=f"[{policy} seed {seed}] ",
                              log_every=max(1, cfg["steps"] // 4), callbacks=tracker)
    record = {"policy": policy, "seed": seed, "test_accuracy": run.eval_metrics["accuracy"], "run": run.as_dict()}
    if learned:
        record["learned"] = policy_values(policy_stage)
        record["history"] = tracker[0].history
    print(f"[{policy} seed {seed}] test accuracy {record['test_accuracy']:.4f}; {run.goodput.get('diagnosis')}",
          flush=True)
    return record


def summarise(records: list[dict]) -> tuple[dict, dict]:
    by_policy = {p: [r["test_accuracy"] for r in records if r["policy"] == p] for p in POLICIES}
    stats = {p: common.mean_std(v) for p, v in by_policy.items()}
    learned = [r["learned"] for r in records if r["policy"] == "learned"]
    keys = [k for k in learned[0] if not k.startswith("selection")]
    magnitudes = {k: common.mean_std([l[k] for l in learned]) for k in keys}
    probs = np.mean([l["selection"] for l in learned], axis=0)
    magnitudes["selection_probabilities"] = dict(zip(CHOICES, map(float, probs)))
    return stats, magnitudes


def plot(workdir, stats: dict, records: list[dict]) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    means = [stats[p]["mean"] for p in POLICIES]
    ax1.bar(POLICIES, means, yerr=[stats[p]["std"] for p in POLICIES], color=["#868e96", "#1c7ed6", "#2b8a3e"],
            capsize=6)
    for i, p in enumerate(POLICIES):
        ax1.scatter([i] * stats[p]["n"], [r["test_accuracy"] for r in records if r["policy"] == p], color="k", s=12)
    ax1.set(ylim=(max(0.0, min(means) - 0.15), 1.0), ylabel="test accuracy",
            title=f"digits, {records[0]['run']['step']} steps, mean +- std over {stats['none']['n']} seeds")
    history = next(r["history"] for r in records if r["policy"] == "learned")
    steps = [h["step"] for h in history]
    for key in [k for k in history[0] if k not in ("step",) and not k.startswith("selection")]:
        ax2.plot(steps, [h[key] for h in history], label=key)
    for i, name in enumerate(CHOICES):
        ax2.plot(steps, [h["selection"][i] for h in history], linestyle="--", label=f"P({name})")
    ax2.set(xlabel="step", yscale="log", title="learned policy (first seed)")
    ax2.legend(fontsize=7, ncol=2)
    return common.save_figure(fig, workdir / "learned_augmentation.png")


def main(argv: list[str] | None = None) -> int:
    def extra(parser):
        parser.add_argument("--reward", type=float, default=None, help="weight of the width reward")

    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    cfg["reward"] = cfg["reward"] if args.reward is None else args.reward
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    print(f"{len(POLICIES)} policies x {len(seeds)} seeds, {cfg['per_class']} labelled digits per class, "
          f"{cfg['steps']} steps each", flush=True)
    records = [run_policy(workdir, policy, seed, cfg) for seed in seeds for policy in POLICIES]
    stats, magnitudes = summarise(records)
    figure = plot(workdir, stats, records)
    gap = stats["learned"]["mean"] - stats["fixed"]["mean"]
    metrics = {"chance_accuracy": 1.0 / NUM_CLASSES, "learned_minus_fixed": gap,
               **{f"{p}_accuracy_mean": stats[p]["mean"] for p in POLICIES},
               **{f"{p}_accuracy_std": stats[p]["std"] for p in POLICIES}}
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "fixed_policy": FIXED, "learned_start": LEARNED_START, "choices": CHOICES},
        "accuracy": stats, "learned_policy": magnitudes, "runs": records, "plot": figure}, args)
    print()
    for p in POLICIES:
        s = stats[p]
        print(f"{p:>8}: test accuracy {s['mean']:.4f} +- {s['std']:.4f} (min {s['min']:.4f}, max {s['max']:.4f}, "
              f"{s['n']} seeds)")
    verdict = "beats" if gap > 0 else "does not beat"
    print(f"the learned policy {verdict} the hand-tuned one: {gap:+.4f} accuracy (mean over seeds)")
    print("learned magnitudes (mean over seeds): " + ", ".join(
        f"{k} {v['mean']:.3g}" for k, v in magnitudes.items() if k != "selection_probabilities"))
    print("learned selection probabilities: " + ", ".join(
        f"{k} {v:.3f}" for k, v in magnitudes["selection_probabilities"].items()))
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
