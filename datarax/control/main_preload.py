"""Preloaded by the worker processes' forkserver (`datarax.control.processes.context`): imports the
main module of a `python -m NAME` run, by the name in `$DATARAX_MAIN_MODULE` (which `context` sets).

The forkserver preloads `"__main__"` only for a main script given by its path. Under `-m`, each
worker would import the main module itself as it starts, and with it everything it imports (JAX,
a recipe's libraries): about a second per worker start on a small CPU, paid again by every pipeline
built after the last one's workers stopped. Imported here once, in the server, those modules are
already loaded in every worker forked from it, which then runs only the main module's own lines.
A main module that fails to import is left alone here: each worker imports it again, fails there,
and its pipeline reports the `WorkerCrashError`, as without the preload.
"""

from __future__ import annotations

import importlib
import os

from datarax.control.processes import MAIN_MODULE_ENV

if os.environ.get(MAIN_MODULE_ENV):
    try:
        importlib.import_module(os.environ[MAIN_MODULE_ENV])
    except BaseException:  # noqa: BLE001  (a SystemExit of the module's own lines included: see above)
        pass
