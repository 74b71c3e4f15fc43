"""DecodeAudio against soundfile and scipy; record-keyed crops across batch sizes, threads and resume."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy.signal import resample_poly

from datarax import Pipeline
from datarax.host import DecodeAudio, DecodeAudioConfig, HostContext
from datarax.host.stage import record_generator
from datarax.sources import RecordError
from datarax.sources.hf import HFSource, HFSourceConfig, load_files

sf = pytest.importorskip("soundfile")
datasets = pytest.importorskip("datasets")

N, RATE, LENGTH = 40, 8000, 3000
FORMATS = ("WAV", "FLAC", "OGG")


def tone(record: int, frames: int, rate: int = RATE, channels: int = 1) -> np.ndarray:
    t = np.arange(frames) / rate
    waves = [0.5 * np.sin(2 * np.pi * (220 + 20 * record + 110 * c) * t) for c in range(channels)]
    return np.stack(waves, axis=1).astype(np.float32)


def encode(samples: np.ndarray, rate: int = RATE, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt)
    return buf.getvalue()


def records() -> list[bytes]:
    """N files of different lengths (some shorter than LENGTH), formats and channel counts."""
    return [encode(tone(r, 2000 + 250 * r, channels=1 + r % 2), fmt=FORMATS[r % 3]) for r in range(N)]


def write_dataset(root: str) -> str:
    ds = datasets.Dataset.from_dict({"id": np.arange(N, dtype=np.int32),
                                     "audio": [{"bytes": b, "path": f"tone{r}.wav"} for r, b in enumerate(records())]})
    path = os.path.join(root, "audio.parquet")
    ds.cast_column("audio", datasets.Audio()).to_parquet(path)
    return path


def build(root: str, batch_size: int = 8, num_threads: int = 1, **settings) -> Pipeline:
    ds = load_files(os.path.join(root, "audio.parquet"), cache_dir=os.path.join(root, "cache"))
    source = HFSource(HFSourceConfig(encoded=("audio",), shuffle=True, seed=3), dataset=ds)
    stage = DecodeAudio(**{"sample_rate": RATE, "length": LENGTH, "crop": "random", "seed": 5,
                           "num_threads": num_threads, **settings})
    return Pipeline(source, [stage], batch_size=batch_size)


def per_record(batches) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batches = list(batches)
    ids = np.concatenate([np.asarray(b["id"]) for b in batches])
    order = np.argsort(ids)
    waves = np.concatenate([np.asarray(b["audio"]) for b in batches])[order]
    lengths = np.concatenate([np.asarray(b["audio_length"]) for b in batches])[order]
    return ids, waves, lengths


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("audio"))
    write_dataset(root)
    return root


def objects(values: list) -> np.ndarray:
    out = np.empty(len(values), object)  # np.array would make a fixed-width bytes array
    out[:] = values
    return out


def decode_one(data: bytes, **settings) -> tuple[np.ndarray, int]:
    stage = DecodeAudio(num_threads=1, **settings)
    out = stage({"audio": objects([data])}, HostContext(np.array([7]), epoch=0))
    return out["audio"][0], int(out["audio_length"][0])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels", ["mono", 2])
def test_decoded_samples_equal_soundfile(fmt, channels):
    data = encode(tone(3, 5000, channels=2), fmt=fmt)
    expected, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    expected = expected.mean(axis=1, dtype=np.float32) if channels == "mono" else expected.T
    wave, valid = decode_one(data, sample_rate=RATE, length=6000, crop="start", channels=channels)
    assert valid == 5000
    np.testing.assert_array_equal(wave[..., :5000], expected)
    np.testing.assert_array_equal(wave[..., 5000:], 0.0)  # zero padding


@pytest.mark.parametrize("crop", ["start", "center"])
def test_deterministic_crops_cut_the_expected_window(crop):
    data = encode(tone(1, 5000))
    full = sf.read(io.BytesIO(data), dtype="float32")[0]
    start = 0 if crop == "start" else (5000 - 1000) // 2
    wave, valid = decode_one(data, sample_rate=RATE, length=1000, crop=crop)
    assert valid == 1000
    np.testing.assert_array_equal(wave, full[start:start + 1000])


@pytest.mark.parametrize("rate,target", [(22050, 16000), (8000, 16000), (44100, 8000)])
def test_resampling_equals_scipy_resample_poly(rate, target):
    data = encode(tone(2, rate // 2, rate=rate, channels=2), rate=rate, fmt="FLAC")
    x, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    g = math.gcd(rate, target)
    expected = resample_poly(x.mean(axis=1, keepdims=True, dtype=np.float32), target // g, rate // g,
                             axis=0).astype(np.float32)[:, 0]
    wave, valid = decode_one(data, sample_rate=target, length=target, crop="start")
    assert valid == len(expected) == math.ceil(rate // 2 * target / rate)
    np.testing.assert_array_equal(wave[:valid], expected)


def test_mono_is_the_mean_of_the_channels():
    stereo = np.stack([np.full(100, 0.5), np.full(100, -0.25)], axis=1).astype(np.float32)
    wave, _ = decode_one(encode(stereo, fmt="FLAC"), sample_rate=RATE, length=100, crop="start")
    np.testing.assert_allclose(wave, 0.125, atol=1e-4)  # PCM16 quantisation


def test_random_crops_follow_the_record_generator(root):
    ids, waves, lengths = per_record(build(root))
    np.testing.assert_array_equal(ids[np.argsort(ids)], np.arange(N))
    for r, data in enumerate(records()):
        x = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)[0].mean(axis=1, dtype=np.float32)
        n = len(x)
        offset = int(record_generator(5, 0, 0, r).integers(0, n - LENGTH + 1)) if n > LENGTH else 0
        assert lengths[r] == min(n, LENGTH)
        np.testing.assert_array_equal(waves[r, :lengths[r]], x[offset:offset + LENGTH], err_msg=f"record {r}")


@pytest.mark.parametrize("executor", ["threads", "processes"])
@pytest.mark.parametrize("batch_size,num_threads", [(7, 1), (64, 1), (7, 4), (64, 4)])
def test_crops_do_not_depend_on_batch_size_threads_or_executor(root, batch_size, num_threads, executor):
    _, base, _ = per_record(build(root, batch_size=8, executor="threads"))
    _, waves, _ = per_record(build(root, batch_size=batch_size, num_threads=num_threads, executor=executor))
    np.testing.assert_array_equal(waves, base)


def test_every_shuffled_epoch_has_each_record_once_with_new_crops(root):
    it = build(root, batch_size=7).epochs(2)
    batches = list(it)
    ids = np.concatenate([np.asarray(b["id"]) for b in batches])
    assert len(ids) == 2 * N
    np.testing.assert_array_equal(np.sort(ids[:N]), np.arange(N))
    np.testing.assert_array_equal(np.sort(ids[N:]), np.arange(N))
    assert not np.array_equal(ids[:N], ids[N:])  # a new order
    first = np.concatenate([np.asarray(b["audio"]) for b in batches])
    assert not np.array_equal(first[:N][np.argsort(ids[:N])], first[N:][np.argsort(ids[N:])])  # new crops


RESUME = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_audio import build
it = build({root!r}, batch_size=7, num_threads=4).epochs(2)
it.set_state(json.loads({state!r}))
batches = list(it)
np.savez({out!r}, ids=np.concatenate([np.asarray(b["id"]) for b in batches]),
         audio=np.concatenate([np.asarray(b["audio"]) for b in batches]))
"""


