"""Objects a configuration names by where they are (datarax/config/files.py): the pipelines built
from `files`, `tokenizer` and folder keys are the ones the Python API builds from the same files."""

from __future__ import annotations

import io
import itertools
import textwrap

import numpy as np
import pytest

import datarax.train  # noqa: F401 - imported for its side effect (registers [trainer])
from datarax import Pipeline
from datarax.config import ConfigError, load_pipeline, load_spec
from datarax.config.files import probe_parquet
from datarax.host import DecodeImage, Tokenize
from datarax.operators import ToFloatOperator
from datarax.sources import ImageFolderSource, PackedTextSource, TextSource
from datarax.sources.hf import HFSource, HFSourceConfig, load_files

DOCUMENTS = [f"document {i} says " + " ".join(["alpha", "beta", "gamma", "delta"][: 1 + i % 4] * (1 + i % 3))
             for i in range(23)]


def write(folder, text, name="run.toml"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def png(seed: int, shape=(20, 16, 3)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_parquet(path, count: int, row_group_size: int | None = None, start: int = 0) -> None:
    """`count` PNGs in an HF `Image` column and an int64 `label` (start, start + 1, ...), in row
    groups of `row_group_size` (rewritten with pyarrow after `write_hf_parquet` when given)."""
    import pyarrow.parquet as pq

    from datarax.sources import write_hf_parquet

    write_hf_parquet(path, {"image": [png(start + i) for i in range(count)],
                            "label": np.arange(start, start + count, dtype=np.int64)}, images=["image"])
    if row_group_size is not None:
        pq.write_table(pq.read_table(path), path, row_group_size=row_group_size)


def same_batches(a: Pipeline, b: Pipeline, batches: int | None = None) -> int:
    assert a.fingerprint == b.fingerprint
    count = 0
    for x, y in itertools.islice(zip(a, b), batches):
        assert sorted(x) == sorted(y)
        for k in x:
            np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]))
        count += 1
    return count


@pytest.fixture
def tokenizer_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(DOCUMENTS, trainers.BpeTrainer(vocab_size=60, special_tokens=["<pad>", "<eos>",
                                                                                                 "<unk>"]))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_hf_files_with_a_host_stage_build_the_python_pipeline(tmp_path):
    for i, start in enumerate((0, 7)):
        write_parquet(tmp_path / f"part-{i}.parquet", 7, start=start)
    path = write(tmp_path, """
        batch_size = 4
        [source.hf]
        files = ["part-*.parquet"]       # a glob, expanded in sorted order
        encoded = ["image"]
        fields = ["label"]
        shuffle = true
        seed = 3
        cache_dir = "hf-cache"
        [[stages]]
        decode_image = { size = 8, crop = "random_resized", seed = 5, backend = "pillow" }
        [[stages]]
        to_float = {}
    """)
    built = load_pipeline(path)
    dataset = load_files([tmp_path / "part-0.parquet", tmp_path / "part-1.parquet"], cache_dir=str(tmp_path / "py"))
    source = HFSource(HFSourceConfig(fields=("label",), encoded=("image",), shuffle=True, seed=3), dataset=dataset)
    reference = Pipeline(source, [DecodeImage(size=8, crop="random_resized", seed=5, backend="pillow"),
                                  ToFloatOperator(field="image")], batch_size=4)
    assert same_batches(reference, built) == 4  # 14 records: 3 full batches and a padded one


def test_text_files_and_a_tokenizer_file_build_the_python_pipeline(tmp_path, tokenizer_file):
    (tmp_path / "a.txt").write_text("\n".join(DOCUMENTS[:10]) + "\n\n")
    (tmp_path / "b.txt").write_text("\n".join(DOCUMENTS[10:]))
    path = write(tmp_path, """
        batch_size = 5
        [source.text]
        files = ["a.txt", "b.txt"]
        shuffle = true
        seed = 1
        [[stages]]
        tokenize = { tokenizer = "tokenizer.json", length = 12 }
    """)
    built = load_pipeline(path)
    source = TextSource(shuffle=True, seed=1, documents=DOCUMENTS)  # one document per non-empty line
    reference = Pipeline(source, [Tokenize(tokenizer=str(tokenizer_file), length=12)], batch_size=5)
    assert len(built.source) == len(DOCUMENTS)
    assert same_batches(reference, built) == 5


