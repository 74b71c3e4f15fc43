"""The XLA flags the suite runs under, set by conftest.py before JAX starts.

- `--xla_force_host_platform_device_count=8`: eight CPU devices for the sharding tests.
- `--xla_backend_optimization_level=0`: XLA:CPU compiles without LLVM's optimisation passes (its
  HLO passes, fusion included, still run), as the recipes' `--quick` runs do (`recipes.common.QUICK_XLA_FLAG`).
  Most of the suite's time on a small CPU is compiling programs that then run once or a few times:
  on 2 cores the whole suite takes about four fifths of its time at the default level (607 s
  against 736 s). Results may differ from the default level's in float rounding (a product
  accumulated or a coordinate fused differently), never in what is computed; tolerances are float32
  error bounds that hold at either level.

Only on a CPU-only run (`JAX_PLATFORMS=cpu`, conftest.py's default): the TPU test command
(docs/tpu.md) compiles at XLA's defaults. `DATARAX_TEST_XLA_OPT=default` keeps the default level on
a CPU too (the suite passes at both), and an `XLA_FLAGS` of the caller's own replaces both flags.
"""

from __future__ import annotations

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
OPT_LEVEL_FLAG = "--xla_backend_optimization_level=0"


def optimisation_flags() -> str:
    """The optimisation flag the suite compiles with ('' at XLA's default level)."""
    if os.environ.get("JAX_PLATFORMS", "cpu") != "cpu":
        return ""
    if os.environ.get("DATARAX_TEST_XLA_OPT", "").lower() == "default":
        return ""
    return OPT_LEVEL_FLAG


def suite_flags() -> str:
    """`XLA_FLAGS` for the test processes: eight CPU devices, and the optimisation flag."""
    return f"{DEVICE_COUNT_FLAG} {optimisation_flags()}".strip()


def one_device_env(env: dict) -> None:
    """Sets a child process's `env` for one CPU device, compiling as the suite does."""
    env.pop("XLA_FLAGS", None)
    if flags := optimisation_flags():
        env["XLA_FLAGS"] = flags
