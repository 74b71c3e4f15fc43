"""The pieces of the DDSP recipe: procedural notes, the data pipeline, the decoder and the loss.

Notes come from a synthetic instrument whose timbre is a fixed function of pitch and loudness
(brighter when louder, darker when higher, odd harmonics stronger, breath noise that follows
the loudness), so a decoder that sees only (f0, loudness) can recover its controls. The data
pipeline renders each note with the same datarax synthesiser operators the decoder uses
(`datarax.operators.audio.synth`) and measures its A-weighted loudness per frame.

Every source of noise has its own stream (`stream_key`): the training notes' breath noise, the
held-out notes' breath noise, the decoder's own filtered noise and the two rooms' impulse
responses. The decoder's noise must never equal the noise in the audio it is scored against:
when it did (both streams came from one seed), a perfect decoder scored exactly 0 on a held-out
batch and the evaluation measured the leak rather than the decoder.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.audio import LoudnessConfig, LoudnessOperator
from datarax.operators.audio.functional import spectral
from datarax.operators.audio.synth import (FilteredNoiseConfig, FilteredNoiseOperator, HarmonicSynthConfig,
                                           HarmonicSynthOperator, ReverbConfig, ReverbOperator)
from datarax.sources import MemorySource, MemorySourceConfig
from recipes.models import host_init

SAMPLE_RATE = 8000
HOP = 32
FRAMES = 100
HARMONICS = 24
BANDS = 17
FFT_SIZES = (512, 256, 128, 64)
TRUE_REVERB = {"decay_s": 0.08, "wet": 0.25}
LOUDNESS_RANGE_DB = 80.0
DECODER_REVERB_START = {"decay_s": 0.03, "wet": 0.1}
CONTROLS = ("f0_hz", "amplitude", "harmonic_distribution", "noise_magnitudes")
# Who draws noise. The index folds into the recipe's seed, so the streams differ for every seed.
STREAMS = ("train", "eval", "decoder", "room", "decoder_room")


def stream_key(seed: int, stream: str) -> jax.Array:
    """The base key of one of the recipe's noise streams (`STREAMS`) for `seed`."""
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {STREAMS}, got {stream!r}")
    return jax.random.fold_in(jax.random.key(seed), STREAMS.index(stream))


def make_notes(num: int, seed: int) -> dict[str, np.ndarray]:
    """Ground-truth frame controls of `num` notes: f0 with vibrato, an ADSR loudness, the timbre rule."""
    rng = np.random.default_rng(seed)
    t = np.arange(FRAMES) * HOP / SAMPLE_RATE
    k = np.arange(1, HARMONICS + 1)
    notes = {"f0_hz": [], "amplitude": [], "harmonic_distribution": [], "noise_magnitudes": []}
    for _ in range(num):
        base = np.exp(rng.uniform(np.log(110.0), np.log(440.0)))
        f0 = base * (1 + 0.006 * np.sin(2 * np.pi * rng.uniform(4, 6) * t + rng.uniform(0, 2 * np.pi)))
        peak, attack, release = rng.uniform(0.3, 1.0), rng.uniform(0.02, 0.08), rng.uniform(0.25, 0.35)
        level = peak * np.minimum(t / attack, 1.0) * (1 - 0.3 * np.clip((t - attack) / 0.1, 0, 1))
        level = np.where(t > release, level * np.exp(-(t - release) / 0.03), level)
        slope = 1.0 + 1.8 * (1 - level[:, None]) + 0.5 * np.log2(f0[:, None] / 110.0)
        distribution = k ** -slope * (1 + 0.8 * (k % 2 == 1))
        bands = np.linspace(0, 1, BANDS)
        noise = 0.02 * level[:, None] * (0.2 + bands) * np.exp(-3 * (bands - 0.7) ** 2)
        for name, value in zip(notes, (f0, 0.5 * level ** 1.5, distribution / distribution.sum(-1, keepdims=True),
                                       noise)):
            notes[name].append(value.astype(np.float32))
    return {name: np.stack(values) for name, values in notes.items()}


def mix(element):
    return element.update_data({"audio": element.data["harmonic"] + element.data["noise"]})


