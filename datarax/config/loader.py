"""Reading a configuration: TOML files, `include` of other files, and overrides.

Later wins: included files (recursively, in order), the file, `DATARAX_<KEY>` environment variables
(`__` separates keys), then `key.path=value` overrides. Tables merge key by key; other values
replace. docs/config.md ("Includes and overrides") has the details.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from datarax.config.schema import Path, Problems, closest, format_path

ENV_PREFIX = "DATARAX_"
_INDEX = re.compile(r"\[(\d+)\]")


@dataclasses.dataclass
class LoadedConfig:
    """A configuration as read: the merged dict, where it came from, and what was overridden."""

    raw: dict[str, Any]
    path: str
    files: list[str]
    overrides: list[str]

    @property
    def base_dir(self) -> str:
        """The directory of the main file: relative paths and user modules are looked up from here."""
        return os.path.dirname(os.path.abspath(self.path))


def merge_tables(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`: tables merge recursively, everything else is replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_tables(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_toml(path: str, problems: Problems, where: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        if where:
            problems.add(where, f"names {path!r}, which does not exist; check the path (relative paths are "
                                "relative to the file that names them)")
        else:
            problems.add_line(f"config file {path!r} does not exist; check the path")
    except IsADirectoryError:
        problems.add_line(f"config file {path!r} is a directory; name a .toml file")
    except tomllib.TOMLDecodeError as exc:
        problems.add_line(f"{path!r} is not valid TOML: {exc}")
    except UnicodeDecodeError as exc:
        problems.add_line(f"{path!r} is not a TOML text file: byte {exc.start} ({exc.object[exc.start]:#04x}) is not "
                          "UTF-8; name the .toml file (a binary file, or text saved in another encoding, cannot be "
                          "read)")
    except OSError as exc:
        problems.add_line(f"config file {path!r} cannot be read: {exc.strerror or exc}")
    return None


def _load_with_includes(path: str, problems: Problems, chain: tuple[str, ...], where: Path,
                        files: list[str]) -> dict[str, Any]:
    path = os.path.abspath(path)
    if path in chain:
        cycle = " -> ".join(os.path.basename(p) for p in (*chain, path))
        problems.add(where, f"forms an include cycle ({cycle}); remove one of these includes")
        return {}
    data = _read_toml(path, problems, where)
    if data is None:
        return {}
    files.append(path)
    includes = data.pop("include", [])
    single = isinstance(includes, str)
    if single:
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        problems.add(("include",), f"in {os.path.basename(path)} must be a path or a list of paths, got {includes!r}")
        includes = []
    merged: dict[str, Any] = {}
    for i, name in enumerate(includes):
        target = os.path.join(os.path.dirname(path), os.path.expanduser(name))
        label = ("include",) if single else ("include", i)
        merged = merge_tables(merged, _load_with_includes(target, problems, (*chain, path), label, files))
    return merge_tables(merged, data)


def parse_value(text: str) -> Any:
    """An override value as TOML (`64`, `true`, `[1, 2]`, `"x"`), or the text itself if it is not TOML."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def parse_key_path(text: str) -> list[str | int]:
    """`stages[1].brightness.max_delta` (or `stages.1.brightness.max_delta`) -> ['stages', 1, ...]."""
    parts: list[str | int] = []
    for piece in text.split("."):
        name, *rest = _INDEX.split(piece)
        if name:
            parts.append(int(name) if name.isdigit() else name)
        parts.extend(int(r) for r in rest if r)
    return parts


def set_path(data: dict[str, Any], path: Sequence[str | int], value: Any, problems: Problems, origin: str) -> None:
    """Sets `data[path] = value`, creating tables on the way; array items must already exist."""
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        nxt = path[depth + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or not 0 <= part < len(node):
                problems.add(tuple(path[:depth + 1]), f"(from {origin}) does not exist: "
                                                      f"{format_path(tuple(path[:depth]))} has "
                                                      f"{len(node) if isinstance(node, list) else 'no'} items")
                return
            node = node[part]
            continue
        if not isinstance(node, dict):
            problems.add(tuple(path[:depth + 1]), f"(from {origin}) cannot be set: {format_path(tuple(path[:depth]))} "
                                                  f"is not a table")
            return
        if part not in node:
            node[part] = [] if isinstance(nxt, int) else {}
        node = node[part]
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or not 0 <= last < len(node):
            problems.add(tuple(path), f"(from {origin}) does not exist; only existing array items can be overridden")
            return
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        problems.add(tuple(path), f"(from {origin}) cannot be set: its parent is not a table")


def env_overrides(environ: Mapping[str, str], top_level: Iterable[str],
                  problems: Problems) -> list[tuple[list[str | int], Any, str]]:
    """(path, value, variable name) for every `DATARAX_...` variable that targets the configuration."""
    known = list(top_level)
    found = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [int(p) if p.isdigit() else p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if not parts or not isinstance(parts[0], str):
            continue
        if parts[0] not in known:
            # Stricter than key suggestions: unrelated DATARAX_... variables must stay silent.
            close = closest(parts[0], known, cutoff=0.75)
            if close:
                problems.add((parts[0],), f"(from environment variable {name}) is not a known top-level key; did you "
                                          f"mean {close!r} (DATARAX_{close.upper()})?")
            continue
        found.append((parts, parse_value(environ[name]), f"environment variable {name}"))
    return found


def load(path: str | os.PathLike, *, top_level: Iterable[str], environ: Mapping[str, str] | None = None,
         overrides: Sequence[str] = (), problems: Problems | None = None) -> LoadedConfig:
    """Reads `path` with its includes, then applies environment and explicit overrides; problems go to
    `problems` (when not given, a fresh collection raises them at the end)."""
    own = problems is None
    problems = Problems(os.fspath(path)) if own else problems
    files: list[str] = []
    raw = _load_with_includes(os.fspath(path), problems, (), (), files)
    applied = []
    environ = os.environ if environ is None else environ
    for parts, value, origin in env_overrides(environ, top_level, problems):
        set_path(raw, parts, value, problems, origin)
        applied.append(f"{format_path(tuple(parts))} = {value!r} ({origin})")
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            problems.add(("--set",), f"override {text!r} must look like key.path=value, e.g. batch_size=64")
            continue
        parts = parse_key_path(key.strip())
        set_path(raw, parts, parse_value(value.strip()), problems, f"override {text!r}")
        applied.append(f"{format_path(tuple(parts))} = {parse_value(value.strip())!r} (--set)")
    if own:
        problems.raise_if_any()
    return LoadedConfig(raw=raw, path=os.fspath(path), files=files, overrides=applied)
