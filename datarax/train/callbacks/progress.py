"""ProgressBar: a tqdm bar with steps, loss and throughput in elements per second."""

from __future__ import annotations

import collections
import sys
from typing import TYPE_CHECKING, Any

from datarax.train.callbacks.base import Callback, StepLogs

if TYPE_CHECKING:
    from datarax.train.trainer import Trainer


class ProgressBar(Callback):
    """Shows a tqdm progress bar from the resumed step to the target, with loss and el/s.

    Throughput is host-side: elements of the last `window` steps over the wall time they took.

    Args:
        window: steps averaged for the el/s figure.
        metric: the train metric shown beside it (one step late, like all metrics).
        **tqdm_kwargs: passed to `tqdm.tqdm` (e.g. `disable=True`, `file=...`).
    """

    order = 20

    def __init__(self, *, window: int = 50, metric: str = "loss", **tqdm_kwargs: Any):
        try:
            import tqdm
        except ImportError as exc:
            raise ImportError("ProgressBar needs tqdm: pip install tqdm") from exc
        self._tqdm = tqdm.tqdm
        self.window = window
        self.metric = metric
        self.tqdm_kwargs = {"file": sys.stderr, "dynamic_ncols": True, "mininterval": 0.5, **tqdm_kwargs}
        self.bar = None
        self._recent: collections.deque = collections.deque(maxlen=window + 1)

    def on_train_begin(self, trainer: Trainer) -> None:
        self.close()
        self.bar = self._tqdm(total=trainer.target_step, initial=trainer.step, unit="step", **self.tqdm_kwargs)
        resumed_from = getattr(trainer, "resumed_from", None)
        if resumed_from is not None:
            self.bar.write(f"resumed from the checkpoint at step {resumed_from}", file=self.tqdm_kwargs["file"])
        # The first step's dispatch builds and compiles it: say so instead of sitting still.
        self.bar.set_postfix_str("compiling the first step", refresh=True)
        self._recent.clear()

    def throughput(self) -> float:
        """Elements per second over the window: the batches after the first, over the time since it."""
        if len(self._recent) < 2:
            return 0.0
        elapsed = self._recent[-1][0] - self._recent[0][0]
        return sum(size for _, size in list(self._recent)[1:]) / max(elapsed, 1e-9)

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self._recent.append((logs.dispatched_at, logs.batch_size))
        if self.bar is None:
            return
        postfix = {"el/s": f"{self.throughput():,.0f}"}
        if self.metric in logs.metrics:
            postfix[self.metric] = f"{logs.metrics[self.metric]:.4g}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            bar, self.bar = self.bar, None
            bar.close()