def test_packed_text_with_a_nested_text_source(tmp_path, tokenizer_file):
    (tmp_path / "docs.txt").write_text("\n".join(DOCUMENTS))
    path = write(tmp_path, """
        batch_size = 3
        [source.packed_text]
        seq_len = 16
        eos_id = 1
        shuffle = true
        seed = 2
        tokenizer = "tokenizer.json"
        source = { text = { files = ["docs.txt"] } }
    """)
    built = load_pipeline(path)
    reference = Pipeline(PackedTextSource(source=TextSource(documents=DOCUMENTS), tokenizer=str(tokenizer_file),
                                          seq_len=16, eos_id=1, shuffle=True, seed=2), [], batch_size=3)
    assert same_batches(reference, built) > 3


def test_a_tokenizer_by_import_path(tmp_path, tokenizer_file):
    (tmp_path / "tok_helpers.py").write_text(f"from tokenizers import Tokenizer\n\n\ndef load():\n"
                                             f"    return Tokenizer.from_file({str(tokenizer_file)!r})\n")
    path = write(tmp_path, """
        allow = ["tok_helpers"]
        batch_size = 3
        [source.text]
        documents = ["one two", "three four five", "six"]
        [[stages]]
        tokenize = { tokenizer = "tok_helpers:load", length = 4 }
    """)
    built = load_pipeline(path)
    reference = Pipeline(TextSource(documents=["one two", "three four five", "six"]),
                         [Tokenize(tokenizer=str(tokenizer_file), length=4)], batch_size=3)
    assert same_batches(reference, built) == 1


def test_folders_are_relative_to_the_config_not_the_working_directory(tmp_path, monkeypatch):
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / "photos" / label).mkdir(parents=True)
        for i in range(3):
            Image.open(io.BytesIO(png(i))).save(tmp_path / "photos" / label / f"{i}.png")
    path = write(tmp_path, """
        batch_size = 2
        [source.image_folder]
        root = "photos"
        [[stages]]
        decode_image = { size = 4 }
    """)
    monkeypatch.chdir(tmp_path.parent)
    built = load_pipeline(path)
    reference = Pipeline(ImageFolderSource(root=str(tmp_path / "photos")), [DecodeImage(size=4)], batch_size=2)
    assert same_batches(reference, built) == 3


def test_decode_bounds_are_keys_and_the_memory_check_counts_the_decode_budget(tmp_path, monkeypatch):
    from PIL import Image

    from datarax.control.budget import host_memory_bytes

    for label in ("cat", "dog"):
        (tmp_path / "photos" / label).mkdir(parents=True)
        for i in range(2):
            Image.open(io.BytesIO(png(i))).save(tmp_path / "photos" / label / f"{i}.png")
    table = """
        batch_size = 2
        [source.image_folder]
        root = "photos"
        [[stages]]
        decode_image = {{ size = 4, value_range = [0, 4095], max_decode_bytes = {budget} }}
    """
    built = load_pipeline(write(tmp_path, table.format(budget=2**26)))
    assert built.source.stages[0].config.value_range == (0.0, 4095.0)
    assert built.source.stages[0].held_bytes() == 2**26
    reference = Pipeline(ImageFolderSource(root=str(tmp_path / "photos")),
                         [DecodeImage(size=4, value_range=(0, 4095), max_decode_bytes=2**26)], batch_size=2)
    assert same_batches(reference, built) == 2
    too_much = 2 * host_memory_bytes()
    with pytest.raises(ConfigError, match=r"batch_size 2 with prefetch \d+ needs about [\d.]+ [GT]iB \(.* plus "
                                          r"[\d.]+ [GT]iB the source and stages keep \(their caches and budgets\)\), "
                                          r"more than the .* of memory here; what the source and stages keep leaves "
                                          r"no room for a batch: lower a decoding stage's max_decode_bytes"):
        load_pipeline(write(tmp_path, table.format(budget=too_much)))
    # A decode budget is host memory: a device with less memory than the budget does not refuse it.
    from datarax.config import sizes

    monkeypatch.setattr(sizes, "memory_bytes", lambda: 2**30)
    load_pipeline(write(tmp_path, table.format(budget=4 * 2**30)))


