"""The one base of per-record operators that transform a single data field (image and audio ops).

`draw(key, shape)` turns the record key (None when not stochastic) into the record's parameters;
`apply(x, params)` is the pure maths. The result is written in the input's dtype to
`config.out_field` (None: back to `field`). Magnitudes named in the class's `bounds` (scalars) and
`channel_bounds` (per channel) become `Magnitude` / `ChannelMagnitude` modules, learnable when
the config's `learnable` names them, read through the config's `parameterisation`; the class's
`spreads` name the magnitudes that are half-widths of symmetric draws, the only ones the `"tanh"`
parameterisation (which can start at 0) applies to.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import jax
from flax import nnx

from datarax.core.checks import check_field_name, check_number, field
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.fusion import separately
from datarax.core.operator import BatchContext, OperatorConfig, PerRecordOperator, record_keys
from datarax.operators.learnable import (
    SIGNED,
    ChannelMagnitude,
    check_learnable_field,
    check_parameterisation,
    learnable_names,
    magnitudes,
)
from datarax.operators.lowering import batched_here

Bounds = dict[str, tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class FieldOperatorConfig(OperatorConfig):
    """Configuration shared by field operators.

    Attributes:
        field: the data field the operator reads.
        out_field: the field it writes; None writes back to `field`.
        learnable: True to make every continuous magnitude of the operator a bounded
            `nnx.Param`, False for none, or a tuple naming some of them.
        parameterisation: how a learnable magnitude is read from its parameter: `"sigmoid"`
            (default), or `"tanh"` or `"triangle"` for spreads that may start at 0 (see
            `datarax.operators.learnable`).
    """

    field: str = "x"
    out_field: str | None = None
    # `datarax.operators.learnable.Learnable` spelled out: subclasses' generated __init__ resolve
    # this annotation in their own modules, which do not import the alias.
    learnable: bool | tuple[str, ...] = False
    # Out of the repr, so the stage structure (and the fingerprint of checkpoints written before it
    # existed) is unchanged at the default; `FieldOperator.structure` adds it otherwise.
    parameterisation: str = dataclasses.field(default="sigmoid", repr=False)

    def __post_init__(self):
        super().__post_init__()
        check_field_name(*field(self, "field"))
        check_field_name(*field(self, "out_field"), allow_none=True)
        object.__setattr__(self, "learnable", check_learnable_field(self.learnable, type(self).__name__))
        check_parameterisation(self.parameterisation, type(self).__name__)


def check_magnitudes(config: FieldOperatorConfig, bounds: Bounds, *, open_low: tuple[str, ...] = ()) -> None:
    """Checks each config field named in `bounds` lies in its `(low, high)` (`(low, high]` for `open_low`)."""
    for name, (low, high) in bounds.items():
        check_number(*field(config, name), low, high, open_low=name in open_low)


def check_signed(op: FieldOperator, config: FieldOperatorConfig, chosen: frozenset[str], owner: str) -> None:
    """The signed parameterisations ("tanh", "triangle") hold a signed value: only for learnable spreads of a
    stochastic operator (a deterministic one applies the magnitude itself, where the sign would matter)."""
    kind = config.parameterisation
    if not chosen:
        raise ValueError(f"{owner}(parameterisation={kind!r}) has no learnable magnitude; set learnable=... or "
                         "leave parameterisation at 'sigmoid'")
    if not config.stochastic:
        raise ValueError(f"{owner}(parameterisation={kind!r}) needs stochastic=True: the {kind} value is signed, "
                         "and a deterministic operator applies it as it is; use 'sigmoid'")
    others = sorted(chosen - set(op.spreads))
    if others:
        spreads = list(op.spreads)
        fix = f"learnable={tuple(spreads)!r}" if spreads else "parameterisation='sigmoid'"
        raise ValueError(f"{owner}(parameterisation={kind!r}) holds signed spreads only (the half-width of a "
                         f"symmetric draw), but {others} are learnable too and are not spreads of "
                         f"{type(op).__name__} (its spreads: {spreads}); use {fix}")


class FieldOperator(PerRecordOperator):
    """Abstract base of the image and audio operators (see the module docstring).

    Subclasses set `config_class`, `positional` (the settings taken by position, see
    `datarax.core.construct`) and, when they have continuous magnitudes, `bounds` or
    `channel_bounds`, and implement `draw` and `apply`; `ImageOperator` and `AudioOperator`
    implement `read`.
    """

    config_class: ClassVar[type[FieldOperatorConfig]]
    bounds: ClassVar[Bounds] = {}
    channel_bounds: ClassVar[Bounds] = {}
    # Magnitudes that are the half-width of a draw symmetric about its centre (`U(-m, m)`, `m * N(0, 1)`):
    # the same draw for m and -m, so the signed parameterisations ("tanh", "triangle") may hold them.
    spreads: ClassVar[tuple[str, ...]] = ()
    # Bilinear warps: computed as their own XLA computation on CPU (see `datarax.core.fusion`).
    separate_on_cpu: ClassVar[bool] = False

    def __init__(self, config: FieldOperatorConfig | None = None, *args: Any, rngs: nnx.Rngs | None = None,
                 **settings: Any):
        config = resolve_config(self.config_class, config, settings, type(self).__name__, args=args,
                                positional=self.positional, exact=True)
        owner = self.config_class.__name__
        bounds = self.active_bounds(config)
        available = [*bounds, *self.channel_bounds]
        if not available and config.learnable is True:
            raise ValueError(f"{owner}(learnable=True): {type(self).__name__} has no continuous magnitude to learn "
                             "here (it draws nothing, or its randomness is discrete); leave learnable=False")
        chosen = learnable_names(config.learnable, available, owner=owner)
        if config.parameterisation in SIGNED:
            check_signed(self, config, chosen, owner)
        self._init_rng(config, rngs)
        self.magnitudes = magnitudes(config, bounds, owner=owner, chosen=chosen)
        self.channel_magnitudes = nnx.Dict({
            name: ChannelMagnitude(getattr(config, name), config.n_channels, low=low, high=high,
                                   learnable=name in chosen, name=f"{owner}.{name}")
            for name, (low, high) in self.channel_bounds.items()
        })

    def structure(self) -> str:
        base = super().structure()
        return base if self.config.parameterisation == "sigmoid" else f"{base}[{self.config.parameterisation}]"

    def active_bounds(self, config: FieldOperatorConfig) -> Bounds:
        """The scalar magnitudes this configuration uses (a spread is unused when not stochastic)."""
        return dict(self.bounds)

    def magnitude(self, name: str) -> jax.Array | float:
        """The current value of magnitude `name`: a traced scalar (or `(n_channels,)`) when learnable."""
        if name in self.channel_magnitudes:
            return self.channel_magnitudes[name]()
        return self.magnitudes[name]()

    @abc.abstractmethod
    def read(self, element: Element) -> jax.Array:
        """The element's input field, checked to be what the operator takes."""

    def draw(self, key: jax.Array | None, shape: tuple[int, ...]) -> dict[str, Any]:
        """The parameters for one record whose input has `shape`; `key` is None when not stochastic.

        Empty by default, for operators whose maths takes no drawn parameters.
        """
        return {}

    @abc.abstractmethod
    def apply(self, x: jax.Array, params: dict[str, Any]) -> jax.Array:
        """The operator's maths on one record's input with drawn `params`."""

    def draw_batch(self, ctx: BatchContext, shape: tuple[int, ...]) -> dict[str, Any]:
        """The parameters a stochastic operator draws for every record of a batch (leading axis B).

        For inspecting what an operator does; `apply_batch` draws exactly these.
        """
        if self.key is None:
            raise ValueError(f"{type(self).__name__} is not stochastic: call draw(None, shape) for its fixed "
                             "parameters")
        return jax.vmap(lambda key: self.draw(key, tuple(shape)))(record_keys(self.key, ctx))

    def draws(self, elements: Element, ctx: BatchContext) -> dict[str, Any]:
        """`draw_batch` for the records of `elements` (empty when the operator is not stochastic)."""
        if self.key is None:
            return {}
        return self.draw_batch(ctx, tuple(jax.vmap(self.read)(elements).shape[1:]))

    def apply_many(self, x: jax.Array, params: dict[str, Any]) -> jax.Array:
        """The maths on a whole batch (`x` and every param with a leading batch axis): `apply` vmapped,
        or a batch formulation where a subclass has one. Backends in
        `datarax.operators.lowering.BATCHED_BACKENDS` run it; the others vmap `apply_element`."""
        return jax.vmap(self.apply)(x, params)

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        if batched_here():
            return self._apply_many(elements, ctx)
        if not self.separate_on_cpu:
            return super().apply_batch(elements, ctx)
        return separately(super().apply_batch, ctx.epoch >= 0, elements, ctx)

    def _apply_many(self, elements: Element, ctx: BatchContext) -> Element:
        """`apply_element` for every record, with the batch's draws handed to `apply_many` at once."""
        x = jax.vmap(self.read)(elements)
        shape = tuple(x.shape[1:])
        if self.key is None:
            params = jax.vmap(lambda _: self.draw(None, shape))(ctx.record_ids)
        else:
            params = self.draw_batch(ctx, shape)
        out = self.apply_many(x, params)
        return elements.update_data({self.config.out_field or self.config.field: out.astype(x.dtype)})

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        x = self.read(element)
        out = self.apply(x, self.draw(key, x.shape))
        return element.update_data({self.config.out_field or self.config.field: out.astype(x.dtype)})
