"""FileFolderSource: any file type by class folder (audio here), exact epochs and resume, and the
fingerprint ImageFolderSource kept."""

from __future__ import annotations

import io
import pathlib
import wave

import numpy as np
import pytest
import soundfile as sf
from source_checks import check_exact_resume, check_shuffled_coverage, epoch_values

from datarax import Pipeline
from datarax.host import DecodeAudio
from datarax.sources import FileFolderSource, FileFolderSourceConfig, ImageFolderSource

RATE = 8000
CLASSES = ("beep", "hum", "whistle")


def wav_bytes(freq: float, samples: int) -> bytes:
    """A 16-bit mono WAV of a sine tone, written with the standard library."""
    t = np.arange(samples) / RATE
    pcm = (0.5 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


@pytest.fixture
def clips(tmp_path) -> dict:
    """Tones in class folders (WAV and FLAC), a hidden file and a note that is not audio."""
    files = {}
    for c, name in enumerate(CLASSES):
        for i in range(4 + c):
            folder = tmp_path / name / ("nested" if i == 3 else "")
            folder.mkdir(parents=True, exist_ok=True)
            freq = 200 + 100 * c + 10 * i
            if i % 2:
                buf = io.BytesIO()
                sf.write(buf, 0.5 * np.sin(2 * np.pi * freq * np.arange(1000 + i) / RATE), RATE, format="FLAC")
                data, path = buf.getvalue(), folder / f"clip{i}.flac"
            else:
                data, path = wav_bytes(freq, 1000 + i), folder / f"clip{i}.WAV"
            path.write_bytes(data)
            files[str(path)] = (c, data)
    (tmp_path / "hum" / ".DS_Store").write_bytes(b"junk")  # left out with a SkippedFilesWarning
    (tmp_path / "beep" / "notes.txt").write_text("not audio")
    return {"root": tmp_path, "files": files}


def test_records_are_the_files_bytes_with_sorted_class_labels(clips):
    source = FileFolderSource(root=clips["root"], extensions=(".wav", ".flac"), field="audio")
    assert source.class_names == CLASSES
    wanted = sorted(clips["files"], key=lambda p: (clips["files"][p][0], p))
    assert list(source.paths) == wanted
    batch = source.get_batch(np.arange(len(source)))
    assert batch["audio"].dtype == object and set(batch) == {"audio", "label"}
    for row, path in enumerate(wanted):
        assert batch["audio"][row] == clips["files"][path][1]
        assert batch["label"][row] == clips["files"][path][0]


def test_without_extensions_every_visible_file_is_a_record(clips):
    source = FileFolderSource(root=clips["root"])
    names = {pathlib.Path(p).name for p in source.paths}
    assert "notes.txt" in names and ".DS_Store" not in names
    assert len(source) == len(clips["files"]) + 1 and source.element_spec().keys() == {"data", "label"}


def test_audio_folder_decodes_to_the_tones_through_a_pipeline(clips):
    source = FileFolderSource(root=clips["root"], extensions=(".wav", ".flac"), field="audio")
    pipeline = Pipeline(source, [DecodeAudio(field="audio", sample_rate=RATE, length=1000, crop="start")],
                        batch_size=5)
    audio = epoch_values(pipeline, "audio")
    labels = epoch_values(pipeline, "label")
    for row, path in enumerate(source.paths):
        reference, rate = sf.read(io.BytesIO(clips["files"][path][1]), dtype="float32")
        assert rate == RATE
        np.testing.assert_allclose(audio[row], reference[:1000], atol=1e-4)
    np.testing.assert_array_equal(labels, source.labels)


def test_shuffled_epochs_and_exact_resume(clips):
    def make():
        source = FileFolderSource(root=clips["root"], extensions=(".wav", ".flac"), field="audio", shuffle=True,
                                  seed=3)
        return Pipeline(source, [DecodeAudio(field="audio", sample_rate=RATE, length=800, crop="random", seed=1)],
                        batch_size=4)

    labels = FileFolderSource(root=clips["root"], extensions=(".wav", ".flac")).labels
    check_shuffled_coverage(make, "label", labels)
    check_exact_resume(make, None, seed=5)


def test_bad_settings_name_the_setting(clips, tmp_path):
    with pytest.raises(ValueError, match=r"extensions must be a tuple of endings"):
        FileFolderSource(root=clips["root"], extensions=("wav",))
    with pytest.raises(ValueError, match=r"field cannot be 'label'"):
        FileFolderSource(root=clips["root"], field="label")
    with pytest.raises(FileNotFoundError, match=r"FileFolderSource root .* is not a folder"):
        FileFolderSource(root=tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"\['beep', 'hum', 'whistle'\] .* hold no files ending in \('.ogg',\)"):
        FileFolderSource(root=clips["root"], extensions=".ogg")
    assert FileFolderSource(FileFolderSourceConfig(root=str(clips["root"]), extensions=".flac")).config.extensions == (
        ".flac",)


def test_fingerprint_names_the_files_and_field_and_image_folders_keep_theirs(clips):
    audio = FileFolderSource(root=clips["root"], field="audio").structure()
    assert audio.startswith("FileFolderSource(len=16, classes=['beep', 'hum', 'whistle'], files_crc32=")
    assert audio.endswith(", field='audio')")
    assert FileFolderSource(root=clips["root"], field="clip").structure() != audio
    image_root = clips["root"] / "images"
    (image_root / "cat").mkdir(parents=True)
    (image_root / "cat" / "a.png").write_bytes(b"x")
    # the string ImageFolderSource states were saved with before FileFolderSource existed (crc32 of 'cat/a.png')
    assert ImageFolderSource(root=image_root).structure() == (
        "ImageFolderSource(len=1, classes=['cat'], files_crc32=e99d1643)")


def two_classes(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.wav").write_bytes(wav_bytes(300, 100))
    return tmp_path


@pytest.mark.parametrize("link, target, reached", [
    ("b/again", ".", "b"),    # a folder linked into itself
    ("a/up", "..", ""),       # a class linked to the root, which holds every class
])
def test_a_symlink_loop_is_refused_naming_the_link(tmp_path, link, target, reached):
    from datarax.sources import FolderLoopError

    root = two_classes(tmp_path)
    (root / link).symlink_to(target)
    with pytest.raises(FolderLoopError, match=rf"folder '.*{link}' is a link to .*already reached as "
                                              rf"'{root / reached if reached else root}'"):
        FileFolderSource(root=str(root), extensions=".wav")


def test_a_link_to_a_folder_outside_the_root_is_followed_once(tmp_path):
    (tmp_path / "root").mkdir()
    root = two_classes(tmp_path / "root")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "s.wav").write_bytes(wav_bytes(500, 100))
    (root / "a" / "more").symlink_to(shared)
    source = FileFolderSource(root=str(root), extensions=".wav")
    listed = [pathlib.Path(p).relative_to(root).as_posix() for p in source.paths]
    assert listed == ["a/a.wav", "a/more/s.wav", "b/b.wav"]
    (root / "b" / "same").symlink_to(shared)
    with pytest.raises(ValueError, match=r"'.*b/same' is a link to .*already reached as '.*a/more'"):
        FileFolderSource(root=str(root), extensions=".wav")


def test_hidden_and_appledouble_files_are_left_out_with_one_warning(tmp_path):
    from datarax.sources import SkippedFilesWarning

    root = two_classes(tmp_path)
    (root / "a" / "._a.wav").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (root / "b" / ".cache").mkdir()
    (root / "b" / ".cache" / "x.wav").write_bytes(wav_bytes(300, 10))
    with pytest.warns(SkippedFilesWarning, match=r"left out 2 hidden file\(s\) or folder\(s\).*AppleDouble") as seen:
        source = ImageFolderSource(root=str(root), extensions=(".wav",))
    assert len(seen) == 1 and seen[0].filename == __file__
    assert [pathlib.Path(p).name for p in source.paths] == ["a.wav", "b.wav"]
    assert source.skipped_files == (str(root / "a" / "._a.wav"), str(root / "b" / ".cache") + "/")
