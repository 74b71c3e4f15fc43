"""TOML configuration: a whole run (source, stages or DAG, sampler, sharding) in one file;
the `[trainer]` table is validated and built by the training kit (`datarax.train.config`).

See docs/config.md. `load_pipeline(path)` reads, validates and builds; `load_spec(path)` only
validates (raising `ConfigError` with every problem found).
"""

from datarax.config.build import build_pipeline as build_pipeline
from datarax.config.build import load_pipeline as load_pipeline
from datarax.config.build import load_spec as load_spec
from datarax.config.schema import ConfigError as ConfigError
from datarax.config.spec import RunSpec as RunSpec
