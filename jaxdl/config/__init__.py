"""Experiment configs: load `experiments/<name>.py`, apply dotted overrides, validate.

An experiment is a Python file defining `get_config(arg=None) -> ml_collections.ConfigDict`.
It is named on the command line as a path (`experiments/moons_mlp.py`), a bare name
(`moons_mlp`), and optionally `:ARG` (`moons_mlp:smoke`, `moons_mlp:bn`), the argument passed to
`get_config`. Arguments compose: `moons_mlp:bn,smoke` passes 'bn,smoke', which the experiment
reads with `parse_arg(arg, bn=False, smoke=False)` (flags, and `key=value` for typed values).

Overrides are `key.path=value` strings. The value is parsed as a Python literal when it is one
(`3e-3`, `500`, `True`, `(64, 64)`, `None`) and taken as a string otherwise. The config is locked:
an unknown key, or a value whose type does not match the field, raises `ConfigError` with a
one-line message naming the key, before anything is built or compiled.

The package: `experiments.py` (finding and loading experiment files, `parse_arg`),
`overrides.py` (`--set`), `settings.py` (the root, `train` and `parallel` sections, `base_config`,
`smoke`). Callers import every name from `jaxdl.config`.
"""

from jaxdl.config.experiments import (default_workdir, experiments_dir, list_experiments,
                                      load_config, load_module, parse_arg, resolve_experiment)
from jaxdl.config.overrides import apply_overrides, diff_configs, variant_config, with_overrides
from jaxdl.config.settings import (ParallelSettings, RootSettings, TrainSettings, base_config,
                                   parse_parallel, parse_root, parse_train, smoke, validate)
from jaxdl.schema import ConfigError

__all__ = ["ConfigError", "RootSettings", "TrainSettings", "ParallelSettings", "base_config",
           "load_config", "parse_arg", "parse_root", "parse_train", "parse_parallel", "validate",
           "smoke", "variant_config", "with_overrides", "apply_overrides", "diff_configs",
           "default_workdir", "experiments_dir", "list_experiments", "load_module",
           "resolve_experiment"]
