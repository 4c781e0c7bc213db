"""config.json <-> GPT for every supported model_type: the per-model_type dispatch to the module
that reads and writes it, `jaxdl.models.hf_families` (GPT-2, the Llama family) or
`jaxdl.models.hf_gemma` (Gemma 1, 2, 3 text). `jaxdl.models.hf` (the files and the entry points
load_hf / save_hf) and the commands go through here."""

from __future__ import annotations

from jaxdl.models import hf_families, hf_gemma
from jaxdl.models.gpt import GPT
from jaxdl.models.hf_families import refuse
from jaxdl.schema import ConfigError

MODEL_TYPES = hf_families.MODEL_TYPES + tuple(hf_gemma.GEMMA_TYPES)


def _family(model_type: str):
  """The module that reads and writes `model_type`'s config.json (the per-model_type dispatch)."""
  return hf_gemma if model_type in hf_gemma.GEMMA_TYPES else hf_families


def model_from_config(cfg: dict, where: str = "config.json", **overrides) -> GPT:
  """The GPT a Hugging Face config.json describes, any supported model_type (`_family`)."""
  if cfg.get("model_type") not in MODEL_TYPES:
    refuse(where, "model_type", cfg.get("model_type"), f"one of {', '.join(MODEL_TYPES)}")
  return _family(cfg["model_type"]).model_from_config(cfg, where, **overrides)


def export_type(model: GPT, model_type: str | None) -> str:
  """The model_type `model` is saved as (`hf_families.export_type`; Gemma's, chosen by
  norm='rms1p' or named, `hf_gemma.export_type`), refusing in one line what it cannot hold."""
  if model_type is not None and model_type not in MODEL_TYPES:
    raise ConfigError(f"model_type: {model_type!r}; expected one of {', '.join(MODEL_TYPES)}")
  gemma = model_type in hf_gemma.GEMMA_TYPES or (model_type is None and model.norm == "rms1p")
  return (hf_gemma if gemma else hf_families).export_type(model, model_type)


def hf_config(model: GPT, model_type: str) -> dict:
  """config.json for `model` as `model_type` (an `export_type` answer)."""
  return _family(model_type).hf_config(model, model_type)
