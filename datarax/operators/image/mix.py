"""Batch-level mixing: MixUp and CutMix, with labels mixed in the same proportions.

Each record is mixed with a partner from the same batch, paired by per-record keys so the pairing
depends only on which records share the batch and the epoch; padding rows are left unchanged.
`lam ~ Beta(alpha, alpha)` is reparameterised, so the output is differentiable in a learnable
`alpha`. See docs/operators.md, "Batch mixing".

Example:
    >>> mixup = MixUpOperator(MixUpConfig(alpha=0.2, num_classes=10), rngs=nnx.Rngs(0))
    >>> out = mixup(Element({"image": images, "label": labels}), BatchContext.for_batch(len(images)))
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_field_name, check_int, describe_value, field, require_stochastic
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule, record_keys, stage_key_from_rngs
from datarax.operators.field import check_magnitudes
from datarax.operators.image.base import ImageOperatorConfig
from datarax.operators.image.functional import beta
from datarax.operators.image.functional.mix import cutmix, mixup, partners
from datarax.operators.learnable import magnitudes


@dataclasses.dataclass(frozen=True)
class MixConfig(ImageOperatorConfig):
    """Shared by MixUp and CutMix.

    Attributes:
        alpha: the Beta(alpha, alpha) concentration of the mixing weight, in (0.001, 4]. Below
            0.001 Beta(alpha, alpha) is already two point masses at 0 and 1 (no mixing), and
            its reparameterised draw underflows (NaN gradients below ~1e-19, NaN at 0), so a
            learnable alpha is bounded there too.
        label_field: the data field holding labels: int class ids (B,) or one-hot/soft labels
            (B, num_classes). The output holds mixed soft labels (B, num_classes).
        num_classes: number of classes (> 1).
    """

    stochastic: bool = True
    alpha: float = 1.0
    label_field: str = "label"
    num_classes: int = 0

    def __post_init__(self):
        super().__post_init__()
        require_stochastic(self)
        check_magnitudes(self, MixOperator.bounds, open_low=("alpha",))
        check_field_name(*field(self, "label_field"))
        check_int(*field(self, "num_classes"), 2, why=" (labels are mixed as one-hot vectors)",
                  hint="; e.g. num_classes=10")


@dataclasses.dataclass(frozen=True)
class MixUpConfig(MixConfig):
    """Configuration of `MixUpOperator` (see `MixConfig`)."""


@dataclasses.dataclass(frozen=True)
class CutMixConfig(MixConfig):
    """Configuration of `CutMixOperator` (see `MixConfig`)."""


def draw_parameters(op: MixOperator, ctx: BatchContext, shape: tuple[int, ...]) -> dict[str, Any]:
    """What `op` draws for a batch of images of per-record `shape`: the partner index of every
    record and its mixing parameters (leading axis B). `apply_batch` uses exactly these.

    Each record draws one block of uniforms from its key: the first orders the records for
    pairing, the rest feed `op.draw`.
    """
    dtype = jnp.result_type(float)
    units = jax.vmap(lambda k: jax.random.uniform(k, (1 + op.num_uniforms,), dtype))(record_keys(op.key, ctx))
    params = jax.vmap(lambda u: op.draw(u, tuple(shape)))(units[:, 1:])
    return {"partner": partners(units[:, 0], ctx.mask), **params}


class MixOperator(OperatorModule):
    """Abstract base of the batch-mixing operators (see the module docstring)."""

    config_class: ClassVar[type[MixConfig]]
    num_uniforms: ClassVar[int]
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"alpha": (1e-3, 4.0)}

    def __init__(self, config: MixConfig | None = None, *, rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(self.config_class, config, settings, type(self).__name__, exact=True)
        self.config = config
        self.key = stage_key_from_rngs(type(self).__name__, config, rngs)
        self.magnitudes = magnitudes(config, self.bounds, owner=self.config_class.__name__)

    @abc.abstractmethod
    def draw(self, unit: jax.Array, shape: tuple[int, ...]) -> dict[str, jax.Array]:
        """One record's mixing parameters (at least `lam`, its Beta(alpha, alpha) weight) from
        `num_uniforms` uniforms in [0, 1)."""

    @abc.abstractmethod
    def mix(self, image: jax.Array, other: jax.Array, params: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Mixes one image with its partner; returns the image and the share of its own label."""

    def weight(self, unit: jax.Array) -> dict[str, jax.Array]:
        """A mixing weight `lam ~ Beta(alpha, alpha)` from `beta.UNIFORMS_PER_BETA` uniforms, with the
        gamma draws behind it (see `datarax.operators.image.functional.beta.symmetric_beta`)."""
        return beta.symmetric_beta(unit, self.magnitudes["alpha"]())

    def read(self, elements: Element) -> tuple[jax.Array, jax.Array]:
        """The batch's images and labels (as (B, num_classes) floats in the image dtype)."""
        name, config = type(self).__name__, self.config
        for wanted in (config.field, config.label_field):
            if wanted not in elements.data:
                raise KeyError(f"{name} reads field {wanted!r}, but the batch has fields {sorted(elements.data)}; "
                               f"set {self.config_class.__name__}(field=..., label_field=...)")
        images, labels = elements.data[config.field], elements.data[config.label_field]
        if images.ndim != 4 or not jnp.issubdtype(images.dtype, jnp.floating):
            raise ValueError(f"{name} expects a batch of float HWC images in field {config.field!r}, "
                             f"got {describe_value(images)}")
        if jnp.issubdtype(labels.dtype, jnp.integer) and labels.ndim == 1:
            return images, jax.nn.one_hot(labels, config.num_classes, dtype=images.dtype)
        if labels.ndim == 2 and labels.shape[1] == config.num_classes:
            return images, labels.astype(images.dtype)
        raise ValueError(f"{name} expects labels in field {config.label_field!r} as int class ids (B,) or "
                         f"one-hot rows (B, {config.num_classes}), got {describe_value(labels)}")

    def draws(self, elements: Element, ctx: BatchContext) -> dict[str, jax.Array]:
        """`draw_parameters` for this batch: each record's partner (a row of the batch) and weights."""
        return draw_parameters(self, ctx, self.read(elements)[0].shape[1:])

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        return self.apply_drawn(elements, self.draws(elements, ctx))

    def apply_drawn(self, elements: Element, drawn: dict[str, jax.Array]) -> Element:
        """Mixes a batch with parameters from `draw_parameters` (what `apply_batch` does)."""
        images, labels = self.read(elements)
        params = dict(drawn)
        partner = params.pop("partner")
        mixed, own = jax.vmap(self.mix)(images, images[partner], params)
        own = own.astype(images.dtype)[:, None]
        return elements.update_data({self.config.out_field or self.config.field: mixed.astype(images.dtype),
                                     self.config.label_field: mixup(labels, labels[partner], own)})


class MixUpOperator(MixOperator):
    """MixUp (Zhang et al. 2018): a convex combination of two images and of their labels."""

    config_class = MixUpConfig
    num_uniforms = beta.UNIFORMS_PER_BETA

    def draw(self, unit, shape):
        return self.weight(unit)

    def mix(self, image, other, params):
        lam = params["lam"]
        return mixup(image, other, lam.astype(image.dtype)), lam


class CutMixOperator(MixOperator):
    """CutMix (Yun et al. 2019): a box of the partner pasted in; labels weighted by area.

    The box edges are continuous and border pixels are mixed by the area they cover, so the
    output is differentiable in `alpha`.
    """

    config_class = CutMixConfig
    num_uniforms = beta.UNIFORMS_PER_BETA + 2

    def draw(self, unit, shape):
        center = unit[-2:] * jnp.asarray(shape[:2], unit.dtype)
        return {**self.weight(unit[:-2]), "center": center}

    def mix(self, image, other, params):
        return cutmix(image, other, params["center"], params["lam"])