def loudness_feature(element):
    """The loudness in [0, 1] per control frame (the operator gives one frame more, centred)."""
    loudness = element.data["loudness"][:FRAMES]
    return element.update_data({"loudness": (loudness + LOUDNESS_RANGE_DB) / LOUDNESS_RANGE_DB})


def render_stages(seed: int, split: str, with_reverb: bool) -> list:
    """Synthesiser operators that render ground-truth notes, then the loudness feature.

    The breath noise comes from the `split`'s stream ("train" or "eval"); the room is the same
    for both splits (the "room" stream).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    stages = [HarmonicSynthOperator(HarmonicSynthConfig(sample_rate=SAMPLE_RATE, hop_length=HOP)),
              FilteredNoiseOperator(FilteredNoiseConfig(hop_length=HOP),
                                    rngs=nnx.Rngs(augment=stream_key(seed, split))),
              ElementOperator(ElementOperatorConfig(), fn=mix)]
    if with_reverb:
        stages.append(ReverbOperator(ReverbConfig(sample_rate=SAMPLE_RATE, **TRUE_REVERB),
                                     rngs=nnx.Rngs(params=stream_key(seed, "room"))))
    stages += [LoudnessOperator(LoudnessConfig(sample_rate=SAMPLE_RATE, n_fft=256, hop_length=HOP, average="db",
                                               range_db=LOUDNESS_RANGE_DB)),
               ElementOperator(ElementOperatorConfig(), fn=loudness_feature)]
    return stages


def note_pipeline(notes: dict, seed: int, batch_size: int, *, split: str, with_reverb: bool) -> Pipeline:
    """Renders `notes`: shuffled, in full batches, for "train"; in order, every note, for "eval".

    Each pass over a pipeline is a new epoch with new noise, so an evaluation that must be
    reproducible takes the first pass of a freshly built "eval" pipeline.
    """
    train = split == "train"
    source = MemorySource(MemorySourceConfig(shuffle=train, seed=seed), data=notes)
    return Pipeline(source, render_stages(seed, split, with_reverb), batch_size=batch_size, drop_remainder=train)


def exp_sigmoid(x: jax.Array) -> jax.Array:
    """DDSP's output nonlinearity: positive, saturating at 2, with a useful slope for log-scale values."""
    return 2.0 * jax.nn.sigmoid(x) ** np.log(10.0) + 1e-7


class Decoder(nnx.Module):
    """An MLP per frame from (f0, loudness) to synthesiser controls, and the synthesiser itself.

    Args:
        hidden: width of the hidden layers.
        learn_reverb: end with a `ReverbOperator` whose decay and wet gain are learned.
        seed: initialisation (weights on the host) and the "decoder" and "decoder_room" noise
            streams (`stream_key`), which no pipeline of the same seed draws from.
        reverb_start: the reverb's starting decay and wet gain.
    """

    def __init__(self, hidden: int = 128, *, learn_reverb: bool = False, seed: int = 0,
                 reverb_start: dict[str, float] | None = None):
        rngs, init = nnx.Rngs(seed), host_init(seed)
        self.layers = nnx.List([nnx.Linear(2, hidden, rngs=rngs, **init), nnx.Linear(hidden, hidden, rngs=rngs, **init),
                                nnx.Linear(hidden, hidden, rngs=rngs, **init)])
        self.out = nnx.Linear(hidden, 1 + HARMONICS + BANDS, rngs=rngs, **init)
        self.harmonic = HarmonicSynthOperator(HarmonicSynthConfig(sample_rate=SAMPLE_RATE, hop_length=HOP))
        self.noise = FilteredNoiseOperator(FilteredNoiseConfig(hop_length=HOP),
                                           rngs=nnx.Rngs(augment=stream_key(seed, "decoder")))
        self.reverb = (ReverbOperator(ReverbConfig(sample_rate=SAMPLE_RATE, learnable=True,
                                                   **(reverb_start or DECODER_REVERB_START)),
                                      rngs=nnx.Rngs(params=stream_key(seed, "decoder_room")))
                       if learn_reverb else None)

    def controls(self, f0_hz: jax.Array, loudness: jax.Array) -> dict[str, jax.Array]:
        """Synthesiser controls `(batch, frames, ...)` for f0 in Hz and loudness in [0, 1]."""
        x = jnp.stack([jnp.log2(f0_hz / 110.0) / 2.0, loudness], axis=-1)
        for layer in self.layers:
            x = nnx.relu(layer(x))
        out = exp_sigmoid(self.out(x))
        return {"f0_hz": f0_hz, "amplitude": out[..., 0], "harmonic_distribution": out[..., 1:1 + HARMONICS],
                "noise_magnitudes": out[..., 1 + HARMONICS:]}

    def synthesise(self, controls: dict[str, jax.Array]) -> jax.Array:
        """Audio `(batch, samples)` of the controls (`CONTROLS`) through the decoder's synthesiser.

        The noise of a batch row depends only on the row's position (the same realisation at
        every call), so an evaluation of fixed controls is reproducible.
        """
        ctx = BatchContext.for_batch(controls["f0_hz"].shape[0])
        elements = self.noise(self.harmonic(Element(controls), ctx), ctx)
        audio = elements.data["harmonic"] + elements.data["noise"]
        if self.reverb is not None:
            audio = self.reverb(Element({"audio": audio}), ctx).data["audio"]
        return audio

    def __call__(self, f0_hz: jax.Array, loudness: jax.Array) -> tuple[jax.Array, dict]:
        controls = self.controls(f0_hz, loudness)
        return self.synthesise(controls), controls


