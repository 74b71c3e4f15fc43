"""Operator base classes: the contract every pipeline stage follows.

A stage maps a batched `Element` to a batched `Element` inside one jitted program. Per-record
stages are vmapped over the batch and key their randomness by record identity,
`fold_in(fold_in(stage_key, epoch), record_id)` (docs/concepts.md, "Randomness by record identity").
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_bool
from datarax.core.element import Element

DEFAULT_STREAM = "augment"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BatchContext:
    """What a stage knows about the batch besides its data.

    Attributes:
        record_ids: int32[B], the source index of each record in the batch.
        epoch: int32 scalar, the epoch the batch belongs to.
        mask: bool[B], False for padding rows of a final short batch.
    """

    record_ids: jax.Array
    epoch: jax.Array
    mask: jax.Array

    @classmethod
    def for_batch(cls, batch_size: int, *, epoch: int = 0, record_ids=None) -> BatchContext:
        """A context for calling stages by hand on a batch of `batch_size` records."""
        ids = jnp.arange(batch_size, dtype=jnp.int32) if record_ids is None else jnp.asarray(record_ids, jnp.int32)
        return cls(ids, jnp.asarray(epoch, jnp.int32), jnp.ones((batch_size,), bool))


class StageKey(nnx.Variable):
    """The fixed base key of a stochastic stage (raw uint32 key data, Orbax-friendly)."""


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """Configuration shared by operators.

    Attributes:
        stochastic: whether the operator draws randomness per record.
        stream_name: the `nnx.Rngs` stream its base key comes from (`"augment"` when None);
            an `Rngs` without that stream falls back to its `default` stream, as in NNX.
    """

    stochastic: bool = False
    stream_name: str | None = None

    def __post_init__(self):
        check_bool(self.stochastic, "stochastic")
        if self.stream_name is not None and (not isinstance(self.stream_name, str) or not self.stream_name):
            raise ValueError(
                f"stream_name must be a non-empty string or None, got {self.stream_name!r}"
            )


class OperatorModule(nnx.Module, abc.ABC):
    """Abstract base of every pipeline stage.

    Subclasses implement `apply_batch`. `structure()` describes the stage for the iterator
    fingerprint (class and configuration, never parameter values).
    """

    config: OperatorConfig
    # The settings a constructor takes by position, in order (`datarax.core.construct`).
    positional: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        """Transforms a batched Element (leading batch axis on every leaf)."""

    def __call__(self, elements: Element, ctx: BatchContext) -> Element:
        return self.apply_batch(elements, ctx)

    def structure(self) -> str:
        return f"{type(self).__qualname__}({self.config!r})"

    def draws(self, elements: Element, ctx: BatchContext) -> dict[str, jax.Array]:
        """What this stage draws at random for each record of the batch `elements` under `ctx`, as
        `apply_batch` draws it (each value with a leading batch axis): for looking back at what a
        batch went through (`datarax.pipeline.replay`), never on the hot path.

        Empty for a deterministic stage. A stochastic stage that does not name its parameters
        reports each record's key (`key`: uint32 key data); the image and audio operators report
        their drawn parameters (an angle, a box, a flip), the strategies their choice per record.
        """
        key = getattr(self, "key", None)
        if isinstance(key, StageKey):
            return {"key": jax.random.key_data(record_keys(key, ctx))}
        return {}


def stage_key_from_rngs(owner: str, config: OperatorConfig, rngs: nnx.Rngs | None) -> StageKey | None:
    """Draws a stochastic stage's base key from `rngs`, with a clear error when it cannot.

    Without `rngs` a stochastic stage draws from seed 0, as torchvision's transforms draw from
    torch's default generator: `T.RandomCrop(32, padding=4)` builds. Two stages of one pipeline
    that start from the same seed still draw distinct streams (`distinct_stage_keys`); pass
    `rngs=nnx.Rngs(seed)` to choose the seed.
    """
    if not config.stochastic:
        return None
    stream = config.stream_name or DEFAULT_STREAM
    if rngs is None:
        rngs = nnx.Rngs(0)
    if not isinstance(rngs, nnx.Rngs):
        raise TypeError(f"{owner}: rngs must be an nnx.Rngs, got {type(rngs).__name__}")
    try:
        key = getattr(rngs, stream)()
    except AttributeError:
        raise ValueError(
            f"{owner} draws from the rngs stream {stream!r}, but the rngs given has neither that "
            f"stream nor a 'default' stream; pass nnx.Rngs({stream}=0) or nnx.Rngs(0)"
        ) from None
    return StageKey(jax.random.key_data(key))


def distinct_stage_keys(program: nnx.Module) -> list[tuple[Any, Any]]:
    """Makes every stochastic stage of `program` draw its own stream, even from the same seed.

    In path order, the first stage with a given key keeps it and each later one with the same key
    gets `fold_in(key, n)`, n = 1, 2, ...; stages whose keys already differ keep them. Returns the
    `(path, n)` pairs it changed.
    """
    state = nnx.state(program, StageKey)
    flat = sorted(nnx.to_flat_state(state), key=lambda item: tuple(map(str, item[0])))
    seen: dict[tuple[int, ...], int] = {}
    changed = []
    for path, variable in flat:
        data = jnp.asarray(variable.get_value())
        signature = tuple(int(x) for x in data.reshape(-1))
        count = seen.get(signature, 0)
        seen[signature] = count + 1
        if count:
            folded = jax.random.fold_in(jax.random.wrap_key_data(data), count)
            variable.set_value(jax.random.key_data(folded))
            changed.append((path, count))
    if changed:
        nnx.update(program, nnx.from_flat_state(flat))
    return changed


# The keys `planned_record_keys` derived for the program being traced: (ctx, {id(StageKey): keys}).
_PLAN: contextvars.ContextVar[tuple[BatchContext, dict[int, jax.Array]] | None] = contextvars.ContextVar(
    "datarax_record_key_plan", default=None)


@contextlib.contextmanager
def planned_record_keys(program: nnx.Module, ctx: BatchContext) -> Iterator[None]:
    """Derives the per-record keys of every stochastic stage of `program` at once, for `ctx`.

    Inside the block, `record_keys(stage_key, ctx)` for one of those stages returns its share of one
    batched derivation (two threefry calls per program instead of two per stage; bitwise the same
    keys). A stage called with another context (a sub-batch) derives its own keys.
    """
    keys = [v for _, v in nnx.iter_graph(program)
            if isinstance(v, StageKey) and getattr(v.get_value(), "shape", None) == (2,)]
    if len(keys) < 2:
        yield
        return
    data = jnp.stack([jnp.asarray(k.get_value(), jnp.uint32) for k in keys])
    bases = jax.vmap(lambda d: jax.random.fold_in(jax.random.wrap_key_data(d), ctx.epoch))(data)
    per_record = jax.vmap(lambda b: jax.vmap(lambda r: jax.random.fold_in(b, r))(ctx.record_ids))(bases)
    token = _PLAN.set((ctx, {id(k): per_record[i] for i, k in enumerate(keys)}))
    try:
        yield
    finally:
        _PLAN.reset(token)


def record_keys(stage_key: StageKey, ctx: BatchContext) -> jax.Array:
    """Per-record typed keys: fold_in(fold_in(stage_key, epoch), record_id)."""
    plan = _PLAN.get()
    if plan is not None and plan[0] is ctx and id(stage_key) in plan[1]:
        return plan[1][id(stage_key)]
    base = jax.random.fold_in(jax.random.wrap_key_data(stage_key[...]), ctx.epoch)
    return jax.vmap(lambda r: jax.random.fold_in(base, r))(ctx.record_ids)


class PerRecordOperator(OperatorModule):
    """Abstract base of stages whose maths is written for one record and vmapped over a batch.

    Subclasses implement `apply_element(element, key)`, where `key` is the record's key (None
    for deterministic operators). The constructor of a subclass calls `self._init_rng(...)`.
    """

    key: StageKey | None

    def _init_rng(self, config: OperatorConfig, rngs: nnx.Rngs | None) -> None:
        self.config = config
        self.key = stage_key_from_rngs(type(self).__name__, config, rngs)

    @abc.abstractmethod
    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        """Transforms one record (no batch axis)."""

    def per_record(self) -> Callable[[Element, jax.Array | None], Element]:
        """The function vmapped over a batch: `apply_element`, or a backend's lowering of it."""
        return self.apply_element

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        fn = self.per_record()
        if self.key is None:
            return jax.vmap(lambda el: fn(el, None))(elements)
        return jax.vmap(fn)(elements, record_keys(self.key, ctx))


def read_field(op: Any, element: Element, arg: str = "field") -> Any:
    """`element.data[op.config.<arg>]`, or a KeyError naming the operator, the field, the record's
    fields and the config argument that picks another one."""
    field = getattr(op.config, arg)
    if field not in element.data:
        raise KeyError(f"{type(op).__name__} reads field {field!r}, but the record has fields {sorted(element.data)}; "
                       f"set {type(op.config).__name__}({arg}=...)")
    return element.data[field]
