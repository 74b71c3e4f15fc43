"""HF fine-tuning: pretrain on some photographs, export to safetensors; probe, LoRA, fine-tune or scratch on others.

    python -m recipes.hf_finetune [--workdir DIR] [--quick] [--seed N] [--steps N]

The data are real photographs that ship with scikit-image and scikit-learn (nothing is
downloaded; `HF_DATASETS_OFFLINE=1`). The recipe crops square patches of a few sizes from each
photograph, stores them as JPEG bytes in local Parquet files with a HuggingFace `datasets.Image()`
feature, and reads them back with `datasets` through datarax's `HFSource` with
`encoded=("image",)`: the pipeline carries the JPEG bytes and `DecodeImage` decodes them on the
host to small RGB images (a random-resized crop when training, the whole patch when evaluating).
A patch's label is the photograph it comes from. Each photograph is cut into a grid of CELL x
CELL cells, split once (fixed seed) into test, validation and training cells; a patch lies inside
one cell, so no test or validation pixel is seen in training, and the test patches' cells are the
unit the bootstrap resamples.

A CNN is pretrained on plenty of labelled patches of six colour photographs, exported with Orbax
(`DIR/pretrained`) and to safetensors (`DIR/pretrained.safetensors`, PyTorch-layout keys through a
key table; the re-loaded network's forward is checked to equal the original's). Each task then
trains on a few labelled patches of other photographs with four arms, all loading the pretrained
backbone from the safetensors file except scratch:

* probe: the pretrained convolutions and hidden layer frozen, a fresh head trained;
* lora: the same, plus rank-`LORA_RANK` LoRA adapters on the hidden Linear layer (flax's
  `nnx.LoRALinear` covers Linear layers only, so the convolutions stay frozen);
* fine-tune: every weight trained, the pretrained ones at `BACKBONE_LR_FACTOR` of the head's rate;
* scratch: the same network from a fresh initialisation, every weight at the full rate.

Each arm's learning rate and weight decay are chosen on the validation cells from the same grid
(`lr_grid` x `wd_grid`), on a separate selection seed; then every arm trains on `seeds` seeds
(each a different labelled subset and initialisation; the same for every arm) for the same steps
and is evaluated once on the test cells. The table gives each arm's mean with a 95% t-interval
over seeds, paired differences with t-intervals and per-seed signs, and a cell-level bootstrap
interval (test cells resampled with replacement within each class) for each paired difference.

* photos: scikit-learn's china and flower (colour), scikit-image's camera and coins (grayscale) —
  colour alone tells two classes from the other two;
* photos_gray: the same four photographs, all converted to grayscale (no colour cue);
* textures (default configuration only): scikit-image's brick, grass and gravel (all grayscale).
"""

from __future__ import annotations

import functools
import io
import json
import os
import sys
import time
import zlib
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from datarax import Pipeline
from datarax.checkpoint import run_script
from datarax.host import DecodeImage
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.train.pretrained import (
    KeyMap,
    add_lora,
    discriminative,
    export_table,
    load_safetensors,
    load_table,
    lora_optimizer,
    probe_optimizer,
    save_safetensors,
)
from recipes import common
from recipes.data import SAMPLE_IMAGES, load_photograph, per_class_split
from recipes.models import CLASSIFICATION_METRICS, ConvNet, as_float_image, classification_loss, host_init

NAME = "hf_finetune"
DEFAULT = {"pretrain_steps": 600, "finetune_steps": 150, "seeds": 5, "batch_size": 20, "pretrain_batch_size": 64,
           "pretrain_learning_rate": 2e-3, "lr_grid": (1e-3, 3e-3, 1e-2), "wd_grid": (1e-4, 1e-1),
           "bootstrap": 2000, "tasks": ("photos", "photos_gray", "textures")}
QUICK = {**DEFAULT, "pretrain_steps": 80, "finetune_steps": 30, "seeds": 2, "lr_grid": (3e-3, 1e-2),
         "wd_grid": (1e-4,), "bootstrap": 200, "tasks": ("photos",)}
