"""`datarax.cli.wording`: the fixes the library words for Python, as the command line prints them to a
configuration's author: the key that sets each."""

from __future__ import annotations

import pytest

from datarax.cli.wording import config_terms


@pytest.mark.parametrize("python, toml", [
    ("Fix: Pipeline(..., drop_remainder=True) (drops 24 records)",
     "Fix: drop_remainder = true at the top of the file (drops 24 records)"),
    ("or pass on_error='skip' to replace bad records", "or pass on_error = \"skip\" in the stage's table to replace "
                                                       "bad "
                                                       "records"),
    ("a deeper prefetch, `Pipeline(prefetch=...)`: it absorbs", "a deeper prefetch, `prefetch = N at the top of the "
                                                                "file`: it absorbs"),
    ("Fix: fit(num_steps=N), or give the source", "Fix: steps = N under [trainer], or give the source"),
    ("raise HFSourceConfig(max_file_bytes=...) if the file is genuine",
     "raise max_file_bytes = N in its table if the file is genuine"),
    ("pass HFSourceConfig(allow_outside_root=True) to read paths anywhere",
     "pass allow_outside_root = true in its table to read paths anywhere"),
    ("Fix: build the source with shuffle=True (e.g. MemorySource(shuffle=True, seed=0, ...), or `shuffle = true` in a "
     "config file's source table), or pass Pipeline(..., sampler=ShuffleSampler(len(source), seed=0))",
     "Fix: set shuffle = true (and seed = 0) in the [source.<name>] table, or add a [sampler.shuffle] table with "
     "seed = 0"),
    ("train_pipeline's epoch of 40 records", "the training pipeline's epoch of 40 records"),
    ("nothing to translate here (x=1)", "nothing to translate here (x=1)"),
])
def test_python_fixes_become_configuration_keys(python, toml):
    assert config_terms(python) == toml
