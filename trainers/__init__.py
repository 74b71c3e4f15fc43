"""The training kit's folder in the repository layout; the kit itself is `datarax.train`.

Why a shim: a pip install must not put a generic top-level name such as `trainers` into a user's
site-packages, so the kit ships inside the library as `datarax.train` (the top floor: it depends
on the rest of datarax, and nothing else in datarax imports it). This folder is not installed; it
keeps `import trainers` working for scripts run from a checkout and points readers to the code.
Write `from datarax.train import Trainer` in new code.
"""

from datarax.train import *  # noqa: F403 - the shim re-exports the kit's public names
from datarax.train import __all__ as __all__
from datarax.train import callbacks as callbacks