PRETRAIN_PHOTOS = SAMPLE_IMAGES  # astronaut, chelsea, coffee, rocket, immunohistochemistry, hubble_deep_field
# Each task: its photographs (one class each) and whether they are all converted to grayscale.
TASKS = {"photos": (("sklearn:china", "sklearn:flower", "camera", "coins"), False),
         "photos_gray": (("sklearn:china", "sklearn:flower", "camera", "coins"), True),
         "textures": (("brick", "grass", "gravel"), False)}
COLOUR_CUE = {"photos": True, "photos_gray": False, "textures": False}
ARMS = ("probe", "lora", "finetune", "scratch")
COMPARISONS = (("finetune", "scratch"), ("probe", "scratch"), ("lora", "scratch"), ("finetune", "probe"))
PER_CLASS = 8  # labelled fine-tuning patches per class
CELL = 32  # the grid cell a patch lies in; every cell is a test, validation or training cell
CELL_SPLIT = {"test": 0.25, "val": 0.15}  # fractions of each photograph's cells; the rest are training cells
CELL_SEED = 1234  # the cell split: fixed, independent of --seed
PATCH_SIZES = (24, 28, 32)
PATCHES = {"pretrain": {"train": 200, "test": 50}, "task": {"train": 100, "val": 60, "test": 100}}  # per photograph
JPEG_QUALITY = 90
SIZE = 24  # DecodeImage's output, the network's input
WIDTHS = (32, 32, 64, 64)
HIDDEN = 128
RANDOM_CROP_SCALE = (0.25, 1.0)
BACKBONE_LR_FACTOR = 0.1  # fine-tune: the pretrained layers' rate relative to the head's (fixed, not tuned)
LORA_RANK = 8
SELECTION_SEED = 1000  # added to --seed: the labelled subset and initialisation of the validation runs


def record_name(photo: str) -> str:
    return photo.split(":")[-1]


def split_cells(rows: int, cols: int) -> dict[str, np.ndarray]:
    """The cell indices (row-major) of each split: a fixed permutation cut into test, validation, training."""
    count = rows * cols
    order = np.random.default_rng(CELL_SEED).permutation(count)
    test = max(1, int(round(CELL_SPLIT["test"] * count)))
    val = max(1, int(round(CELL_SPLIT["val"] * count)))
    return {"test": np.sort(order[:test]), "val": np.sort(order[test:test + val]),
            "train": np.sort(order[test + val:])}


@functools.lru_cache(maxsize=None)
def photograph(photo: str, gray: bool) -> np.ndarray:
    image = load_photograph(photo)
    if gray and image.ndim == 3:
        from PIL import Image

        image = np.asarray(Image.fromarray(image).convert("L"))  # ITU-R 601 luma, as a grayscale JPEG stores it
    return image


def cut_patches(photo: str, split: str, count: int, gray: bool = False) -> list[tuple[bytes, str, int]]:
    """`count` JPEG-encoded square patches of `photo` from its `split` cells: (bytes, file name, cell index).

    A patch lies inside one cell of the split, at a random place, with a size from PATCH_SIZES.
    The places depend on the photograph and the split only, so the grayscale task cuts the same
    patches as the colour one.
    """
    from PIL import Image

    image = photograph(photo, gray)
    rows, cols = image.shape[0] // CELL, image.shape[1] // CELL
    cells = split_cells(rows, cols)[split]
    rng = np.random.default_rng([zlib.crc32(photo.encode()), ("train", "val", "test").index(split)])
    patches = []
    for i in range(count):
        cell = int(rng.choice(cells))
        size = int(rng.choice(PATCH_SIZES))
        y = (cell // cols) * CELL + int(rng.integers(0, CELL - size + 1))
        x = (cell % cols) * CELL + int(rng.integers(0, CELL - size + 1))
        buffer = io.BytesIO()
        Image.fromarray(image[y:y + size, x:x + size]).save(buffer, format="JPEG", quality=JPEG_QUALITY)
        patches.append((buffer.getvalue(), f"{record_name(photo)}-{split}{i}-y{y}-x{x}-s{size}.jpg", cell))
    return patches


@functools.lru_cache(maxsize=None)
def patch_set(photos: tuple[str, ...], split: str, per_photo: int, gray: bool = False
              ) -> tuple[list[tuple[bytes, str, int]], np.ndarray]:
    """Patches of every photograph (label = its position in `photos`) and their int32 labels."""
    records, labels = [], []
    for label, photo in enumerate(photos):
        records += cut_patches(photo, split, per_photo, gray)
        labels += [label] * per_photo
    return records, np.asarray(labels, np.int32)


def write_parquet(path: Path, records: list[tuple[bytes, str, int]], labels: np.ndarray) -> Path:
    """One Parquet file: an HF `Image` column `image` (JPEG bytes and a file name), int32 `label` and `cell`."""
    import datasets

    if path.exists():
        return path
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int32"),
                                  "cell": datasets.Value("int32")})
    table = datasets.Dataset.from_dict(
        {"image": [{"bytes": data, "path": name} for data, name, _ in records], "label": labels.tolist(),
         "cell": [cell for _, _, cell in records]}, features=features)
    tmp = path.with_suffix(".tmp")
    table.to_parquet(str(tmp))
    os.replace(tmp, path)
    return path


