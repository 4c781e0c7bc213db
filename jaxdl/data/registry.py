"""How the `data` config section becomes a typed, checked, frozen `DataSource`.

A registry maps a dataset name (the section's `name` key) to a frozen dataclass whose fields are
the section's other keys, each declared once with its default and its range check:

  @register_source("moons")
  @dataclasses.dataclass(frozen=True)
  class Moons(DataSource):
    noise: float = setting(0.25, NONNEG)

    def build(self) -> Source: ...

`parse_data(section)` picks the class named by `section['name']`, refuses a key the class does not
have and a value of the wrong type (an int is accepted for a float), each with one line naming the
key, and constructs the class. Ranges are checked in `__post_init__`, so a source built directly
(`Moons(noise=-1)`) refuses bad values as a parsed one does: `data.noise: must be >= 0, got -1`.
`default_data_config(name)` writes the section back out from the same fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import ml_collections
import numpy as np

from jaxdl.schema import (POSITIVE, ConfigError, Settings, default_section, parse_section, plain,
                          registrar, setting, switchable_registry)


@dataclasses.dataclass(frozen=True)
class Split:
  """`num` examples; `gather(idx_B) -> dict of (B, ...) numpy arrays`."""
  num: int
  gather: Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Source:
  """What a `DataSource` builds: the train and eval splits and the `info` dict."""
  train: Split
  eval: Split
  info: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class DataSource(Settings):
  """A parsed `data` section: the keys every dataset reads, and `build() -> Source`.

  A subclass may redeclare a field to change its default (`batch_size: int = 1000`); the range
  check declared here still applies.
  """

  prefix: ClassVar[str] = "data."
  kind: ClassVar[str] = "dataset"
  batch_size: int = setting(128, POSITIVE)                # G, global rows per training step
  eval_batch_size: int | None = setting(None, POSITIVE)   # None: the whole eval split at once
  shuffle: bool = True                                    # False: every epoch in row order

  def build(self) -> Source:
    raise NotImplementedError(f"data source {self.name!r} defines no build()")

  def check_batch(self, num_train: int, what: str) -> None:
    """ConfigError when `batch_size` exceeds the `num_train` training examples: the batch is not
    shrunk behind the user's back (that would change the run they asked for); the one line
    names data.batch_size, the count (`what` says of what) and a power of two that fits."""
    if self.batch_size > num_train:
      fits = 2 ** (max(num_train, 1).bit_length() - 1)
      raise ConfigError(f"data.batch_size: {self.batch_size} is larger than the training set "
                        f"({num_train} {what}); set data.batch_size to at most {num_train}, "
                        f"e.g. --set data.batch_size={fits}")


# `--set data.name=...` re-writes the section for that source (`jaxdl.schema.switch_section`).
SOURCES: dict[str, type[DataSource]] = switchable_registry("data")


# Class decorator: `SOURCES[name] = cls` for a frozen `DataSource` dataclass.
register_source = registrar(SOURCES, "data source", DataSource)


def source_class(name) -> type[DataSource]:
  """The registered class of dataset `name`; ConfigError naming `data.name` if there is none."""
  if not name:
    raise ConfigError(f"data.name: must be set; expected one of {', '.join(SOURCES)}")
  if name not in SOURCES:
    raise ConfigError(f"data.name: unknown dataset {name!r}; expected one of "
                      f"{', '.join(SOURCES)}")
  return SOURCES[name]


def parse_data(data_cfg) -> DataSource:
  """The `data` section (ConfigDict or mapping) as its registered, checked `DataSource`.

  A key left out takes the class default; an explicit None is accepted only by an optional field
  (`int | None`), so an unset placeholder of a required key is an error naming it.
  """
  section = plain(data_cfg)
  source_class(section.get("name"))
  return parse_section(section, SOURCES)


def default_data_config(name: str) -> ml_collections.ConfigDict:
  """A ConfigDict with every key dataset `name` reads, at its default value.

  A field whose default is None becomes a typed placeholder, so `--set data.n_eval=500` is still
  type-checked by the locked config.
  """
  return default_section(source_class(name))
