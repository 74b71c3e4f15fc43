"""JAX's persistent compilation cache, on by default for the Trainer and `datarax train`.

Compiling the train step is the largest start-up cost of a small run, and a restarted run pays it
again. With the cache a compiled program is written to a directory and a later process with the
same program loads it. `use_compilation_cache` points JAX at a directory and lowers JAX's
thresholds (`jax_persistent_cache_min_compile_time_secs` and
`jax_persistent_cache_min_entry_size_bytes` to 0), so small programs are cached too.

Where the cache goes:

* `Trainer(compilation_cache=True)` (the default): `$DATARAX_COMPILATION_CACHE` if set, else
  `$XDG_CACHE_HOME/datarax/jax` (`~/.cache/datarax/jax`);
* `datarax train`: `$DATARAX_COMPILATION_CACHE` if set, else `<run_dir>/jax_cache`;
* `Trainer(compilation_cache="path")`: that directory; `False`: JAX's own setting is left alone;
* `DATARAX_COMPILATION_CACHE=off` (or `0`, `false`, `no`) turns both defaults off.

A cache directory the user already gave JAX (`jax_compilation_cache_dir` or
`JAX_COMPILATION_CACHE_DIR`) is kept. The cache is trusted code (JAX's own warning): keep it in a
directory only you can write.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

ENV = "DATARAX_COMPILATION_CACHE"
OFF = ("off", "0", "false", "no")
# The directory this module gave JAX (None: none yet), so a later Trainer may move it but never
# one the user set.
_ours: list[str] = []


def default_cache_dir(fallback: str | os.PathLike | None = None) -> Path | None:
    """The default cache directory: `$DATARAX_COMPILATION_CACHE`, else `fallback` (`datarax train`
    gives `<run_dir>/jax_cache`), else `$XDG_CACHE_HOME/datarax/jax`; None when the variable says off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in OFF:
        return None
    if value:
        return Path(value).expanduser()
    if fallback is not None:
        return Path(fallback).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "datarax" / "jax"


def use_compilation_cache(setting: Any) -> str | None:
    """Turns JAX's persistent compilation cache on for `setting` and returns the directory in use.

    Args:
        setting: True (the default directory, see the module docstring), a directory path, or False
            (leave JAX as it is).

    Returns:
        The cache directory JAX now uses (the user's own if they set one), or None when off.
    """
    if setting is False:
        return current_cache_dir()
    if setting is True:
        directory = default_cache_dir()
    elif isinstance(setting, (str, os.PathLike)) and str(setting):
        directory = Path(setting).expanduser()
    else:
        raise TypeError(f"compilation_cache must be True (the default directory), False (off) or a directory path, "
                        f"got {setting!r}")
    current = current_cache_dir()
    if directory is None or (current is not None and current not in _ours):
        return current  # off by the environment, or the user's own directory: keep it
    directory = directory.absolute()
    directory.mkdir(parents=True, exist_ok=True)
    if current != str(directory):
        if current is not None:
            # JAX opens its cache once per process; a new directory needs a fresh start.
            from jax.experimental.compilation_cache import compilation_cache

            compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", str(directory))
        _ours[:] = [str(directory)]
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(directory)


def current_cache_dir() -> str | None:
    """The directory JAX's persistent compilation cache uses now (None: off)."""
    value = jax.config.jax_compilation_cache_dir
    return str(value) if value else None
