"""The one base of per-record operators that transform a single data field (image and audio ops).

`draw(key, shape)` turns the record key (None when not stochastic) into the record's parameters;
`apply(x, params)` is the pure maths. The result is written in the input's dtype to
`config.out_field` (None: back to `field`). Magnitudes named in the class's `bounds` (scalars) and
`channel_bounds` (per channel) become `Magnitude` / `ChannelMagnitude` modules, learnable when
the config's `learnable` names them.
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
from datarax.operators.learnable import ChannelMagnitude, check_learnable_field, learnable_names, magnitudes
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
    """

    field: str = "x"
    out_field: str | None = None
    # `datarax.operators.learnable.Learnable` spelled out: subclasses' generated __init__ resolve
    # this annotation in their own modules, which do not import the alias.
    learnable: bool | tuple[str, ...] = False

    def __post_init__(self):
        super().__post_init__()
        check_field_name(*field(self, "field"))
        check_field_name(*field(self, "out_field"), allow_none=True)
        object.__setattr__(self, "learnable", check_learnable_field(self.learnable, type(self).__name__))


def check_magnitudes(config: FieldOperatorConfig, bounds: Bounds, *, open_low: tuple[str, ...] = ()) -> None:
    """Checks each config field named in `bounds` lies in its `(low, high)` (`(low, high]` for `open_low`)."""
    for name, (low, high) in bounds.items():
        check_number(*field(config, name), low, high, open_low=name in open_low)


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
        self._init_rng(config, rngs)
        self.magnitudes = magnitudes(config, bounds, owner=owner, chosen=chosen)
        self.channel_magnitudes = nnx.Dict({
            name: ChannelMagnitude(getattr(config, name), config.n_channels, low=low, high=high,
                                   learnable=name in chosen, name=f"{owner}.{name}")
            for name, (low, high) in self.channel_bounds.items()
        })

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
