"""Audio augmentation depends only on (record id, epoch): not on batch size, order or residency.

A stochastic audio chain (random crop, learnable random gain, noise, log-mel, time masks) runs
through real pipelines that differ in batch size, shuffling and device residency; each record's
output, matched by its id, must be the same in the same epoch and different in the next one.
Tolerance: the same maths batched differently may round differently in the last bit, so
waveforms are compared to 1e-5 and log-mels in the power domain to 1e-5 of each record's peak (in
dB, a bin 60 dB below the peak would amplify float32 rounding a million-fold).
"""

import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.operators.audio import (
    AddNoiseConfig,
    AddNoiseOperator,
    CropPadConfig,
    CropPadOperator,
    GainConfig,
    GainOperator,
    LogMelConfig,
    LogMelOperator,
    TimeMaskConfig,
    TimeMaskOperator,
)
from datarax.sources import MemorySource, MemorySourceConfig

N, SAMPLES = 11, 1200


def stages():
    return [
        CropPadOperator(CropPadConfig(length=1000), rngs=nnx.Rngs(0)),
        GainOperator(GainConfig(max_delta_db=6.0, learnable=True), rngs=nnx.Rngs(1)),
        AddNoiseOperator(AddNoiseConfig(snr_db=15.0), rngs=nnx.Rngs(2)),
        LogMelOperator(LogMelConfig(sample_rate=8000, n_fft=256, hop_length=64, n_mels=20)),
        TimeMaskOperator(TimeMaskConfig(max_width=4.0), rngs=nnx.Rngs(4)),
    ]


def run(batch_size, shuffle, resident, epochs=2):
    rng = np.random.default_rng(0)
    data = {"id": np.arange(N, dtype=np.int32), "audio": rng.standard_normal((N, SAMPLES)).astype(np.float32)}
    source = MemorySource(MemorySourceConfig(shuffle=shuffle, seed=7, device_resident=resident), data=data)
    pipeline = Pipeline(source=source, stages=stages(), batch_size=batch_size)
    results = []
    for _ in range(epochs):
        batches = list(pipeline)
        ids = np.concatenate([np.asarray(b["id"]) for b in batches])
        order = np.argsort(ids)
        assert sorted(ids) == list(range(N))
        results.append({k: np.concatenate([np.asarray(b[k]) for b in batches])[order] for k in ("audio", "log_mel")})
    return results


@pytest.fixture(scope="module")
def baseline():
    return run(batch_size=4, shuffle=True, resident=True)


def test_same_record_and_epoch_give_the_same_audio(baseline):
    # Another batch size, sequential instead of shuffled order, host- instead of device-resident.
    other = run(batch_size=5, shuffle=False, resident=False)
    for epoch in range(2):
        np.testing.assert_allclose(other[epoch]["audio"], baseline[epoch]["audio"], atol=1e-5, rtol=0)
        power, expected = 10 ** (other[epoch]["log_mel"] / 10), 10 ** (baseline[epoch]["log_mel"] / 10)
        peak = expected.max(axis=(1, 2), keepdims=True)
        assert np.all(np.abs(power - expected) <= 1e-5 * peak)


def test_next_epoch_draws_fresh_augmentation(baseline):
    first, second = (epoch["log_mel"] for epoch in baseline)
    assert first.shape == (N, 20, 16) and baseline[0]["audio"].shape == (N, 1000)
    differs = np.abs(first - second).reshape(N, -1).max(axis=1) > 1e-2
    assert differs.all()
