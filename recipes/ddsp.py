"""The pieces of the DDSP recipe: procedural notes, the data pipeline, the decoder and the loss.

Notes come from a synthetic instrument whose timbre is a fixed function of pitch and loudness
(brighter when louder, darker when higher, odd harmonics stronger, breath noise that follows
the loudness), so a decoder that sees only (f0, loudness) can recover its controls. The data
pipeline renders each note with the same datarax synthesiser operators the decoder uses
(`datarax.operators.audio.synth`) and measures its A-weighted loudness per frame.

Two more instruments lie outside the decoder's model class (`INSTRUMENTS`), rendered in numpy
at the same sample rate, note length and f0 range: a Karplus-Strong plucked string (`render_karplus`:
its partials decay at different rates from a random noise-burst spectrum, so no function of
(f0, loudness) gives its timbre exactly) and a two-operator FM tone with a modulator at sqrt(2)
times the carrier (`render_fm`: inharmonic partials at f0 * |1 + k sqrt(2)|, which a bank of
harmonics of f0 cannot play). Their pipeline only measures the loudness of the given audio.

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
from datarax.operators.audio.functional import loudness, spectral
from datarax.operators.audio.synth import (
    FilteredNoiseConfig,
    FilteredNoiseOperator,
    HarmonicSynthConfig,
    HarmonicSynthOperator,
    ReverbConfig,
    ReverbOperator,
)
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
INSTRUMENTS = ("ddsp", "karplus", "fm")
FM_RATIO = float(np.sqrt(2.0))


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


def _samples(frames: np.ndarray) -> np.ndarray:
    """Frame-rate curves `(num, FRAMES)` linearly interpolated to the audio rate `(num, FRAMES * HOP)`."""
    t = np.arange(FRAMES * HOP) / HOP
    return np.stack([np.interp(t, np.arange(FRAMES), row) for row in frames])


def render_fm(notes: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """Two-operator FM audio of `make_notes`' notes: their f0 (vibrato included) and amplitude envelope.

    `a(t) sin(phi(t) + I(t) sin(FM_RATIO * phi(t)))` with phi the integrated f0; the index
    `I(t) = I0 * (a(t) / max a)` (brighter when louder) with I0 uniform in [0.5, 2.5] per note
    (drawn from `seed`). The modulator ratio sqrt(2) makes the partials inharmonic.
    """
    rng = np.random.default_rng(seed)
    index0 = rng.uniform(0.5, 2.5, size=(len(notes["f0_hz"]), 1))
    phase = 2 * np.pi * np.cumsum(_samples(notes["f0_hz"]), axis=1) / SAMPLE_RATE
    amplitude = _samples(notes["amplitude"])
    index = index0 * amplitude / amplitude.max(axis=1, keepdims=True)
    return (amplitude * np.sin(phase + index * np.sin(FM_RATIO * phase))).astype(np.float32)


def render_karplus(notes: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """Karplus-Strong plucked strings at each note's mean f0, plucked at its peak amplitude.

    A noise burst one period long (white noise through a one-pole low-pass whose coefficient,
    uniform in [0, 0.7] per note, sets the pluck's brightness) excites a delay line of
    `SAMPLE_RATE / f0 - 0.5` samples (linear interpolation; the two-point average adds the half
    sample) with the averaging loop filter and a loop gain uniform in [0.990, 0.998]; the string is
    damped from the note's release on (time constant 30 ms), as `make_notes`' notes are. The
    result is scaled to the note's peak amplitude. Random draws come from `seed`.
    """
    rng = np.random.default_rng(seed)
    num, length = len(notes["f0_hz"]), FRAMES * HOP
    f0 = notes["f0_hz"].mean(axis=1)
    delay = SAMPLE_RATE / f0 - 0.5
    period = np.ceil(SAMPLE_RATE / f0).astype(int)
    brightness, gain = rng.uniform(0.0, 0.7, num), rng.uniform(0.990, 0.998, num)
    white = rng.standard_normal((num, int(period.max())))
    burst = np.zeros_like(white)
    for i in range(white.shape[1]):  # one-pole low-pass over the burst
        burst[:, i] = (1 - brightness) * white[:, i] + brightness * (burst[:, i - 1] if i else 0.0)
    burst = np.where(np.arange(white.shape[1]) < period[:, None], burst, 0.0)
    burst -= burst.sum(axis=1, keepdims=True) / period[:, None] * (np.arange(white.shape[1]) < period[:, None])
    pad = int(np.ceil(delay.max())) + 3
    y = np.zeros((num, pad + length))
    y[:, pad:pad + burst.shape[1]] = burst[:, :length]
    rows = np.arange(num)
    for n in range(pad, pad + length):
        back = n - delay
        k = np.floor(back).astype(int)
        frac = back - k
        now = (1 - frac) * y[rows, k] + frac * y[rows, k + 1]  # y at n - delay (k + 1 < n: delay > 1)
        before = (1 - frac) * y[rows, k - 1] + frac * y[rows, k]  # y at n - delay - 1
        y[:, n] += gain * 0.5 * (now + before)
    audio = y[:, pad:]
    t = np.arange(length) / SAMPLE_RATE
    release = _release_s(notes)[:, None]
    audio = audio * np.where(t > release, np.exp(-(t - release) / 0.03), 1.0)
    peak = notes["amplitude"].max(axis=1, keepdims=True)
    return (audio * peak / np.abs(audio).max(axis=1, keepdims=True)).astype(np.float32)


def _release_s(notes: dict[str, np.ndarray]) -> np.ndarray:
    """Each note's release time: the first frame from which its amplitude only falls fast (see `make_notes`)."""
    amplitude = notes["amplitude"]
    ratio = amplitude[:, 1:] / np.maximum(amplitude[:, :-1], 1e-12)
    fast = ratio < 0.5 * (1 + np.exp(-1.5 * HOP / SAMPLE_RATE / 0.03))  # falling faster than half the release rate
    first = np.where(fast.any(axis=1), np.argmax(fast, axis=1), FRAMES - 1)
    return first * HOP / SAMPLE_RATE


def instrument_notes(instrument: str, num: int, seed: int) -> dict[str, np.ndarray]:
    """`num` notes of `instrument` (`INSTRUMENTS`) from `seed`.

    "ddsp": the ground-truth controls of `make_notes` (rendered later by the pipeline). "karplus"
    and "fm": `{"audio", "f0_hz"}`, rendered here from `make_notes`' pitches and envelopes; the
    decoder's f0 is the pitch the note was rendered at (each string's constant f0 for "karplus").
    """
    if instrument not in INSTRUMENTS:
        raise ValueError(f"instrument must be one of {INSTRUMENTS}, got {instrument!r}")
    notes = make_notes(num, seed)
    if instrument == "ddsp":
        return notes
    if instrument == "fm":
        return {"audio": render_fm(notes, seed), "f0_hz": notes["f0_hz"]}
    f0 = np.repeat(notes["f0_hz"].mean(axis=1, keepdims=True), FRAMES, axis=1).astype(np.float32)
    return {"audio": render_karplus(notes, seed), "f0_hz": f0}


def mix(element):
    return element.update_data({"audio": element.data["harmonic"] + element.data["noise"]})


def loudness_feature(element):
    """The loudness in [0, 1] per control frame (the operator gives one frame more, centred)."""
    loudness = element.data["loudness"][:FRAMES]
    return element.update_data({"loudness": (loudness + LOUDNESS_RANGE_DB) / LOUDNESS_RANGE_DB})


def render_stages(seed: int, split: str, with_reverb: bool, render: bool = True) -> list:
    """Synthesiser operators that render ground-truth notes, then the loudness feature.

    The breath noise comes from the `split`'s stream ("train" or "eval"); the room is the same
    for both splits (the "room" stream). With `render=False` the notes already carry their
    audio and only the loudness feature is measured.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if not render:
        if with_reverb:
            raise ValueError("with_reverb=True needs notes rendered by the pipeline (the 'ddsp' instrument); "
                             "the 'karplus' and 'fm' notes arrive as audio: pass with_reverb=False")
        return [LoudnessOperator(LoudnessConfig(sample_rate=SAMPLE_RATE, n_fft=256, hop_length=HOP, average="db",
                                                range_db=LOUDNESS_RANGE_DB)),
                ElementOperator(ElementOperatorConfig(), fn=loudness_feature)]
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

    Notes that already carry `"audio"` (the out-of-class instruments, `instrument_notes`) are
    only measured (loudness), not rendered. Each pass over a pipeline is a new epoch with new
    noise, so an evaluation that must be reproducible takes the first pass of a freshly built
    "eval" pipeline.
    """
    train = split == "train"
    source = MemorySource(MemorySourceConfig(shuffle=train, seed=seed), data=notes)
    stages = render_stages(seed, split, with_reverb, render="audio" not in notes)
    return Pipeline(source, stages, batch_size=batch_size, drop_remainder=train)


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


class ConstantTimbreDecoder(Decoder):
    """The constant-timbre baseline: a `Decoder` whose spectral shapes cannot depend on the controls.

    Its MLP (the same layers) maps (f0, loudness) per frame to two levels only: the harmonic
    amplitude and a noise gain. The harmonic distribution is one learned vector (through
    `exp_sigmoid`, normalised by the synthesiser like the decoder's) and the noise filter is the
    noise gain times one learned band shape, both the same for every note and frame. Trained
    like the decoder (same loss, steps, batches, learning rate), it is the best constant timbre
    that training finds, with the levels following the note.
    """

    def __init__(self, hidden: int = 128, *, learn_reverb: bool = False, seed: int = 0,
                 reverb_start: dict[str, float] | None = None):
        super().__init__(hidden, learn_reverb=learn_reverb, seed=seed, reverb_start=reverb_start)
        self.out = nnx.Linear(hidden, 2, rngs=nnx.Rngs(seed), **host_init(seed))
        self.timbre = nnx.Param(jnp.zeros(HARMONICS, jnp.float32))
        self.band_shape = nnx.Param(jnp.zeros(BANDS, jnp.float32))

    def controls(self, f0_hz: jax.Array, loudness: jax.Array) -> dict[str, jax.Array]:
        x = jnp.stack([jnp.log2(f0_hz / 110.0) / 2.0, loudness], axis=-1)
        for layer in self.layers:
            x = nnx.relu(layer(x))
        out = exp_sigmoid(self.out(x))
        shape = out.shape[:-1]
        return {"f0_hz": f0_hz, "amplitude": out[..., 0],
                "harmonic_distribution": jnp.broadcast_to(exp_sigmoid(self.timbre.value), (*shape, HARMONICS)),
                "noise_magnitudes": out[..., 1:2] * exp_sigmoid(self.band_shape.value)}


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


# --- DDSP's evaluation metrics (Engel et al. 2020): f0 and loudness L1 between resynthesis and target ---

PYIN = {"fmin": 60.0, "fmax": 1000.0, "frame_length": 512, "hop_length": 128}


def pitch_track(audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`librosa.pyin` f0 (Hz, NaN where unvoiced) and voiced flags of audio `(..., samples)`.

    Frames of 64 ms every 16 ms (`PYIN`), f0 searched in 60-1000 Hz in pyin's default 10-cent
    steps. Needs librosa (the `audio` extra).
    """
    import librosa

    f0, voiced, _ = librosa.pyin(np.asarray(audio, np.float64), sr=SAMPLE_RATE, **PYIN)
    return f0, voiced


def f0_l1_from_tracks(target: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray]) -> dict:
    """Mean |1200 log2(f0_other / f0_target)| in cents over the frames voiced in both tracks.

    Returns `{"cents": ..., "voiced_both": fraction of all frames}`; cents is NaN when no frame
    is voiced in both.
    """
    both = target[1] & other[1] & np.isfinite(target[0]) & np.isfinite(other[0])
    cents = np.abs(1200 * np.log2(other[0][both] / target[0][both]))
    return {"cents": float(cents.mean()) if cents.size else float("nan"), "voiced_both": float(both.mean())}


def f0_l1_cents(target: np.ndarray, audio: np.ndarray) -> dict:
    """f0 L1 in cents of `audio` against `target` (pyin on both; see `f0_l1_from_tracks`)."""
    return f0_l1_from_tracks(pitch_track(target), pitch_track(audio))


@jax.jit
def frame_loudness(audio: jax.Array) -> jax.Array:
    """A-weighted loudness in dB per frame, exactly as the pipeline's `LoudnessOperator` measures it."""
    return loudness.a_weighted_loudness(audio, SAMPLE_RATE, n_fft=256, hop_length=HOP, average="db",
                                        range_db=LOUDNESS_RANGE_DB)


def loudness_l1_db(target: np.ndarray, audio: np.ndarray) -> float:
    """Mean |loudness(audio) - loudness(target)| in dB over every frame (`frame_loudness`)."""
    return float(np.mean(np.abs(np.asarray(frame_loudness(jnp.asarray(audio)))
                                - np.asarray(frame_loudness(jnp.asarray(target))))))


_spectral_loss = jax.jit(spectral_loss)


def spectral_loss_of(targets: list[np.ndarray], audio: np.ndarray) -> float:
    """The batch-size weighted mean spectral loss of `audio` (all notes) against the target batches."""
    losses, start = [], 0
    for target in targets:
        losses.append(float(_spectral_loss(jnp.asarray(target), jnp.asarray(audio[start:start + len(target)]))))
        start += len(target)
    return float(np.average(losses, weights=[len(t) for t in targets]))


@nnx.jit
def _play(model: Decoder, f0_hz: jax.Array, loudness_: jax.Array):
    return model(f0_hz, loudness_)


@nnx.jit
def _play_controls(model: Decoder, controls: dict) -> jax.Array:
    return model.synthesise(controls)


def resynthesise(model: Decoder, batches: list[dict], controls: list[dict] | None = None) -> tuple[np.ndarray, list]:
    """The audio of every held-out note `(notes, samples)` and the controls, batch by batch.

    Without `controls` the model's decoder predicts them from each batch's f0 and loudness;
    with `controls` (one dict of `CONTROLS` per batch) its synthesiser plays those.
    """
    audio, played = [], []
    for i, batch in enumerate(batches):
        if controls is None:
            out, c = _play(model, batch["f0_hz"], batch["loudness"])
        else:
            c = controls[i]
            out = _play_controls(model, c)
        audio.append(np.asarray(out))
        played.append(jax.device_get(c))
    return np.concatenate(audio), played


def correlation_with_truth(batches: list[dict], distributions: list[np.ndarray]) -> float:
    """Pearson correlation of played and true audible harmonic weights over the sounding frames."""
    true, pred = [], []
    for batch, distribution in zip(batches, distributions):
        sounding = batch["amplitude"] > 0.05 * batch["amplitude"].max(axis=1, keepdims=True)
        true.append(audible_distribution(np.asarray(batch["harmonic_distribution"]), batch["f0_hz"])[sounding])
        pred.append(audible_distribution(np.asarray(distribution), batch["f0_hz"])[sounding])
    return float(np.corrcoef(np.concatenate(true).ravel(), np.concatenate(pred).ravel())[0, 1])


def mean_timbre_controls(train_notes: dict, batches: list[dict]) -> list[dict]:
    """The reviewer's constant timbre, for the "ddsp" instrument: each held-out note's true
    amplitude and noise filter with one harmonic distribution, the mean of the training notes'
    true distributions over their sounding frames (renormalised; the synthesiser then drops the
    harmonics above Nyquist per note, as it does for every distribution)."""
    sounding = train_notes["amplitude"] > 0.05 * train_notes["amplitude"].max(axis=1, keepdims=True)
    mean = train_notes["harmonic_distribution"][sounding].mean(axis=0)
    mean = (mean / mean.sum()).astype(np.float32)
    return [{"f0_hz": b["f0_hz"], "amplitude": b["amplitude"], "noise_magnitudes": b["noise_magnitudes"],
             "harmonic_distribution": np.broadcast_to(mean, b["harmonic_distribution"].shape).copy()}
            for b in batches]
