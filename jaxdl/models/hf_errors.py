"""The one-line refusal of a config.json field jaxdl cannot represent, shared by every module that
reads a Hugging Face config (`hf_families`, `hf_phi`, `hf_gemma`, `hf_config`, `hf`); its own
module so that `hf_phi`, which `hf_families` imports, can use it without an import circle."""

from __future__ import annotations

import json

from jaxdl.schema import ConfigError


def refuse(where: str, field: str, value, expected: str):
  """Raises the ConfigError naming `field`, its `value` and what was `expected`."""
  raise ConfigError(f"{where}: {field}={json.dumps(value)} cannot be imported; expected {expected}")
