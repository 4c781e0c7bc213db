"""Convolutional classifiers: Conv -> ReLU -> Pool blocks, and a small ResNet with BatchNorm.

Shapes: B batch, H height, W width, C channels, K classes.

Sizes: a conv or pool over n inputs with kernel k, stride s and padding p gives
`conv_output_size(n, k, s, p) = floor((n + 2p - k) / s) + 1` outputs; L stacked stride-1 convs
of kernel k see `receptive_field(L, k) = 1 + L (k - 1)` inputs.
"""

from __future__ import annotations

from typing import Any, Sequence

import chex
import flax.linen as nn
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.schema import NONNEG, POSITIVE, UNIT, each, fail, one_of, setting

Dtype = Any
POOLS = {"max": jnp.max, "avg": jnp.mean}


def block_pool(x_BxHxWxC, p: int, kind: str = "max"):
  """Pooling over non-overlapping p x p blocks (window = stride = p, 'VALID'):
  y[b, i, j, c] = max (or mean) over u, v < p of x[b, p i + u, p j + v, c], for
  i < floor(H / p), j < floor(W / p); the last H mod p rows and W mod p columns are dropped,
  as a strided 'VALID' window drops them.

  Written as a reshape and a reduction rather than a sliding window (`nn.max_pool`): the same
  values, and a gradient that is an elementwise mask instead of XLA's select-and-scatter, which
  on the CPU took 1.4 of the digits CNN's 2.8 ms backward pass (B=32, 8x8 digits). A max's
  gradient goes to the window's largest entry; ties share it, where select-and-scatter gives it
  all to the first; after a ReLU the only likely tie is an all-zero window, whose entries'
  gradient the ReLU zeroes either way.
  """
  b, h, w, c = x_BxHxWxC.shape
  if min(h, w) < p:
    raise ValueError(f"pooling {p} x {p} blocks needs a feature map at least that large; got "
                     f"{h} x {w} (fewer features or a smaller pool)")
  x_BxHxWxC = x_BxHxWxC[:, :h // p * p, :w // p * p]
  blocks = x_BxHxWxC.reshape(b, h // p, p, w // p, p, c)
  return POOLS[kind](blocks, axis=(2, 4))


def conv_output_size(n: int, k: int, s: int = 1, p: int = 0) -> int:
  """floor((n + 2p - k) / s) + 1."""
  return (n + 2 * p - k) // s + 1


def receptive_field(num_layers: int, k: int) -> int:
  """1 + L (k - 1) for L stacked stride-1 convolutions of kernel k."""
  return 1 + num_layers * (k - 1)


def as_image(x, image_shape: Sequence[int] | None, who: str):
  """(B, H, W, C) from (B, H, W, C), (B, H, W) (one channel) or (B, H*W*C) with image_shape."""
  if x.ndim == 2:
    if not image_shape:
      raise ValueError(f"{who}: flat input {x.shape} needs image_shape=(H, W, C)")
    x = x.reshape((x.shape[0], *image_shape))
  elif x.ndim == 3:
    x = x[..., None]
  chex.assert_rank(x, 4, custom_message=f"{who}: expected images (B, H, W, C)")
  return x


@register_model("cnn")
class CNN(layers.Model):
  """[conv_i -> norm_i -> ReLU -> pool] per entry of `features`, flatten, dense, head.

  `pool_type` 'max' keeps the largest of each pool x pool window, 'avg' its mean; with
  `global_pool` the last feature map (B, H, W, C) is averaged over H and W to (B, C) instead of
  flattened to (B, H W C), so the head's size no longer depends on the image size.
  """

  features: tuple[int, ...] = setting((32, 64), each(POSITIVE))
  kernel: int = setting(3, POSITIVE)
  pool: int = setting(2, POSITIVE)  # 1: no pooling
  pool_type: str = setting("max", one_of(*POOLS))
  global_pool: bool = False
  hidden: int = setting(128, NONNEG)  # 0: no dense layer before the head
  out: int = setting(10, POSITIVE)
  norm: str = setting("none", one_of(*layers.NORM_NAMES))
  dropout: float = setting(0.0, UNIT)
  init_name: str = setting("he", one_of(*layers.INIT_NAMES))
  image_shape: tuple[int, ...] | None = setting(None, each(POSITIVE))
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxHxWxC = as_image(x, self.image_shape, "CNN").astype(self.dtype)
    kinit = layers.get_initializer(self.init_name)
    for i, f in enumerate(self.features):
      x_BxHxWxC = nn.Conv(f, (self.kernel, self.kernel), padding="SAME", kernel_init=kinit,
                          dtype=self.dtype, param_dtype=self.param_dtype, name=f"conv_{i}")(
                              x_BxHxWxC)
      x_BxHxWxC = layers.make_norm(self.norm, train=train, name=f"norm_{i}", dtype=self.dtype,
                                   param_dtype=self.param_dtype, axis_name=self.bn_axis_name)(
                                       x_BxHxWxC)
      x_BxHxWxC = nn.relu(x_BxHxWxC)
      if self.pool > 1:
        x_BxHxWxC = block_pool(x_BxHxWxC, self.pool, self.pool_type)
    if self.global_pool:
      h = jnp.mean(x_BxHxWxC, axis=(1, 2))
    else:
      h = x_BxHxWxC.reshape(x_BxHxWxC.shape[0], -1)
    if self.hidden:
      h = nn.relu(nn.Dense(self.hidden, kernel_init=kinit, dtype=self.dtype,
                           param_dtype=self.param_dtype, name="dense")(h))
      h = nn.Dropout(self.dropout, deterministic=not train)(h)
    return nn.Dense(self.out, dtype=self.dtype, param_dtype=self.param_dtype, name="head")(
        h).astype(jnp.float32)


class ResidualBlock(nn.Module):
  """y = ReLU(F(x) + shortcut(x)), F = conv-BN-ReLU-conv-BN; 1x1 conv shortcut on shape change."""

  features: int
  stride: int = 1
  train: bool = False
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxHxWxC):
    conv = lambda f, k, s, name: nn.Conv(  # noqa: E731
        f, (k, k), strides=(s, s), padding="SAME", use_bias=False,
        kernel_init=layers.get_initializer("he"), dtype=self.dtype,
        param_dtype=self.param_dtype, name=name)
    norm = lambda name, **kw: nn.BatchNorm(  # noqa: E731
        use_running_average=not self.train, momentum=0.9, epsilon=1e-5,
        axis_name=self.bn_axis_name, dtype=self.dtype, param_dtype=self.param_dtype, name=name,
        **kw)
    h = nn.relu(norm("bn_1")(conv(self.features, 3, self.stride, "conv_1")(x_BxHxWxC)))
    # The last BN starts at gamma = 0 so each block begins as the identity.
    h = norm("bn_2", scale_init=nn.initializers.zeros)(conv(self.features, 3, 1, "conv_2")(h))
    shortcut = x_BxHxWxC
    if self.stride != 1 or x_BxHxWxC.shape[-1] != self.features:
      shortcut = norm("bn_proj")(conv(self.features, 1, self.stride, "proj")(x_BxHxWxC))
    return nn.relu(h + shortcut)


@register_model("resnet")
class ResNet(layers.Model):
  """Stem conv-BN-ReLU, stages of residual blocks (stride 2 entering each later stage),
  global average pooling, dense head."""

  stage_sizes: tuple[int, ...] = setting((2, 2), each(POSITIVE))
  features: tuple[int, ...] = setting((16, 32), each(POSITIVE))
  out: int = setting(10, POSITIVE)
  image_shape: tuple[int, ...] | None = setting(None, each(POSITIVE))
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def check(self):
    if len(self.stage_sizes) != len(self.features):
      fail("model.", "features", f"one width per stage: {len(self.stage_sizes)} stage_sizes "
           f"{self.stage_sizes}, got {self.features}")

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxHxWxC = as_image(x, self.image_shape, "ResNet").astype(self.dtype)
    x_BxHxWxC = nn.Conv(self.features[0], (3, 3), padding="SAME", use_bias=False,
                        kernel_init=layers.get_initializer("he"), dtype=self.dtype,
                        param_dtype=self.param_dtype, name="stem")(x_BxHxWxC)
    x_BxHxWxC = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                                     axis_name=self.bn_axis_name, dtype=self.dtype,
                                     param_dtype=self.param_dtype, name="stem_bn")(x_BxHxWxC))
    for s, (n, f) in enumerate(zip(self.stage_sizes, self.features)):
      for b in range(n):
        stride = 2 if (s > 0 and b == 0) else 1
        x_BxHxWxC = ResidualBlock(f, stride, train=train, bn_axis_name=self.bn_axis_name,
                                  dtype=self.dtype, param_dtype=self.param_dtype,
                                  name=f"stage{s}_block{b}")(x_BxHxWxC)
    h_BxC = jnp.mean(x_BxHxWxC, axis=(1, 2))
    return nn.Dense(self.out, dtype=self.dtype, param_dtype=self.param_dtype, name="head")(
        h_BxC).astype(jnp.float32)
