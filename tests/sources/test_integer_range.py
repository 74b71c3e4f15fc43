"""Integers are kept exactly by every source: 64-bit values that fit become int32 on the device,
values that do not are refused (at build, or at the first batch that holds one) naming the source,
the field, the value and the fix, and under `jax_enable_x64` they stay int64.

The reference is Python's own integers: the value written is the value read, or an error."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datarax import Pipeline
from datarax.core.checks import IntegerRangeError
from datarax.sources import ArrayRecordSource, MemorySource, ShardedSource, StreamingDiskSource
from datarax.sources.array_record import write_array_records
from datarax.sources.disk import save_npy_dataset
from datarax.sources.hf import HFSource, load_files

BIG = 2**40 + 5  # wraps to 5 in int32
N = 24


def ids(big_at: int | None) -> np.ndarray:
    values = np.arange(N, dtype=np.int64)
    if big_at is not None:
        values[big_at] = BIG
    return values


def parquet(path, values, *, statistics=True):
    pq.write_table(pa.table({"id": values}), path, row_group_size=8, write_statistics=statistics)


def memory(tmp_path, values):
    return MemorySource(data={"id": values})


def hf(mode):
    def make(tmp_path, values):
        parquet(tmp_path / "t.parquet", values)
        return HFSource(dataset=load_files([str(tmp_path / "t.parquet")], cache_dir=str(tmp_path / "c")), mode=mode)
    return make


def sharded(statistics):
    def make(tmp_path, values):
        parquet(tmp_path / "s.parquet", values, statistics=statistics)
        return ShardedSource(urls=[f"file://{tmp_path / 's.parquet'}"], manifest_dir=str(tmp_path / "m"))
    return make


def sharded_tar(tmp_path, values):
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        for i, v in enumerate(values.tolist()):
            info = tarfile.TarInfo(f"{i:04d}.cls")
            data = str(v).encode()
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    (tmp_path / "s.tar").write_bytes(buf.getvalue())
    return ShardedSource(urls=[f"file://{tmp_path / 's.tar'}"], manifest_dir=str(tmp_path / "m"), block_records=8)


def array_record(tmp_path, values):
    return ArrayRecordSource(paths=write_array_records(tmp_path / "a", {"id": values}))


def disk(tmp_path, values):
    return StreamingDiskSource(paths=save_npy_dataset(tmp_path / "d", {"id": values}))


# (source, field, when a big value is refused: "build" or "batch")
SOURCES = [
    (memory, "id", "build"), (hf("eager"), "id", "build"), (hf("lazy"), "id", "build"),
    (sharded(True), "id", "build"), (sharded(False), "id", "batch"), (sharded_tar, "cls", "batch"),
    (array_record, "id", "batch"), (disk, "id", "batch"),
]
NAMES = ["memory", "hf-eager", "hf-lazy", "sharded-stats", "sharded-no-stats", "sharded-tar", "array_record", "disk"]


def read_all(source, field):
    return np.concatenate([np.asarray(b[field]) for b in Pipeline(source, [], batch_size=8)])


@pytest.mark.parametrize("make, field, when", SOURCES, ids=NAMES)
def test_values_that_fit_int32_are_read_exactly(tmp_path, make, field, when):
    values = ids(None) + (2**31 - 1 - N)  # up to int32's largest value
    got = read_all(make(tmp_path, values), field)
    assert got.dtype == np.int32 and got.tolist() == values.tolist()


@pytest.mark.parametrize("make, field, when", SOURCES, ids=NAMES)
def test_a_value_beyond_int32_is_refused_naming_source_field_value_and_fix(tmp_path, make, field, when):
    values = ids(big_at=13)  # in the second batch and the second row group
    pattern = rf"field '{field}' holds {BIG} .*outside int32.*wrap it to 5.*jax_enable_x64"
    if when == "build":
        with pytest.raises(IntegerRangeError, match=rf"^(MemorySource|HFSource|ShardedSource) {pattern}"):
            make(tmp_path, values)
        return
    source = make(tmp_path, values)
    it = iter(Pipeline(source, [], batch_size=8))
    first = next(it)  # the first batch holds no big value and passes
    assert np.asarray(first[field]).tolist() == list(range(8))
    with pytest.raises(IntegerRangeError, match=rf"^{type(source).__name__} {pattern}"):
        next(it)


def test_the_message_names_the_record(tmp_path):
    with pytest.raises(IntegerRangeError, match=r"holds 1099511627781 \(record 13\)"):
        memory(tmp_path, ids(13))
    with pytest.raises(IntegerRangeError, match=r"\(row 5 of row group 1 of file://.*s\.parquet\)"):
        list(Pipeline(sharded(False)(tmp_path, ids(13)), [], batch_size=8))
    (tmp_path / "stats").mkdir()
    with pytest.raises(IntegerRangeError, match=r"\(row group 1 of file://.*s\.parquet\)"):
        sharded(True)(tmp_path / "stats", ids(13))


def test_a_toml_source_is_refused_at_its_key(tmp_path):
    from datarax.config import ConfigError, load_pipeline

    (tmp_path / "big_ids.py").write_text(f"import numpy as np\ndef data():\n"
                                         f"    return {{'id': np.arange(8) + {BIG}}}\n")
    (tmp_path / "run.toml").write_text('allow = ["big_ids"]\nbatch_size = 4\n[source.memory]\ndata = "big_ids:data"\n')
    with pytest.raises(ConfigError, match=rf"source.memory could not be built: MemorySource field 'id' holds {BIG}"):
        load_pipeline(tmp_path / "run.toml")


def test_under_x64_the_values_stay_int64(tmp_path):
    parquet(tmp_path / "s.parquet", ids(13))
    code = textwrap.dedent(f"""
        import json, jax, numpy as np
        jax.config.update("jax_enable_x64", True)
        from datarax import Pipeline
        from datarax.sources import MemorySource, ShardedSource
        values = np.arange({N}, dtype=np.int64); values[13] = {BIG}
        out = {{}}
        for name, source in (("memory", MemorySource(data={{"id": values}})),
                             ("sharded", ShardedSource(urls=["file://{tmp_path / 's.parquet'}"],
                                                       manifest_dir="{tmp_path / 'm'}"))):
            batches = [b["id"] for b in Pipeline(source, [], batch_size=8)]
            out[name] = [str(batches[0].dtype), [int(v) for b in batches for v in np.asarray(b)]]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("memory", "sharded"):
        assert out[name] == ["int64", ids(13).tolist()]