def write_pretraining(folder: Path) -> dict[str, Path]:
    """Parquet files of the pretraining photographs: train and test patches."""
    folder.mkdir(parents=True, exist_ok=True)
    return {split: write_parquet(folder / f"pretrain-{split}.parquet",
                                 *patch_set(PRETRAIN_PHOTOS, split, PATCHES["pretrain"][split]))
            for split in ("train", "test")}


def write_task(folder: Path, task: str, seed: int) -> dict[str, Path]:
    """Parquet files of a task: `PER_CLASS` labelled training patches per class chosen by `seed`, and every
    validation and test patch."""
    folder.mkdir(parents=True, exist_ok=True)
    photos, gray = TASKS[task]
    records, labels = patch_set(photos, "train", PATCHES["task"]["train"], gray)
    chosen, _ = per_class_split(labels, PER_CLASS, seed=seed)
    files = {"train": write_parquet(folder / f"{task}-train-seed{seed}.parquet", [records[i] for i in chosen],
                                    labels[chosen])}
    for split in ("val", "test"):
        files[split] = write_parquet(folder / f"{task}-{split}.parquet",
                                     *patch_set(photos, split, PATCHES["task"][split], gray))
    return files


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 255.0)})


def hf_pipeline(path: Path, cache: Path, batch_size: int, *, seed: int, train: bool) -> Pipeline:
    """A pipeline over one Parquet file read by `datasets` and `HFSource`, its JPEGs decoded by `DecodeImage`."""
    import datasets

    from datarax.sources.hf import HFSource, HFSourceConfig, load_files

    datasets.disable_progress_bars()  # one bar per small file only clutters the recipe's output
    dataset = load_files([path], cache_dir=str(cache))
    source = HFSource(HFSourceConfig(fields=("label", "cell"), encoded=("image",), shuffle=train, seed=seed),
                      dataset=dataset)
    # Training sees a random-resized crop of each patch (a new one each epoch); evaluation, the whole patch.
    decode = (DecodeImage(size=SIZE, crop="random_resized", scale=RANDOM_CROP_SCALE, seed=seed) if train
              else DecodeImage(size=SIZE))
    return Pipeline(source, [decode, ElementOperator(ElementOperatorConfig(), fn=to_float)],
                    batch_size=batch_size, drop_remainder=train)


def read_split(path: Path, cache: Path) -> dict[str, np.ndarray]:
    """Every patch of an evaluation file, decoded through the same HF pipeline: images, labels, cells (file order)."""
    pipeline = hf_pipeline(path, cache, 256, seed=0, train=False)
    try:
        batches = [{k: np.asarray(v) for k, v in batch.items() if k in ("image", "label", "cell")}
                   for batch in pipeline]
    finally:
        pipeline.source.close()
    return {k: np.concatenate([b[k] for b in batches]) for k in ("image", "label", "cell")}


@nnx.jit
def predict(model: nnx.Module, images: jax.Array) -> jax.Array:
    return model(images).argmax(-1)


def correct(model: nnx.Module, split: dict) -> np.ndarray:
    """Per patch: 1 where the model's class is the label (bool array in the split's order)."""
    return np.asarray(predict(model, split["image"])) == split["label"]


