"""A configuration imports only registered names and the modules its user allowed (`datarax.config.allow`)."""

import sys
import textwrap
import uuid

import pytest

import datarax.train  # noqa: F401 - imported for its side effect (registers the [trainer] table)
from datarax.config import ConfigError, load_pipeline, load_spec
from datarax.config.allow import AllowList

HELPER = '''
import os
import pathlib
import numpy as np
pathlib.Path({marker!r}).touch()

def make_data():
    return {{"x": np.arange(12, dtype=np.float32).reshape(6, 2)}}

def stage(**kwargs):
    pathlib.Path({called!r}).touch()
'''


@pytest.fixture
def helper(tmp_path):
    """A module beside the config, under a fresh name, that leaves a marker file when imported."""
    name = f"user_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(HELPER.format(marker=str(tmp_path / "IMPORTED"),
                                                       called=str(tmp_path / "CALLED")))
    yield name
    sys.modules.pop(name, None)


def write(folder, text):
    path = folder / "run.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_module_that_is_not_allowed_is_never_imported(tmp_path, helper):
    path = write(tmp_path, f'[source.memory]\ndata = "{helper}:make_data"\n')
    with pytest.raises(ConfigError, match=rf"source\.memory\.data names '{helper}:make_data', whose module "
                                          rf"'{helper}' is not allowed.*allow = \['{helper}'\]"):
        load_spec(path)
    assert not (tmp_path / "IMPORTED").exists() and helper not in sys.modules


@pytest.mark.parametrize("how", ["toml", "python list", "python str"])
def test_allowing_the_module_in_the_file_or_from_python(tmp_path, helper, how):
    text = f'batch_size = 6\n[source.memory]\ndata = "{helper}:make_data"\n'
    if how == "toml":
        text = f'allow = ["{helper}"]\n' + text
    path_before = list(sys.path)
    pipeline = load_pipeline(write(tmp_path, text), allow={"toml": [], "python list": [helper],
                                                           "python str": helper}[how])
    assert len(pipeline.source) == 6 and (tmp_path / "IMPORTED").exists()
    assert sys.path == path_before  # the config's folder was on sys.path only while importing


def test_an_allowed_name_is_a_module_prefix_not_a_string_prefix():
    allow = AllowList(("mypkg", "exp.transforms"))
    assert [allow.permits(m) for m in ("mypkg", "mypkg.ops", "mypkgx", "exp", "exp.transforms.a")] == \
        [True, True, False, False, True]
    with pytest.raises(ValueError, match=r"allow entries must be module names .* got 'my pkg'"):
        AllowList(("my pkg",))


@pytest.mark.parametrize("text,pattern", [
    ('allow = "mypkg"\n', r"allow must be a list of strings, got 'mypkg'"),
    ('allow = ["os:system"]\n', r"allow\[0\] allow entries must be module names"),
    ('[source.memory]\nallow = ["mypkg"]\ndata = "x.npz"\n', r"source\.memory\.allow is a top-level key"),
])
def test_a_bad_allow_list_is_reported_at_its_path(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_spec(write(tmp_path, text + ('' if "source" in text else '[source.memory]\ndata = "x.npz"\n')))


def test_what_an_allowed_module_imports_is_not_allowed(tmp_path, helper):
    path = write(tmp_path, f'allow = ["{helper}"]\n[source.memory]\ndata = "{helper}:make_data"\n'
                           f'[[stages]]\n"{helper}:os.system" = {{ command = "touch {tmp_path}/SYSTEM" }}\n')
    with pytest.raises(ConfigError, match=rf"stages\[0\]\.\"{helper}:os.system\" names .*whose module 'os' is not "
                                          "allowed"):
        load_pipeline(path)
    assert not (tmp_path / "SYSTEM").exists()


def test_a_component_named_by_import_path_must_be_a_class_of_its_kind(tmp_path, helper):
    path = write(tmp_path, f'allow = ["{helper}"]\n[source.memory]\ndata = "{helper}:make_data"\n'
                           f'[[stages]]\n"{helper}:stage" = {{ anything = 1 }}\n')
    with pytest.raises(ConfigError, match=rf"stages\[0\]\.\"{helper}:stage\" names '{helper}:stage', which is a "
                                          r"function, not a stage class; it was not called"):
        load_pipeline(path)
    assert not (tmp_path / "CALLED").exists()


def test_optax_functions_by_name_need_no_allow(tmp_path):
    import numpy as np

    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2), np.float32))
    path = write(tmp_path, '[source.memory]\ndata = "d.npz"\n[trainer]\nmodel = "m:f"\nloss = "m:f"\n'
                           'optimizer = { adam = { learning_rate = 0.1 } }\nsteps = 1\n')
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert [p.split(" ")[0] for p in info.value.problems] == ["trainer.model", "trainer.loss"]


FILESYSTEM = '''
import io
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.memory import MemoryFileSystem


class SlowFileSystem(MemoryFileSystem):
    """A store whose fsspec package is not auto-registered: its protocol exists once this module is imported."""

    protocol = "{protocol}"

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol("memory://" + path.removeprefix("{protocol}://"))


fsspec.register_implementation("{protocol}", SlowFileSystem, clobber=True)
buf = io.BytesIO()
pq.write_table(pa.table({{"x": np.arange(6, dtype=np.int32)}}), buf)
SlowFileSystem().pipe("/{protocol}-data/shard.parquet", buf.getvalue())
'''


@pytest.mark.parametrize("allowed", [True, False])
def test_imports_run_an_allowed_module_before_the_source_is_built(tmp_path, allowed):
    """A custom fsspec protocol (filled with a shard at import) named from TOML: imported when allowed,
    refused at its key (and never imported) when not."""
    name = f"fs_{uuid.uuid4().hex[:10]}"
    protocol = name.replace("_", "")
    (tmp_path / f"{name}.py").write_text(FILESYSTEM.format(protocol=protocol))
    allow = f'allow = ["{name}"]\n' if allowed else ""
    path = write(tmp_path, f'{allow}imports = ["{name}"]\nbatch_size = 3\n[source.sharded]\n'
                           f'urls = ["{protocol}://{protocol}-data/shard.parquet"]\n'
                           f'manifest_dir = "{tmp_path / "m"}"\n')
    try:
        if not allowed:
            with pytest.raises(ConfigError, match=rf"^.*imports\[0\] names '{name}', whose module '{name}' is not "
                                                  rf"allowed.*allow = \['{name}'\]"):
                load_pipeline(path)
            assert name not in sys.modules
            return
        pipeline = load_pipeline(path)
        assert [int(v) for batch in pipeline for v in batch["x"]] == list(range(6))
    finally:
        sys.modules.pop(name, None)


def test_imports_must_name_modules():
    from datarax.config import registry

    with pytest.raises(ValueError, match=r"names 'pkg:attr', which is not a module name"):
        registry.import_module("pkg:attr")
