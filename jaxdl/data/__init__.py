"""Datasets for jaxdl: embedded (no download) and user files, fed through grain.

    ds = make_dataset(config)            # reads config.data.* and config.seed
    ds.info                              # kind, num_classes, vocab_size, input_shape, num_train,
                                         # num_eval (+ name, steps_per_epoch)
    it = ds.train_iter(process_index, process_count)   # infinite; this process's rows of each
                                                       # global batch
    it.get_state() / it.set_state(state)               # small JSON dict; exact resume
    for batch in ds.eval_batches(): ...                # fixed order, padded, batch['mask']

Batches are dicts of numpy arrays: supervised {'x', 'y'} ('binary' y float32 0/1, 'classification'
y int32), language modelling {'x', 'y'} int32 (B, T) with y the next byte, generative {'x'} (+ 'y'
when labelled). The stream and its sharding rule are described in `jaxdl.data.pipeline`; the
datasets in `jaxdl.data.sources`.

The `data` section is parsed once, at `make_dataset`, into a typed `DataSource`
(`parse_data(config.data)`): a frozen dataclass registered under the section's `name`, whose fields
are the dataset's keys with their defaults and range checks, written once. Experiments start from
`default_data_config(name)`, which lists those fields at their defaults, so command-line overrides
are type-checked by the locked config. Adding a data source is one registered class, in any module
imported before the config is used:

    @register_source("ramp")
    @dataclasses.dataclass(frozen=True)
    class Ramp(DataSource):
      n: int = setting(64, POSITIVE)             # -> data.n, checked > 0

      def build(self) -> Source:                 # the arrays; the pipeline does the rest
        x = {"x": np.arange(self.n, dtype=np.float32)[:, None]}
        return arrays_source("generative", x, x)

(`jaxdl.data.registry` holds `SOURCES` and `parse_data`; the checks are `jaxdl.schema`'s.)
"""

from __future__ import annotations

import ml_collections

from jaxdl.config import parse_root
from jaxdl.data.augment import augment_setting, augmentation
from jaxdl.data.pipeline import Dataset, EvalBatches, TrainIterator
from jaxdl.schema import NONNEG, OPEN_UNIT, POSITIVE, one_of, setting
from jaxdl.data.registry import (SOURCES, DataSource, Source, Split, default_data_config,
                                 parse_data, register_source)
from jaxdl.data import assoc_recall, digit_strings, digit_tokens, graphs, passkey  # noqa: F401
from jaxdl.data import disk, images  # noqa: F401  (register the on-disk datasets)
from jaxdl.data.sources import KINDS, TOY2D, arrays_source, decode, digits_split, sample_toy2d

__all__ = ["make_dataset", "default_data_config", "parse_data", "register_source", "SOURCES",
           "DataSource", "Source", "Split", "setting", "POSITIVE", "NONNEG", "OPEN_UNIT",
           "one_of", "arrays_source", "sample_toy2d", "decode", "digits_split", "Dataset",
           "TrainIterator", "EvalBatches", "DATASETS", "KINDS", "TOY2D", "augment_setting"]

# The built-in datasets (SOURCES also holds any registered since import).
DATASETS = tuple(SOURCES)


def make_dataset(config: ml_collections.ConfigDict, source: DataSource | None = None) -> Dataset:
  """Builds `config.data.name` with `config.data.*`; training order is seeded by `config.seed`.
  `source`: the section already parsed (`jaxdl.train.Run.data`); None parses `config.data`."""
  source = parse_data(config.data) if source is None else source
  seed = parse_root(config).seed
  built = source.build()
  if source.batch_size > built.train.num:
    raise ValueError(f"data.batch_size: {source.batch_size} is larger than the training set "
                     f"({built.train.num} examples of dataset {source.name!r})")
  augment = augmentation(source.augment, built.info, seed) if hasattr(source, "augment") else None
  return Dataset(built, batch_size=source.batch_size, eval_batch_size=source.eval_batch_size,
                 seed=seed, shuffle=source.shuffle, name=source.name, augment=augment)
