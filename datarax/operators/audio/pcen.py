"""PCEN operator with learnable per-channel parameters (Wang et al. 2017; LEAF, Zeghidour et al. 2021).

Each of alpha, delta, r and s is either one fixed number shared by every channel or, when
learnable, a vector of `n_channels` bounded `nnx.Param` logits read as
`low + (high - low) * sigmoid(raw)` (see `datarax.operators.learnable`), initialised to the
configured value in every channel. The bounds keep the normalisation well defined however the
training moves them: alpha, r and s stay in (0, 1) and delta in (0, 20).

Example:
    >>> pcen = PCENOperator(PCENConfig(n_channels=64, learnable=True))
    >>> batch = pcen(Element({"mel": mel_energies}), ctx)          # adds batch.data["pcen"]
"""

from __future__ import annotations

import dataclasses

import jax

from datarax.core.checks import check_int, check_number, field, require_deterministic
from datarax.operators.audio.base import AudioOperator, AudioOperatorConfig
from datarax.operators.audio.functional import pcen as pcen_lib
from datarax.operators.field import check_magnitudes


@dataclasses.dataclass(frozen=True, kw_only=True)
class PCENConfig(AudioOperatorConfig):
    """Configuration of `PCENOperator` (see `pcen.pcen` for the formula).

    Attributes:
        n_channels: number of channels (mel bands) of the input, the length of learnable vectors.
        alpha: gain-normalisation exponent, in [0, 1].
        delta: bias before compression, in (0, 20].
        r: compression exponent, in (0, 1].
        s: smoother coefficient, in (0, 1]; `pcen.smoothing_coefficient(time_constant,
            sample_rate, hop_length)` converts a time constant in seconds.
        eps: floor that keeps the gain finite on silence.
        initial: smoother state before the first frame; None starts from the first frame
            (librosa's `pcen` uses 1.0).
    """

    n_channels: int
    field: str = "mel"
    out_field: str | None = "pcen"
    alpha: float = 0.98
    delta: float = 2.0
    r: float = 0.5
    s: float = 0.025
    eps: float = 1e-6
    initial: float | None = None

    def __post_init__(self):
        super().__post_init__()
        require_deterministic(self, "PCEN draws nothing")
        check_int(*field(self, "n_channels"), 1)
        check_magnitudes(self, PCENOperator.channel_bounds, open_low=("delta", "r", "s"))
        check_number(*field(self, "eps"), 0.0, 1.0, open_low=True)
        check_number(*field(self, "initial"), 0.0, float("inf"), allow_none=True)


class PCENOperator(AudioOperator):
    """Per-channel energy normalisation of a `(..., channels, time)` energy spectrogram.

    The input should be non-negative energies (a mel spectrogram with power 1 or 2, not a log-mel).
    """

    config_class = PCENConfig
    min_ndim = 2

    channel_bounds = {"alpha": (0.0, 1.0), "delta": (0.0, 20.0), "r": (0.0, 1.0), "s": (0.0, 1.0)}

    def current_parameters(self) -> dict[str, jax.Array | float]:
        """The current alpha, delta, r and s (per-channel arrays where learnable)."""
        return {name: self.magnitude(name) for name in self.channel_bounds}

    def draw(self, key, shape):
        channels = shape[-2]
        if channels != self.config.n_channels:
            raise ValueError(f"PCENOperator was built for n_channels={self.config.n_channels}, but field "
                             f"{self.config.field!r} has {channels} channels (shape {shape}); set "
                             f"PCENConfig(n_channels={channels})")
        return self.current_parameters()

    def apply(self, x, params):
        return pcen_lib.pcen(x, params["alpha"], params["delta"], params["r"], params["s"], self.config.eps,
                             self.config.initial)
