"""Messages in a configuration file's terms: each fix the library words for Python is rewritten into
the TOML key that sets it, and warnings print as one line each (`datarax: warning: ...`).

    >>> config_terms("Fix: Pipeline(..., drop_remainder=True) (drops 24 records)")
    'Fix: drop_remainder = true at the top of the file (drops 24 records)'
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

# (the Python spelling, the configuration's); most specific first.
TERMS: tuple[tuple[str, str], ...] = (
    (r"pass Pipeline\(\.\.\., sampler=ShuffleSampler\(len\(source\), seed=0\)\)",
     "add a [sampler.shuffle] table with seed = 0"),
    (r"build the source with shuffle=True \(e\.g\. \w+\(shuffle=True, seed=0, \.\.\.\), or `shuffle = true` in a "
     r"config file's source table\)", "set shuffle = true (and seed = 0) in the [source.<name>] table"),
    (r"Pipeline\((?:\.\.\., )?drop_remainder=True\)", "drop_remainder = true at the top of the file"),
    (r"Pipeline\((?:\.\.\., )?prefetch=(?:\.\.\.|N)\)", "prefetch = N at the top of the file"),
    (r"on_error='skip'", "on_error = \"skip\" in the stage's table"),
    (r"fit\(num_steps=N\)", "steps = N under [trainer]"),
    (r"`num_threads=` of DecodeImage / DecodeAudio", "num_threads = N in the decode_image / decode_audio table"),
    (r", `ThreadedSource\(source, num_threads=\.\.\.\)` for reads", ""),
    (r"`num_workers=` of HostMap", "num_workers = N in the host_map table"),
    (r"MemorySource\(device_resident=True\)", "device_resident = true in [source.memory]"),
    (r"\btrain_pipeline's", "the training pipeline's"),
    (r"\btrain_pipeline\b", "the training pipeline"),
)
_COMPILED = tuple((re.compile(pattern), replacement) for pattern, replacement in TERMS)
# `HFSourceConfig(max_file_bytes=...)`: a config field, set as a key of the component's table.
_CONFIG_FIELD = re.compile(r"\b\w+Config\((\w+)=(True|False|'[^']*'|\.\.\.|[\w.]+)\)")


def _value(text: str) -> str:
    return {"True": "true", "False": "false", "...": "N"}.get(text, text.replace("'", '"'))


def config_terms(text: str) -> str:
    """`text` with each Python spelling of a fix rewritten as the configuration key that sets it."""
    for pattern, replacement in _COMPILED:
        text = pattern.sub(replacement, text)
    return _CONFIG_FIELD.sub(lambda m: f"{m.group(1)} = {_value(m.group(2))} in its table", text)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
    """`warnings.showwarning` for the command line: `datarax: warning: <message>` on one line, in
    the configuration's terms, without the source line the default format adds."""
    text = config_terms(" ".join(str(message).split()))
    print(f"datarax: warning: {category.__name__}: {text}", file=file if file is not None else sys.stderr)


def install() -> Any:
    """Makes `show_warning` the warnings display; returns the one it replaced (to restore it)."""
    import warnings

    previous = warnings.showwarning
    warnings.showwarning = show_warning
    return previous
