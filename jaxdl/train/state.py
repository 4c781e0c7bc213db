"""The training state: a pytree of arrays, nothing else.

No PRNG key is stored: the step derives its randomness from `fold_in(base_key, step)`, so the
state saved in a checkpoint is all a resumed run needs to continue bit-exactly.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class TrainState:
  """step, params, optimizer state, mutable model collections and the fp16 loss scale.

  Attributes:
    step: int32 scalar, the number of updates applied so far.
    params: the model parameters (fp32 master copy under every precision policy).
    opt_state: the optax state of the optimizer chain.
    model_state: mutable collections other than params, e.g. {'batch_stats': ...}.
    loss_scale: the dynamic loss scale under the fp16 policy, else None.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any
  loss_scale: Any = None


def create_train_state(model, tx, init_rng, example_x, loss_scale=None) -> TrainState:
  """Initializes params and model state from one example input, and the optimizer state."""
  params_rng, dropout_rng = jax.random.split(init_rng)
  variables = model.init({"params": params_rng, "dropout": dropout_rng}, example_x, train=False)
  variables = dict(variables)
  params = variables.pop("params")
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    model_state=variables, loss_scale=loss_scale)