def spectral_loss(target: jax.Array, audio: jax.Array) -> jax.Array:
    """Multi-scale spectral loss (DDSP): mean |S - S'| + mean |log S - log S'| summed over FFT sizes."""
    total = 0.0
    for s_true, s_pred in zip(spectral.multi_scale_stft_magnitude(target, FFT_SIZES),
                              spectral.multi_scale_stft_magnitude(audio, FFT_SIZES)):
        total += jnp.mean(jnp.abs(s_true - s_pred)) + jnp.mean(jnp.abs(jnp.log(s_true + 1e-5) - jnp.log(s_pred + 1e-5)))
    return total


def loss_fn(model: Decoder, batch: dict):
    audio, controls = model(batch["f0_hz"], batch["loudness"])
    return spectral_loss(batch["audio"], audio), controls


@nnx.jit
def _decoder_loss(model: Decoder, batch: dict) -> jax.Array:
    return loss_fn(model, batch)[0]


@nnx.jit
def _true_controls_loss(model: Decoder, batch: dict) -> jax.Array:
    return spectral_loss(batch["audio"], model.synthesise({name: batch[name] for name in CONTROLS}))


def held_out_loss(model: Decoder, batches: list[dict], *, true_controls: bool = False) -> float:
    """The batch-size weighted mean spectral loss over `batches` (rendered notes with their true controls).

    With `true_controls`, the decoder's synthesiser plays the ground-truth controls instead of
    the decoder's predictions: the loss a perfect decoder would get, given that its noise (and
    room) is a realisation independent of the target's.
    """
    losses = [float((_true_controls_loss if true_controls else _decoder_loss)(model, batch)) for batch in batches]
    sizes = [batch["audio"].shape[0] for batch in batches]
    return float(np.average(losses, weights=sizes))


def audible_distribution(distribution: np.ndarray, f0_hz: np.ndarray) -> np.ndarray:
    """Harmonic weights with those at or above Nyquist removed, renormalised (as the synthesiser plays them)."""
    audible = f0_hz[..., None] * np.arange(1, distribution.shape[-1] + 1) < SAMPLE_RATE / 2
    weights = np.where(audible, distribution, 0.0)
    return weights / np.maximum(weights.sum(-1, keepdims=True), 1e-7)


def harmonic_correlation(model: Decoder, batches: list[dict]) -> float:
    """Pearson correlation of recovered and true harmonic weights over the sounding frames of every note."""
    predict = nnx.jit(lambda m, f0, loud: m.controls(f0, loud)["harmonic_distribution"])
    true, pred = [], []
    for batch in batches:
        batch = jax.device_get(batch)
        sounding = batch["amplitude"] > 0.05 * batch["amplitude"].max(axis=1, keepdims=True)
        p = np.asarray(predict(model, batch["f0_hz"], batch["loudness"]))
        true.append(audible_distribution(batch["harmonic_distribution"], batch["f0_hz"])[sounding])
        pred.append(audible_distribution(p, batch["f0_hz"])[sounding])
    return float(np.corrcoef(np.concatenate(true).ravel(), np.concatenate(pred).ravel())[0, 1])
