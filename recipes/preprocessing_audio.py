"""The audio half of the learned-preprocessing recipe: learnable PCEN vs fixed log-mel under a level shift.

Task: classify six kinds of procedurally generated sounds (steady sine, harmonic tone, rising and
falling chirps, tremolo, band-limited noise) of random pitch, timing and envelope, 0.25 s at
8 kHz. Training data is at one level (gain 0 +- 6 dB, white noise at 30 +- 5 dB SNR, both drawn
per record by the pipeline's `GainOperator` and `AddNoiseOperator`); the test sounds are
played back at other levels (-30 to +15 dB) and noisier (10 dB SNR), the shift a front end must
absorb.

Front ends, each followed by the same CNN (time-pooled):

* log-mel: a fixed log-mel spectrogram (dB, scaled by a constant);
* log-mel (normalised): the same with each example's mean (over bands and frames) subtracted,
  which removes any playback gain exactly (a gain is a constant dB offset) where no band hits
  the floor;
* log-mel (gain aug): log-mel trained with the gain drawn over the whole test range (-30 to +15
  dB) instead of 0 +- 6 dB: the level shift shown in training;
* pcen (fixed): per-channel energy normalisation with librosa's default parameters (default
  configuration only);
* pcen (learned): PCEN with per-channel learnable alpha, delta, r and smoothing, trained jointly.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.audio import (
    AddNoiseConfig,
    AddNoiseOperator,
    GainConfig,
    GainOperator,
    LogMelConfig,
    LogMelOperator,
    MelSpectrogramConfig,
    MelSpectrogramOperator,
    PCENConfig,
    PCENOperator,
)
from datarax.operators.audio.functional import waveform
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import joint_optimizer
from recipes import common
from recipes.models import ConvNet, classification_loss

SAMPLE_RATE = 8000
LENGTH = 2000
CLASSES = ("sine", "harmonic", "chirp_up", "chirp_down", "tremolo", "noise_band")
MEL = {"sample_rate": SAMPLE_RATE, "n_fft": 256, "hop_length": 64, "n_mels": 32}
FRAMES = LENGTH // MEL["hop_length"] + 1
CONDITIONS = tuple((gain, snr) for snr in (30.0, 10.0) for gain in (-30.0, -15.0, 0.0, 15.0))


def _envelope(rng: np.random.Generator) -> np.ndarray:
    """A random attack-sustain-release envelope placed at a random time within the record."""
    duration = int(rng.uniform(0.12, 0.22) * SAMPLE_RATE)
    start = rng.integers(0, LENGTH - duration)
    attack, release = int(rng.uniform(0.005, 0.03) * SAMPLE_RATE), int(rng.uniform(0.01, 0.05) * SAMPLE_RATE)
    shape = np.ones(duration)
    shape[:attack] = np.linspace(0, 1, attack)
    shape[duration - release:] = np.linspace(1, 0, release)
    out = np.zeros(LENGTH)
    out[start:start + duration] = shape
    return out


def synthesise(label: int, rng: np.random.Generator) -> np.ndarray:
    """One sound of class `label` (see `CLASSES`), RMS-normalised to 0.1."""
    t = np.arange(LENGTH) / SAMPLE_RATE
    f0 = np.exp(rng.uniform(np.log(250.0), np.log(1200.0)))
    kind = CLASSES[label]
    if kind == "sine":
        x = np.sin(2 * np.pi * f0 * t)
    elif kind == "harmonic":
        f0 = f0 / 2.5
        x = sum(np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 9)
                if k * f0 < SAMPLE_RATE / 2)
    elif kind in ("chirp_up", "chirp_down"):
        ratio = rng.uniform(2.0, 3.0) ** (1 if kind == "chirp_up" else -1)
        freq = f0 * ratio ** (t / t[-1])
        x = np.sin(2 * np.pi * np.cumsum(freq) / SAMPLE_RATE)
    elif kind == "tremolo":
        x = np.sin(2 * np.pi * f0 * t) * (1 - 0.9 * (0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(12, 20) * t)))
    else:
        spectrum = np.fft.rfft(rng.standard_normal(LENGTH))
        freqs = np.fft.rfftfreq(LENGTH, 1 / SAMPLE_RATE)
        spectrum[np.abs(freqs - f0) > rng.uniform(0.1, 0.3) * f0] = 0
        x = np.fft.irfft(spectrum, LENGTH)
    x = x * _envelope(rng)
    return (0.1 * x / np.sqrt(np.mean(x ** 2))).astype(np.float32)


def make_sounds(per_class: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(CLASSES), dtype=np.int32), per_class)
    return {"audio": np.stack([synthesise(int(label), rng) for label in labels]), "label": labels}


def to_input(field: str, offset: float = 0.0, scale: float = 1.0):
    """Copies a (mel, time) feature into the classifier's "image" field as (mel, time, 1)."""

    def fn(element):
        return element.update_data({"image": ((element.data[field] + offset) * scale)[..., None]})

    return fn


def mean_normalised(element):
    """The log-mel minus its own mean over bands and frames (a playback gain is a constant dB offset)."""
    log_mel = element.data["log_mel"]
    return element.update_data({"image": ((log_mel - log_mel.mean()) / 40.0)[..., None]})