def _unit_adamw(learning_rate, weight_decay, steps: int) -> optax.GradientTransformation:
    """`optax.adamw(learning_rate * schedule, weight_decay)` with a unit warm-up + cosine schedule."""
    return optax.chain(optax.scale_by_adam(), optax.add_decayed_weights(weight_decay),
                       optax.scale_by_schedule(optax.warmup_cosine_decay_schedule(0.0, 1.0, max(1, steps // 20),
                                                                                  steps)),
                       optax.scale_by_learning_rate(learning_rate))


def adamw(learning_rate: float, weight_decay: float, steps: int) -> optax.GradientTransformation:
    """AdamW with warm-up and cosine decay; the rate and decay are optimiser state (`inject_hyperparams`), so
    every point of the grid runs the same compiled step."""
    return optax.inject_hyperparams(_unit_adamw, static_args=("steps",))(
        learning_rate=learning_rate, weight_decay=weight_decay, steps=steps)


def convnet_table(model: ConvNet) -> tuple[KeyMap, ...]:
    """PyTorch-layout safetensors keys for the recipe's ConvNet (`convs.0.weight` (out, in, 3, 3), ...)."""
    table = []
    for i in range(len(model.convs)):
        table += [KeyMap(f"convs.{i}.weight", f"convs.{i}.kernel", "conv"),
                  KeyMap(f"convs.{i}.bias", f"convs.{i}.bias")]
    for layer in ("hidden", "head"):
        table += [KeyMap(f"{layer}.weight", f"{layer}.kernel", "linear"), KeyMap(f"{layer}.bias", f"{layer}.bias")]
    return tuple(table)


def new_model(classes: int, seed: int) -> ConvNet:
    return ConvNet(3, classes, widths=WIDTHS, image_size=(SIZE, SIZE), hidden=HIDDEN, seed=seed)


def run_training(workdir: Path, run: str, model: ConvNet, tx, train_file: Path, batch_size: int, steps: int,
                 seed: int, label: str, *, eval_file: Path | None = None,
                 checkpoint: bool = False) -> common.RunOutcome:
    """Trains on `train_file` (and evaluates on `eval_file`), then stops the pipelines' decode threads."""
    cache = workdir / "hf_cache"
    train = hf_pipeline(train_file, cache, batch_size, seed=seed, train=True)
    test = hf_pipeline(eval_file, cache, 256, seed=seed, train=False) if eval_file is not None else None
    try:
        _, outcome = common.train_run(workdir / "runs" / run, model, tx, train, classification_loss, steps=steps,
                                      eval_pipeline=test, metrics=CLASSIFICATION_METRICS, label=label,
                                      log_every=max(1, steps // 2), checkpoint=checkpoint, goodput_plot=False)
    finally:
        train.source.close()
        if test is not None:
            test.source.close()
    return outcome


def pretrain(workdir: Path, cfg: dict, seed: int) -> dict:
    """Trains on the pretraining photographs (resumable), exports with Orbax and to safetensors, checks the export."""
    files = write_pretraining(workdir / "data")
    model = new_model(len(PRETRAIN_PHOTOS), seed)
    steps = cfg["pretrain_steps"]
    run = run_training(workdir, "pretrain", model, adamw(cfg["pretrain_learning_rate"], 1e-4, steps), files["train"],
                       cfg["pretrain_batch_size"], steps, seed, "[pretrain] ", eval_file=files["test"],
                       checkpoint=True)
    # Its cost over every invocation: a rerun that only restores the finished run adds nothing.
    timing = workdir / "runs" / "pretrain" / "seconds.json"
    seconds = json.loads(timing.read_text())["seconds"] if timing.exists() else 0.0
    if run.goodput.get("steps"):
        seconds += run.seconds
        timing.write_text(json.dumps({"seconds": seconds}))
    export = (workdir / "pretrained").absolute()
    if not export.exists():
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(export, nnx.state(model))
        checkpointer.wait_until_finished()
    tensors = workdir.absolute() / "pretrained.safetensors"
    save_safetensors(export_table(model, convnet_table(model)), tensors,
                     metadata={"format": "pt", "model": "recipes.models.ConvNet", "widths": json.dumps(WIDTHS),
                               "hidden": str(HIDDEN), "image_size": str(SIZE)})
    # The re-loaded network (a differently initialised one, filled from the file) must compute the same logits.
    test = read_split(files["test"], workdir / "hf_cache")
    reloaded = new_model(len(PRETRAIN_PHOTOS), seed + 1)
    load_table(reloaded, load_safetensors(tensors), convnet_table(reloaded), source=str(tensors))
    original, again = np.asarray(model(test["image"])), np.asarray(reloaded(test["image"]))
    check = {"max_abs_logit_difference": float(np.abs(original - again).max()),
             "equal": bool(np.array_equal(original, again)), "patches": int(len(test["label"]))}
    if not check["equal"]:
        raise RuntimeError(f"the safetensors export {tensors} does not reproduce the pretrained network's logits: "
                           f"max |difference| {check['max_abs_logit_difference']}")
    accuracy = float((original.argmax(-1) == test["label"]).mean())
    print(f"[pretrain] test accuracy {run.eval_metrics['accuracy']:.4f}; saved with Orbax to {export} and to "
          f"{tensors}; re-loaded logits equal the original's on {check['patches']} patches: {check['equal']}",
          flush=True)
    return {"test_accuracy": run.eval_metrics["accuracy"], "test_accuracy_from_logits": accuracy,
            "orbax_export": str(export), "safetensors_export": str(tensors), "export_check": check,
            "seconds": seconds}


def load_pretrained(tensors: Path, classes: int, seed: int) -> ConvNet:
    """A ConvNet filled from the safetensors export (through `convnet_table`), with a fresh head for `classes`."""
    model = new_model(len(PRETRAIN_PHOTOS), seed)
    load_table(model, load_safetensors(tensors), convnet_table(model), source=str(tensors))
    model.head = nnx.Linear(model.head.in_features, classes, rngs=nnx.Rngs(seed), **host_init(seed + 1))
    return model


def build_arm(arm: str, tensors: Path, classes: int, seed: int, lr: float, wd: float, steps: int):
    """The model and the optimizer (an optax transformation or an `nnx.Optimizer`) of one arm."""
    if arm == "scratch":
        return new_model(classes, seed), adamw(lr, wd, steps)
    model = load_pretrained(tensors, classes, seed)
    if arm == "probe":
        return model, probe_optimizer(model, adamw(lr, wd, steps), head=("head.",))
    if arm == "lora":
        add_lora(model, LORA_RANK, where=lambda path: path == "hidden", rngs=nnx.Rngs(seed))
        return model, lora_optimizer(model, adamw(lr, wd, steps), head=("head.",))  # the adapters and the fresh head
    if arm == "finetune":
        return model, discriminative(("head.", adamw(lr, wd, steps)),
                                     default=adamw(lr * BACKBONE_LR_FACTOR, wd, steps))
    raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")


def trained_parameters(model: nnx.Module, tx) -> int:
    if isinstance(tx, nnx.Optimizer):
        return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, tx.wrt))))
    return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def train_arm(workdir: Path, task: str, arm: str, tensors: Path, files: dict, split: dict, cfg: dict, seed: int,
              lr: float, wd: float, which: str) -> dict:
    """One run of an arm: trains, then scores every patch of `split` (validation or test). Resumes at run
    granularity: a finished run's record is read back from its directory."""
    steps = cfg["finetune_steps"]
    run = f"{task}-{arm}-{which}-seed{seed}-lr{lr:g}-wd{wd:g}-steps{steps}"
    record_path = workdir / "runs" / run / "record.json"
    if record_path.exists():
        return json.loads(record_path.read_text())
    model, tx = build_arm(arm, tensors, len(TASKS[task][0]), seed, lr, wd, steps)
    label = f"[{task} {arm} {which} seed {seed} lr {lr:g} wd {wd:g}] "
    outcome = run_training(workdir, run, model, tx, files["train"], cfg["batch_size"], steps, seed, label)
    hits = correct(model, split)
    record = {"arm": arm, "seed": seed, "learning_rate": lr, "weight_decay": wd, "split": which,
              "accuracy": float(hits.mean()), "correct": hits.astype(int).tolist(), "steps": outcome.step,
              "seconds": outcome.seconds, "step_ms": outcome.goodput.get("steady_step_ms"),
              "trained_parameters": trained_parameters(model, tx)}
    print(f"{label}{which} accuracy {record['accuracy']:.4f}", flush=True)
    record_path.write_text(json.dumps(record))
    return record