def test_resume_mid_epoch_in_a_fresh_process(root, tmp_path):
    it = build(root, batch_size=7).epochs(2)
    for _ in range(4):
        next(it)
    state = json.dumps(it.get_state())
    rest = list(it)
    out = str(tmp_path / "rest.npz")
    script = RESUME.format(tests=os.path.dirname(__file__), root=root, state=state, out=out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=True, env=env, timeout=300)
    fresh = np.load(out)
    np.testing.assert_array_equal(fresh["ids"], np.concatenate([np.asarray(b["id"]) for b in rest]))
    np.testing.assert_array_equal(fresh["audio"], np.concatenate([np.asarray(b["audio"]) for b in rest]))


def corrupt_dataset(bad: dict[int, bytes]) -> HFSource:
    rows = [{"bytes": bad.get(r, b), "path": f"tone{r}.wav"} for r, b in enumerate(records())]
    ds = datasets.Dataset.from_dict({"id": np.arange(N, dtype=np.int32), "audio": rows})
    return HFSource(HFSourceConfig(encoded=("audio",)), dataset=ds.cast_column("audio", datasets.Audio()))


def good_bytes(r: int = 0, fmt: str = "FLAC") -> bytes:
    return encode(tone(r, 4000), fmt=fmt)


BAD = {
    "garbage": b"this is not audio at all",
    "truncated FLAC": good_bytes()[: len(good_bytes()) // 2],
    "truncated OGG": good_bytes(fmt="OGG")[: len(good_bytes(fmt="OGG")) // 2],
    "WAV cut in its header": good_bytes(fmt="WAV")[:40],
    "empty": b"",
}


@pytest.mark.parametrize("executor", ["threads", "processes"])
@pytest.mark.parametrize("kind", list(BAD))
def test_corrupt_bytes_raise_an_error_naming_the_record(kind, executor):
    source = corrupt_dataset({13: BAD[kind]})
    stage = DecodeAudio(sample_rate=RATE, length=LENGTH, num_threads=4, executor=executor)
    assert stage.executor.executor == executor
    pipeline = Pipeline(source, [stage], batch_size=8)
    what = r"is an empty file \(0 bytes\)" if kind == "empty" else r"is not a readable audio file \((?!.*BytesIO)"
    with pytest.raises(RecordError, match=rf"record 13 \(row 13 of .*, audio 'tone13.wav'\) {what}"):
        list(pipeline)


def test_skip_writes_zeros_flags_counts_and_warns():
    source = corrupt_dataset({2: BAD["garbage"], 5: BAD["truncated FLAC"]})
    stage = DecodeAudio(sample_rate=RATE, length=LENGTH, crop="start", on_error="skip")
    with pytest.warns(UserWarning, match=r"skipped \(zeros, 'audio_ok' False\)") as caught:
        batch = next(iter(Pipeline(source, [stage], batch_size=8)))
    assert [str(w.message).split(" (")[0] for w in caught] == ["DecodeAudio: record 2", "DecodeAudio: record 5"]
    assert stage.skipped == 2
    np.testing.assert_array_equal(np.asarray(batch["audio_ok"]), [i not in (2, 5) for i in range(8)])
    np.testing.assert_array_equal(np.asarray(batch["audio"])[[2, 5]], 0.0)
    np.testing.assert_array_equal(np.asarray(batch["audio_length"])[[2, 5]], 0)
    assert np.abs(np.asarray(batch["audio"])[0]).max() > 0.1


def test_a_channel_count_mismatch_names_the_record():
    stage = DecodeAudio(sample_rate=RATE, length=100, channels=1, num_threads=1)
    batch = {"audio": objects([encode(tone(0, 200, channels=2))])}
    with pytest.raises(RecordError, match=r"record 9 has 2 channels, but channels=1; pass channels='mono'"):
        stage(batch, HostContext(np.array([9]), epoch=0))


@pytest.mark.parametrize("settings,message", [
    ({"length": 0}, r"DecodeAudioConfig.length must be a positive int \(samples\), got 0"),
    ({"channels": "stereo"}, r"DecodeAudioConfig.channels must be 'mono' or a positive int .*'stereo'"),
    ({"crop": "middle"}, r"DecodeAudioConfig.crop must be one of \('random', 'center', 'start'\), got 'middle'"),
    ({"on_error": "ignore"}, r"DecodeAudioConfig.on_error must be one of \('raise', 'skip'\)"),
    ({"sample_rate": -1}, r"DecodeAudioConfig.sample_rate must be a positive int \(Hz\) or None, got -1"),
])
def test_config_errors_name_the_argument(settings, message):
    with pytest.raises(ValueError, match=message):
        DecodeAudioConfig(**settings)


def test_the_field_must_be_encoded_and_the_fingerprint_ignores_threads(root):
    import jax

    with pytest.raises(TypeError, match=r"DecodeAudio field 'audio' must hold encoded audio \(bytes\), one per "
                                        r"record, got float32"):
        DecodeAudio().output_spec({"audio": jax.ShapeDtypeStruct((10,), np.float32)})
    assert build(root, num_threads=1).fingerprint == build(root, num_threads=4).fingerprint
    assert build(root).fingerprint != build(root, seed=6).fingerprint


def reference_clip(data: bytes, target: int, length: int, crop: str, seed: int, record: int) -> np.ndarray:
    """The whole file decoded, mixed to mono, resampled with scipy, then cropped: what a clip must equal."""
    x, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    x = x.mean(axis=1, keepdims=True, dtype=np.float32)
    g = math.gcd(rate, target)
    full = resample_poly(x, target // g, rate // g, axis=0).astype(np.float32)[:, 0]
    spare = len(full) - length
    start = 0 if spare <= 0 or crop == "start" else spare // 2 if crop == "center" else \
        int(record_generator(seed, 0, 0, record).integers(0, spare + 1))
    return full[start:start + length]


@pytest.mark.parametrize("rate,target", [(22050, 16000), (44100, 8000), (8000, 16000), (44101, 16000), (7, 1000)])
@pytest.mark.parametrize("crop", ["random", "center", "start"])
def test_a_clip_of_a_resampled_file_equals_resampling_the_whole_file_then_cropping(rate, target, crop):
    fmt = "WAV" if rate < 1000 else "FLAC"  # FLAC takes rates from 1 Hz up, but not 7 Hz
    data = encode(tone(4, 3 * rate + 5, rate=rate, channels=2), rate=rate, fmt=fmt)
    length = target // 2
    stage = DecodeAudio(sample_rate=target, length=length, crop=crop, seed=11, num_threads=1)
    ids = np.arange(5)
    out = stage({"audio": objects([data] * 5)}, HostContext(ids, epoch=0))
    for r in ids:
        want = reference_clip(data, target, length, crop, 11, int(r))
        assert out["audio_length"][r] == len(want) == length
        np.testing.assert_array_equal(out["audio"][r], want, err_msg=f"record {r}")


def test_a_long_file_is_read_only_around_its_clip(monkeypatch):
    rate, target, length = 44100, 16000, 16000
    data = encode(tone(0, 60 * rate, rate=rate), rate=rate, fmt="FLAC")  # a minute, to keep one second
    reads = []
    original = sf.SoundFile.read

    def counted(self, frames=-1, *args, **kwargs):
        reads.append(frames)
        return original(self, frames, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "read", counted)
    wave, valid = decode_one(data, sample_rate=target, length=length, crop="center")
    monkeypatch.undo()
    assert valid == length
    # one second of source frames, the filter's reach on both sides and one filter phase (441 frames)
    assert len(reads) == 1 and 0 < reads[0] <= rate + 2 * (10 * 441 // 160 + 2) + 441
    np.testing.assert_array_equal(wave, reference_clip(data, target, length, "center", 0, 7))


ONE_HERTZ = """
import io, json, resource, sys, warnings
import numpy as np
import soundfile as sf
from datarax.host import DecodeAudio, HostContext

def wav(samples, rate):
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()

rng = np.random.default_rng(0)
one_hertz = wav(rng.uniform(-0.5, 0.5, 29_000).astype(np.float32), 1)  # 58 KB declaring 1 Hz: 8 hours of audio
good = wav(np.sin(np.arange(8000) / 5).astype(np.float32), 8000)
records = np.empty(3, object)
records[:] = [good, one_hertz, good]
names = ["good-0.wav", "one-hertz.wav", "good-2.wav"]
ctx = HostContext(np.arange(3), 0, 0, lambda r: names[r])

def run(**settings):
    stage = DecodeAudio(sample_rate=16000, length=16000, crop="center", on_error="skip", num_threads=1, **settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = stage({"audio": records}, ctx)
    return {"ok": out["audio_ok"].tolist(), "lengths": out["audio_length"].tolist(), "skipped": stage.skipped,
            "finite": bool(np.isfinite(out["audio"]).all()), "warnings": [str(w.message) for w in caught]}

run()  # scipy imported, the first buffers allocated: the limit below is for the decode itself
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 768 * 2**20, resource.RLIM_INFINITY))
print(json.dumps({"default": run(), "small budget": run(max_decode_bytes=4 * 2**20)}))
"""


def test_a_file_declaring_1_hz_decodes_within_a_memory_limit_or_is_skipped_by_name(tmp_path):
    """Resampling the whole 1 Hz file would ask for 29,000 x 16,000 float64 samples (3.5 GiB); the
    clip needs one second of it. Run under `RLIMIT_AS` (768 MiB above the process's size) in a
    child, so an unbounded decode fails the test with MemoryError instead of meeting the OOM killer."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
           "MALLOC_ARENA_MAX": "2"}
    proc = subprocess.run([sys.executable, "-c", ONE_HERTZ], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["default"] == {"ok": [True, True, True], "lengths": [16000] * 3, "skipped": 0, "finite": True,
                                 "warnings": []}
    small = result["small budget"]
    assert small["ok"] == [True, False, True] and small["lengths"] == [16000, 0, 16000] and small["skipped"] == 1
    assert len(small["warnings"]) == 1
    assert re.match(r"DecodeAudio: record 1 \(one-hertz\.wav\) needs about [\d.]+ MiB to decode \(1 channel\(s\) at "
                    r"1 Hz, \d+ frames read, resampled by 16000/1 with a 320,001-tap filter\), more than the stage's "
                    r"max_decode_bytes=4,194,304 \(4 MiB\).*skipped", small["warnings"][0]), small["warnings"][0]


def test_a_record_over_the_budget_raises_naming_the_record_and_the_setting():
    stage = DecodeAudio(sample_rate=16000, length=16000, max_decode_bytes=2**20, num_threads=1)
    assert stage.held_bytes() == 2**20
    data = encode(tone(0, 400, rate=7), rate=7, fmt="WAV")
    with pytest.raises(RecordError, match=r"DecodeAudio: record 7 needs about .* more than the stage's "
                                          r"max_decode_bytes=1,048,576 .*or pass on_error='skip'"):
        stage({"audio": objects([data])}, HostContext(np.array([7]), epoch=0))


def test_the_budget_is_checked_and_left_out_of_the_fingerprint(root):
    with pytest.raises(ValueError, match=r"DecodeAudioConfig.max_decode_bytes must be a positive int \(bytes\) or "
                                         r"None, got 0"):
        DecodeAudioConfig(max_decode_bytes=0)
    assert build(root).fingerprint == build(root, max_decode_bytes=2**26).fingerprint


def test_a_header_declaring_an_absurd_rate_is_refused_by_name_with_the_default_budget():
    """A WAV whose header says 2,147,483,647 Hz: resampling it to 16 kHz needs a 42.9-billion-tap
    filter (1.25 TiB), which used to be a MemoryError naming nothing, past `on_error="skip"`."""
    data = bytearray(encode(tone(0, 1000), fmt="WAV"))
    data[24:32] = (2**31 - 1).to_bytes(4, "little") + (2 * (2**31 - 1)).to_bytes(4, "little")  # rate, byte rate
    stage = DecodeAudio(sample_rate=16000, length=16000, num_threads=1, on_error="skip")
    with pytest.warns(UserWarning, match=r"DecodeAudio: record 3 needs about 1.25 TiB to decode \(1 channel\(s\) at "
                                         r"2,147,483,647 Hz, 1,000 frames read, resampled by 16000/2147483647 with a "
                                         r"42,949,672,941-tap filter\), more than the stage's max_decode_bytes="):
        out = stage({"audio": objects([bytes(data)])}, HostContext(np.array([3]), epoch=0))
    assert out["audio_ok"].tolist() == [False] and stage.skipped == 1