FRONT_ENDS = ("log-mel", "log-mel (normalised)", "log-mel (gain aug)", "pcen (fixed)", "pcen (learned)")
TRAIN_GAIN = {"log-mel (gain aug)": (-7.5, 22.5)}  # (centre, half-range) dB; the rest train at 0 +- 6 dB


def front_end(kind: str) -> list:
    """The stages that turn the (augmented) waveform into the classifier's input."""
    if kind not in FRONT_ENDS:
        raise ValueError(f"front end {kind!r} is not one of {FRONT_ENDS}")
    if kind in ("log-mel", "log-mel (gain aug)"):
        return [LogMelOperator(LogMelConfig(**MEL)),
                ElementOperator(ElementOperatorConfig(), fn=to_input("log_mel", offset=40.0, scale=1 / 40))]
    if kind == "log-mel (normalised)":
        return [LogMelOperator(LogMelConfig(**MEL)), ElementOperator(ElementOperatorConfig(), fn=mean_normalised)]
    learned = kind == "pcen (learned)"
    return [MelSpectrogramOperator(MelSpectrogramConfig(power=1.0, **MEL)),
            PCENOperator(PCENConfig(n_channels=MEL["n_mels"], learnable=learned)),
            ElementOperator(ElementOperatorConfig(), fn=to_input("pcen"))]


def play_back(element, key):
    """Plays a test sound at its condition's gain and SNR (fields gain_db, snr_db)."""
    audio = waveform.apply_gain(element.data["audio"], element.data["gain_db"])
    noise = jax.random.normal(key, audio.shape, audio.dtype)
    return element.update_data({"audio": waveform.add_noise(audio, noise, element.data["snr_db"])})


@nnx.jit
def predict(model: nnx.Module, x: jax.Array) -> jax.Array:
    """The model's class for each input: traced once for every run's model of the same shapes."""
    return model(x).argmax(-1)


def condition_sweep(model: nnx.Module, stages: list, test: dict, seed: int) -> dict[str, float]:
    """Accuracy at every (gain, SNR) of `CONDITIONS`, through the trained front end `stages`."""
    n = len(test["label"])
    data = {"audio": np.tile(test["audio"], (len(CONDITIONS), 1)), "label": np.tile(test["label"], len(CONDITIONS)),
            "gain_db": np.repeat([c[0] for c in CONDITIONS], n).astype(np.float32),
            "snr_db": np.repeat([c[1] for c in CONDITIONS], n).astype(np.float32)}
    playback = ElementOperator(ElementOperatorConfig(stochastic=True), fn=play_back, rngs=nnx.Rngs(augment=seed + 7))
    pipeline = Pipeline(MemorySource(data=data), [playback, *stages], batch_size=n)
    model.eval()
    accuracy = {}
    for (gain, snr), batch in zip(CONDITIONS, pipeline):
        correct = np.asarray(predict(model, batch["image"])) == np.asarray(batch["label"])
        accuracy[f"gain {gain:+.0f} dB, snr {snr:.0f} dB"] = float(correct.mean())
    return accuracy


def learned_values(stages: list) -> dict:
    pcen = stages[-2]
    return {name: {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))}
            for name, v in pcen.current_parameters().items()}


def run(workdir: Path, data: dict, kind: str, cfg: dict, seed: int) -> dict:
    """Trains the classifier behind one front end; returns accuracy per playback condition."""
    rngs = nnx.Rngs(augment=seed)
    centre, spread = TRAIN_GAIN.get(kind, (0.0, 6.0))
    augment = [GainOperator(GainConfig(gain_db=centre, max_delta_db=spread), rngs=rngs),
               AddNoiseOperator(AddNoiseConfig(snr_db=30.0, max_delta_db=5.0), rngs=rngs)]
    stages = front_end(kind)
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data["train"])
    pipeline = Pipeline(source, [*augment, *stages], batch_size=cfg["batch_size"], drop_remainder=True)
    model = ConvNet(1, len(CLASSES), widths=(16, 32, 32), image_size=(MEL["n_mels"], FRAMES), hidden=64,
                    pool="width", seed=seed)
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])
    learned = kind == "pcen (learned)"
    tx = joint_optimizer(optax.adam(schedule), optax.adam(cfg["front_end_learning_rate"])) if learned \
        else optax.adam(schedule)
    slug = kind.replace(" ", "-").replace("(", "").replace(")", "")
    run_dir = workdir / "runs" / f"seed{seed}" / f"audio-{slug}"
    _, outcome = common.train_run(run_dir, model, tx, pipeline, classification_loss,
                                  steps=cfg["steps"], metrics={"accuracy": lambda b, logits: (
                                      logits.argmax(-1) == b["label"]).mean()},
                                  joint=learned, label=f"[seed {seed} audio {kind}] ",
                                  log_every=max(1, cfg["steps"] // 4))
    sweep = condition_sweep(model, stages, data["test"], seed)
    record = {"front_end": kind, "accuracy": sweep, "mean_accuracy": float(np.mean(list(sweep.values()))),
              "run": outcome.as_dict()}
    if learned:
        record["learned"] = learned_values(stages)
    print(f"[seed {seed} audio {kind}] accuracy over playback conditions: mean {record['mean_accuracy']:.4f}; "
          + ", ".join(f"{k}: {v:.3f}" for k, v in sweep.items()), flush=True)
    return record