def t_interval(values: list[float]) -> dict:
    """Mean and the 95% t-interval over seeds (`common.interval`: mean +- t_{0.975, n-1} * sd / sqrt(n))."""
    stats = common.interval(values)
    half = stats["half"] if stats["half"] is not None else float("nan")
    return {"mean": stats["mean"], "low": stats["mean"] - half, "high": stats["mean"] + half, "half_width": half,
            "n": stats["n"]}


def cell_bootstrap(a: np.ndarray, b: np.ndarray, labels: np.ndarray, cells: np.ndarray, draws: int,
                   seed: int = 0) -> dict:
    """95% percentile interval of mean(a - b) (seeds x patches, averaged over both) with the test cells resampled.

    Each draw resamples every class's test cells with replacement (a cell drawn twice counts its
    patches twice), keeping the classes' weights; the statistic is the paired difference averaged
    over seeds and over the drawn cells' patches.
    """
    diff = (a.astype(np.float64) - b.astype(np.float64)).mean(axis=0)  # per patch, mean over seeds
    keys = labels.astype(np.int64) * 1_000_000 + cells.astype(np.int64)
    units, inverse = np.unique(keys, return_inverse=True)
    sums, counts = np.bincount(inverse, diff), np.bincount(inverse).astype(np.float64)
    rng = np.random.default_rng(seed)
    weights = np.zeros((draws, len(units)))
    for c in np.unique(labels):
        members = np.flatnonzero(units // 1_000_000 == c)
        picks = rng.integers(0, len(members), size=(draws, len(members)))
        for j in range(len(members)):
            np.add.at(weights, (np.arange(draws), members[picks[:, j]]), 1.0)
    stats = (weights @ sums) / (weights @ counts)
    low, high = np.percentile(stats, [2.5, 97.5])
    return {"estimate": float(diff.mean()), "low": float(low), "high": float(high), "draws": draws,
            "cells": int(len(units))}


def signs(values: list[float]) -> str:
    return "".join("+" if v > 1e-9 else "-" if v < -1e-9 else "0" for v in values)


def judge(interval: dict, bootstrap: dict, differences: list[float]) -> str:
    """A claim worded at the strength of its evidence: the t-interval over seeds decides; the seeds' signs and
    the cell bootstrap (test-sample noise only: the trained models are held fixed) are reported beside it."""
    if interval["n"] < 2:
        return "one seed: no interval"
    n = len(differences)
    agree = sum(1 for d in differences if np.sign(d) == np.sign(interval["mean"]) and abs(d) > 1e-9)
    cells = ("cell bootstrap excludes zero" if bootstrap["low"] > 0 or bootstrap["high"] < 0
             else "cell bootstrap covers zero")
    if interval["low"] > 0 or interval["high"] < 0:
        better = "higher" if interval["mean"] > 0 else "lower"
        seeds = f"on all {n} seeds" if agree == n else f"on {agree} of {n} seeds"
        return f"{better}: t-interval excludes zero ({seeds}; {cells})"
    seeds = f"; though all {n} seeds agree in sign" if agree == n else ""
    return f"no measurable difference: t-interval covers zero ({cells}{seeds})"


def run_task(workdir: Path, task: str, tensors: Path, cfg: dict, seeds: list[int], selection_seed: int) -> dict:
    photos, gray = TASKS[task]
    cache = workdir / "hf_cache"
    selection_files = write_task(workdir / "data", task, selection_seed)
    val, test = read_split(selection_files["val"], cache), read_split(selection_files["test"], cache)
    # Selection: every (lr, wd) of the grid, for every arm, on the selection seed, scored on validation.
    grid = [(lr, wd) for lr in cfg["lr_grid"] for wd in cfg["wd_grid"]]
    selection, chosen = {}, {}
    for arm in ARMS:
        selection[arm] = [train_arm(workdir, task, arm, tensors, selection_files, val, cfg, selection_seed, lr, wd,
                                    "val") for lr, wd in grid]
        best = max(selection[arm], key=lambda r: r["accuracy"])  # the first (smallest lr, wd) on ties
        chosen[arm] = {"learning_rate": best["learning_rate"], "weight_decay": best["weight_decay"],
                       "val_accuracy": best["accuracy"]}
    # Final: every arm, its chosen setting, every seed; the test split is scored once per run.
    final = {arm: [] for arm in ARMS}
    for seed in seeds:
        files = write_task(workdir / "data", task, seed)
        for arm in ARMS:
            final[arm].append(train_arm(workdir, task, arm, tensors, files, test, cfg, seed,
                                        chosen[arm]["learning_rate"], chosen[arm]["weight_decay"], "test"))
    accuracy = {arm: [r["accuracy"] for r in final[arm]] for arm in ARMS}
    hits = {arm: np.asarray([r["correct"] for r in final[arm]]) for arm in ARMS}
    paired = {}
    for a, b in COMPARISONS:
        differences = [x - y for x, y in zip(accuracy[a], accuracy[b])]
        interval = t_interval(differences)
        boot = cell_bootstrap(hits[a], hits[b], test["label"], test["cell"], cfg["bootstrap"])
        paired[f"{a}-{b}"] = {"per_seed": differences, "signs": signs(differences), "t_interval": interval,
                              "cell_bootstrap": boot, "verdict": judge(interval, boot, differences)}
    cells = {split: {record_name(p): int(len(np.unique(data["cell"][data["label"] == c])))
                     for c, p in enumerate(photos)} for split, data in (("val", val), ("test", test))}
    cost = {arm: {"runs": len(selection[arm]) + len(final[arm]),
                  "steps": sum(r["steps"] for r in selection[arm] + final[arm]),
                  "seconds": sum(r["seconds"] for r in selection[arm] + final[arm]),
                  "median_step_ms": float(np.median([r["step_ms"] for r in selection[arm] + final[arm]
                                                     if r["step_ms"] is not None] or [float("nan")])),
                  "trained_parameters": final[arm][0]["trained_parameters"]} for arm in ARMS}
    return {"classes": [record_name(p) for p in photos], "grayscale": gray, "colour_cue": COLOUR_CUE[task],
            "chance_accuracy": 1.0 / len(photos), "seeds": seeds, "selection_seed": selection_seed,
            "patches": {"labelled_per_class": PER_CLASS, "val": int(len(val["label"])),
                        "test": int(len(test["label"]))},
            "distinct_cells": cells, "chosen": chosen,
            "selection": {arm: [{k: r[k] for k in ("learning_rate", "weight_decay", "accuracy")}
                                for r in selection[arm]] for arm in ARMS},
            "accuracy": {arm: {"per_seed": accuracy[arm], **t_interval(accuracy[arm])} for arm in ARMS},
            "paired": paired, "cost": cost}


def plot(workdir: Path, results: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    colours = {"probe": "#1c7ed6", "lora": "#ae3ec9", "finetune": "#2b8a3e", "scratch": "#868e96"}
    for ax, (task, result) in zip(axes[0], results.items()):
        for i, arm in enumerate(ARMS):
            stats = result["accuracy"][arm]
            ax.bar(i, stats["mean"], color=colours[arm],
                   yerr=[[stats["mean"] - stats["low"]], [stats["high"] - stats["mean"]]], capsize=4)
            ax.plot([i] * len(stats["per_seed"]), stats["per_seed"], "k.", ms=4)
        ax.axhline(result["chance_accuracy"], color="k", ls=":", lw=1)
        ax.set(xticks=range(len(ARMS)), xticklabels=ARMS, ylim=(0, 1), ylabel="test accuracy",
               title=f"{task} (mean, 95% t-interval, seeds)")
    return common.save_figure(fig, workdir / "hf_finetune.png")


def signed(value: float) -> str:
    """`value` with four decimals and a sign, where a rounding residue such as -1e-17 shows as +0.0000."""
    text = f"{value:+.4f}"
    return "+0.0000" if text == "-0.0000" else text


def print_table(results: dict, pretraining: dict, cfg: dict) -> None:
    print(f"\npretraining ({len(PRETRAIN_PHOTOS)} photographs, {cfg['pretrain_steps']} steps): test accuracy "
          f"{pretraining['test_accuracy']:.4f} (chance {1 / len(PRETRAIN_PHOTOS):.2f}); safetensors re-load "
          f"reproduces the logits: {pretraining['export_check']['equal']}; {pretraining['seconds']:.1f} s, a cost the "
          "three pretrained arms share and scratch does not pay")
    grid = f"lr {list(cfg['lr_grid'])} x wd {list(cfg['wd_grid'])}"
    for task, result in results.items():
        seeds = result["seeds"]
        print(f"\n{task}: {len(result['classes'])} classes ({', '.join(result['classes'])}), "
              f"{'colour cue' if result['colour_cue'] else 'no colour cue'}; {PER_CLASS} labelled patches per class, "
              f"{cfg['finetune_steps']} steps; {result['patches']['val']} validation and {result['patches']['test']} "
              f"test patches (chance {result['chance_accuracy']:.2f})")
        print(f"    distinct test cells per class {result['distinct_cells']['test']}, validation "
              f"{result['distinct_cells']['val']}")
        print(f"    setting chosen on validation (seed {result['selection_seed']}, grid {grid}):")
        for arm in ARMS:
            c, cost = result["chosen"][arm], result["cost"][arm]
            print(f"      {arm:>9}: lr {c['learning_rate']:g}, wd {c['weight_decay']:g} (val {c['val_accuracy']:.4f}); "
                  f"{cost['trained_parameters']:,} trained parameters; cost {cost['runs']} runs, {cost['steps']} "
                  f"steps, {cost['seconds']:.1f} s")
        print(f"    test accuracy, seeds {seeds}: mean [95% t-interval]")
        for arm in ARMS:
            s = result["accuracy"][arm]
            print(f"      {arm:>9}: {s['mean']:.4f} [{s['low']:.4f}, {s['high']:.4f}]  per seed "
                  + " ".join(f"{v:.4f}" for v in s["per_seed"]))
        print("    paired differences: mean [95% t-interval over seeds] per-seed signs | cell bootstrap [95%; test "
              "cells resampled, trained models fixed] -> verdict")
        for name, p in result["paired"].items():
            t, b = p["t_interval"], p["cell_bootstrap"]
            print(f"      {name:>17}: {signed(t['mean'])} [{signed(t['low'])}, {signed(t['high'])}] {p['signs']} | "
                  f"[{signed(b['low'])}, {signed(b['high'])}] -> {p['verdict']}")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    began = time.perf_counter()
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    if args.steps:
        cfg["pretrain_steps"] = cfg["finetune_steps"] = args.steps
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    pretraining = pretrain(workdir, cfg, args.seed)
    tensors = Path(pretraining["safetensors_export"])
    results = {task: run_task(workdir, task, tensors, cfg, seeds, args.seed + SELECTION_SEED)
               for task in cfg["tasks"]}
    metrics = {"pretrain_test_accuracy": pretraining["test_accuracy"],
               "pretrain_chance_accuracy": 1.0 / len(PRETRAIN_PHOTOS),
               "export_max_abs_logit_difference": pretraining["export_check"]["max_abs_logit_difference"]}
    for task, result in results.items():
        metrics[f"{task}_chance_accuracy"] = result["chance_accuracy"]
        for arm in ARMS:
            metrics[f"{task}_{arm}_accuracy_mean"] = result["accuracy"][arm]["mean"]
        for name, p in result["paired"].items():
            metrics[f"{task}_{name}_mean"] = p["t_interval"]["mean"]
            metrics[f"{task}_{name}_t_low"] = p["t_interval"]["low"]
            metrics[f"{task}_{name}_t_high"] = p["t_interval"]["high"]
            metrics[f"{task}_{name}_bootstrap_low"] = p["cell_bootstrap"]["low"]
            metrics[f"{task}_{name}_bootstrap_high"] = p["cell_bootstrap"]["high"]
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "selection_seed": args.seed + SELECTION_SEED, "arms": ARMS,
                   "labels_per_class": PER_CLASS, "image_size": SIZE, "cell": CELL, "cell_split": CELL_SPLIT,
                   "patch_sizes": PATCH_SIZES, "backbone_lr_factor": BACKBONE_LR_FACTOR, "lora_rank": LORA_RANK,
                   "pretrain_photographs": [record_name(p) for p in PRETRAIN_PHOTOS]},
        "pretrain": pretraining, "tasks": results, "plot": plot(workdir, results),
        "wall_s": time.perf_counter() - began,
        "data_files": sorted(str(p) for p in (workdir / "data").glob("*.parquet"))}, args)
    print_table(results, pretraining, cfg)
    print(f"\nresult: {path} ({time.perf_counter() - began:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
