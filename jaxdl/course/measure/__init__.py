"""Measurements behind the course's worked numbers, built on jaxdl's layers and models.

`jaxdl reproduce` and the notebooks call these; each returns plain numbers (numpy), never a
plot. Shapes: B batch (samples), N width, L depth (layers), R random networks, K classes.

Signal propagation (section 2 of the lesson):
  product_gradient       h_l = a h_{l-1} for L scalar layers: d h_L / d h_0 = a^L (by jax.grad)
  relu_stack_moments     E[h_l^2] per layer of a ReLU stack h_l = relu(W_l h_{l-1}) with W_l from
                         a `jaxdl.models.layers` initializer by name; forward activations and
                         backward gradients d(g . h_L)/d h_l for a unit-variance cotangent g.
                         Theory: E[h_l^2] = (n Var(W) / 2)^l E[h_0^2], so 2^-l for 1/n
                         ('lecun_normal') and 1 for 2/n ('he_normal').
  stack_rms              RMS of h_l / RMS of h_0 for the linear branch F(h) = a W h,
                         W ~ Var 1/n: plain h_l = F(h_{l-1}) -> a^l; residual
                         h_l = h_{l-1} + F(h_{l-1}) -> (1 + a^2)^(l/2) (the cross term has mean 0).
Normalization, attention, dropout, first loss, convolutions, GPT blocks:
  batchnorm_moons_curves the moons MLP's training loss per epoch with and without BatchNorm
  batchnorm_moons_losses the same over S seeds, each setting one vmapped, scanned program
  qk_score_std           std of q . k and of q . k / sqrt(d_k) for unit-variance q, k
  dropout_draws          the activations of `jaxdl.models.mlp.MLP`'s inverted dropout
  first_loss             cross-entropy of a fresh MLP classifier with its head scaled
  conv_output_length     the output length of a real `flax.linen.Conv`
  measured_receptive_field  input pixels reached by one output of stacked convs (by gradient)
  block_kernel_params    weights in the matrices of one GPT block, in units of d^2
  block_grad_norms       gradient norm of each GPT block's parameters at init (pre- vs post-LN),
                         for one seed or vmapped over S seeds
Generative worked examples:
  two_point_field        the exact flow field for data +-1, as a denoiser `apply_fn`

Modules: `signal` (propagation, scores, dropout, first loss), `models` (convolutions, GPT blocks,
attention maps), `training` (flow field, decoupled decay, BatchNorm curves, example loss curves).
"""

from jaxdl.course.measure.models import (attention_maps, block_grad_norms,
                                         block_kernel_params, conv_output_length,
                                         gpt_param_shapes, measured_receptive_field)
from jaxdl.course.measure.signal import (dropout_draws, first_loss, product_gradient,
                                         qk_score_std, relu_stack_moments, relu_stack_theory,
                                         stack_rms, stack_rms_theory)
from jaxdl.course.measure.training import (batchnorm_moons_curves, batchnorm_moons_losses,
                                           decoupled_decay_factor, example_loss_curves,
                                           two_point_field)

__all__ = ["attention_maps", "batchnorm_moons_curves", "batchnorm_moons_losses",
           "block_grad_norms", "block_kernel_params", "conv_output_length",
           "decoupled_decay_factor", "dropout_draws", "example_loss_curves", "first_loss",
           "gpt_param_shapes", "measured_receptive_field", "product_gradient", "qk_score_std",
           "relu_stack_moments", "relu_stack_theory", "stack_rms", "stack_rms_theory",
           "two_point_field"]
