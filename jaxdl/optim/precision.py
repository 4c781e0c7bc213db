"""Mixed-precision policies and dynamic loss scaling.

Policies (`train.precision`):
  fp32  compute float32, params float32, no loss scaling.
  bf16  compute bfloat16 (Flax `dtype`), master params float32 (Flax `param_dtype`); the loss,
        softmax and norm statistics stay float32 (models cast logits to float32; Flax norms
        compute their statistics in float32). bf16 has float32's exponent range: no scaling.
  fp16  compute float16, master params float32, dynamic loss scaling (float16 gradients
        underflow below ~6e-8 without it).

Dynamic loss scaling (S the scale, N the period, c the count of finite steps since the last
change): differentiate S * loss, divide the gradients by S; if any gradient is non-finite,
skip the update (keep params and optimizer state) and set S <- max(S / 2, min_scale), c <- 0;
otherwise apply the update and set c <- c + 1, and when c reaches N, S <- min(2 S, max_scale)
and c <- 0.
S and c are arrays in the TrainState, so they are checkpointed with it; N is static.

Use in a train step (see `DynamicLossScale` for the methods):

  def scaled_loss(params):
    loss, aux = loss_fn(params)
    return state.loss_scale.scale_loss(loss), (loss, aux)
  grads, (loss, aux) = jax.grad(scaled_loss, has_aux=True)(state.params)
  grads = state.loss_scale.unscale(grads)
  finite = all_finite(grads)
  updates, new_opt = tx.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  params, opt_state = select_tree(finite, (new_params, new_opt), (state.params, state.opt_state))
  loss_scale = state.loss_scale.adjust(finite)
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from jaxdl.optim.tree_reductions import all_finite  # noqa: F401  (its home before)

POLICIES = ("fp32", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class Policy:
  """compute_dtype for activations (Flax `dtype`), param_dtype for master weights
  (Flax `param_dtype`), output_dtype for the loss and metrics, loss_scaling for fp16."""
  name: str
  compute_dtype: jnp.dtype
  param_dtype: jnp.dtype = jnp.float32
  output_dtype: jnp.dtype = jnp.float32
  loss_scaling: bool = False

  def cast_to_compute(self, tree):
    """Floating leaves to compute_dtype (e.g. the input batch); integer leaves unchanged."""
    return _cast_floats(tree, self.compute_dtype)

  def cast_to_param(self, tree):
    return _cast_floats(tree, self.param_dtype)

  def cast_to_output(self, tree):
    return _cast_floats(tree, self.output_dtype)


def _cast_floats(tree, dtype):
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) else x,
      tree)


def get_policy(name: str) -> Policy:
  """The policy for `train.precision`."""
  if name == "fp32":
    return Policy("fp32", jnp.float32)
  if name == "bf16":
    return Policy("bf16", jnp.bfloat16)
  if name == "fp16":
    return Policy("fp16", jnp.float16, loss_scaling=True)
  raise ValueError(f"train.precision: unknown policy {name!r}; expected one of {list(POLICIES)}")


class DynamicLossScale(flax.struct.PyTreeNode):
  """Loss scale S with its finite-step counter; `period` N and the bounds are static.

  Attributes:
    scale: float32 scalar S.
    counter: int32 scalar, finite steps since S last changed.
    period: N, finite steps before S doubles.
    factor: growth / shrink factor (2).
    min_scale: floor for S (1).
    max_scale: ceiling for S (2^24): without it a long overflow-free run would double S up to
      float32 inf, and inf / 2 stays inf.
  """
  scale: jax.Array
  counter: jax.Array
  period: int = flax.struct.field(pytree_node=False, default=2000)
  factor: float = flax.struct.field(pytree_node=False, default=2.0)
  min_scale: float = flax.struct.field(pytree_node=False, default=1.0)
  max_scale: float = flax.struct.field(pytree_node=False, default=2.0**24)

  @classmethod
  def create(cls, init_scale: float = 2.0**15, period: int = 2000, factor: float = 2.0,
             min_scale: float = 1.0, max_scale: float = 2.0**24) -> "DynamicLossScale":
    return cls(scale=jnp.asarray(init_scale, jnp.float32), counter=jnp.zeros([], jnp.int32),
               period=period, factor=factor, min_scale=min_scale, max_scale=max_scale)

  def scale_loss(self, loss):
    """S * loss (in float32: the scaled loss is what gets differentiated)."""
    return loss.astype(jnp.float32) * self.scale

  def unscale(self, grads):
    """grads / S, in float32."""
    inv = 1.0 / self.scale
    return jax.tree.map(lambda g: g.astype(jnp.float32) * inv, grads)

  def adjust(self, grads_finite) -> "DynamicLossScale":
    """Next (S, c): halve S and reset c on overflow; double S after `period` finite steps."""
    grads_finite = jnp.asarray(grads_finite)
    grown = self.counter + 1 >= self.period
    new_scale = jnp.where(
        grads_finite,
        jnp.where(grown, jnp.minimum(self.scale * self.factor, self.max_scale), self.scale),
        jnp.maximum(self.scale / self.factor, self.min_scale))
    new_counter = jnp.where(grads_finite & ~grown, self.counter + 1, 0).astype(jnp.int32)
    return self.replace(scale=new_scale.astype(jnp.float32), counter=new_counter)


class NoOpLossScale(flax.struct.PyTreeNode):
  """The same interface with S = 1 and nothing to adjust (fp32, bf16)."""

  @property
  def scale(self):
    return jnp.ones([], jnp.float32)

  def scale_loss(self, loss):
    return loss

  def unscale(self, grads):
    return grads

  def adjust(self, grads_finite) -> "NoOpLossScale":
    del grads_finite
    return self


def make_loss_scale(policy: Policy | str, init_scale: float = 2.0**15, period: int = 2000):
  """DynamicLossScale for a policy with loss_scaling (fp16), NoOpLossScale otherwise."""
  if isinstance(policy, str):
    policy = get_policy(policy)
  if policy.loss_scaling:
    return DynamicLossScale.create(init_scale, period)
  return NoOpLossScale()


def select_tree(pred, on_true, on_false):
  """Leafwise `where(pred, on_true, on_false)` for two trees of the same structure (scalar pred).

  With pred = all_finite(grads): the new (params, opt_state) after a finite step, the old ones
  (the step skipped) after an overflow.
  """
  pred = jnp.asarray(pred)
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)