PROBLEMS = [  # (source table, the words of the problem)
    ('[source.hf]\nfiles = ["nothing-*.parquet"]\n', r"source\.hf\.files\[0\] matches no file \(looked for "),
    ('[source.hf]\nfiles = []\n', r"source\.hf\.files must be a file path or a non-empty list of them"),
    ('[source.hf]\nfiles = ["a.parquet"]\ndataset = "x:y"\n',
     r"source\.hf\.dataset cannot be combined with files: 'hf' reads its dataset from the files"),
    ('[source.hf]\ncache_dir = "c"\ndataset = "x:y"\n',
     r"source\.hf\.cache_dir is an option of files = \[\.\.\.\], which is not given"),
    ('[source.hf]\nencoded = ["image"]\n',
     r"source\.hf\.dataset is required by 'hf' but missing \(or files = \[\.\.\.\], which 'hf' reads it from\)"),
    ('[source.text]\nfiles = ["a.parquet"]\norigins = ["x"]\n', r"source\.text\.origins cannot be combined with files"),
    ('[source.text]\ndocuments = ["a"]\n[[stages]]\ntokenize = { length = 4 }\n',
     r"stages\[0\]\.tokenize\.tokenizer is required by 'tokenize' but missing"),
    ('[source.text]\ndocuments = ["a"]\n[[stages]]\ntokenize = { tokenizer = "tok.json" }\n',
     r"stages\[0\]\.tokenize\.tokenizer names 'tok\.json', which does not exist"),
    ('[source.packed_text]\ntokenizer = "a.parquet"\nshuffle = false\n',
     r"source\.packed_text\.source is required by .packed_text. but missing"),
]


@pytest.mark.parametrize("table,words", PROBLEMS)
def test_problems_are_reported_at_their_key(tmp_path, table, words):
    (tmp_path / "a.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match=words):
        load_pipeline(write(tmp_path, table))


def test_a_probe_reads_whole_row_groups_up_to_the_rows_asked_and_keeps_the_features(tmp_path):
    import pyarrow.parquet as pq

    write_parquet(tmp_path / "a.parquet", 30, row_group_size=10)
    write_parquet(tmp_path / "b.parquet", 5, start=30)
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert [pq.ParquetFile(paths[0]).metadata.row_group(i).num_rows for i in range(3)] == [10, 10, 10]
    for rows, expected in ((1, 1), (10, 10), (12, 12), (31, 31), (100, 35)):
        probe = probe_parquet(paths, None, rows)
        assert len(probe) == expected
        assert probe.features == load_files(paths[:1], cache_dir=str(tmp_path / "cache")).features
        assert probe["label"] == list(range(expected))
    assert probe_parquet([str(tmp_path / "a.json")], None, 4) is None  # not parquet: opened in full by the caller


def test_validate_probes_instead_of_loading_the_whole_files(tmp_path):
    from datarax.config.build import check_pipeline

    write_parquet(tmp_path / "train.parquet", 40, row_group_size=8)
    path = write(tmp_path, """
        batch_size = 8
        [source.hf]
        files = ["train.parquet"]
        encoded = ["image"]
        cache_dir = "hf-cache"
        [[stages]]
        decode_image = { size = 8 }
    """)
    spec = load_spec(path)
    probed, = check_pipeline(spec)
    assert len(probed.source) == 8 and not (tmp_path / "hf-cache").exists()  # one row group, no Arrow cache
    full = load_pipeline(path)
    assert len(full.source) == 40 and (tmp_path / "hf-cache").exists()
    assert probed.output_spec() == full.output_spec()


def test_a_weighted_sampler_takes_its_groups_from_a_field_of_the_source(tmp_path):
    from datarax.samplers.weighted import WeightedSampler
    from datarax.sources import MemorySource

    labels = (np.arange(40) % 5 == 0).astype(np.int32)  # 8 of one class, 32 of the other
    np.savez(tmp_path / "d.npz", x=np.arange(40, dtype=np.float32), label=labels)
    path = write(tmp_path, """
        batch_size = 8
        [source.memory]
        data = "d.npz"
        [sampler.weighted]
        groups = "label"     # class-balanced over the source's labels
        seed = 1
    """)
    built = load_pipeline(path)
    reference = Pipeline(MemorySource(data={"x": np.arange(40, dtype=np.float32), "label": labels}), [],
                         sampler=WeightedSampler(groups=labels, seed=1), batch_size=8)
    assert same_batches(reference, built) == 5
    seen = np.concatenate([np.asarray(b["label"]) for b in built])
    assert np.bincount(seen).tolist() == [20, 20]  # each class an exact half of the epoch
    with pytest.raises(ConfigError, match=r"sampler\.weighted\.groups names the field 'labels', which the source's "
                                          r"records do not hold \(fields: label, x\)"):
        load_pipeline(path, overrides=['sampler.weighted.groups="labels"'])


def test_shard_urls_with_a_scheme_are_left_as_they_are(tmp_path):
    from datarax.config.components import Context
    from datarax.config.files import resolve_paths
    from datarax.config.schema import Problems

    ctx = Context(Problems(), str(tmp_path))
    out = resolve_paths({"urls": ["memory://bucket/a.parquet", "shards/b.parquet"], "root": "/abs/photos",
                         "seed": 3}, ctx)
    assert out == {"urls": ["memory://bucket/a.parquet", str(tmp_path / "shards" / "b.parquet")],
                   "root": "/abs/photos", "seed": 3}
