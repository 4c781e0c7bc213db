#!/usr/bin/env bash
# One-GPU check of jaxdl's GPT-2 small (124M) train step in bf16 with cuDNN attention.
#
# Run from the repository root, as is:   bash scripts/gpu_check.sh
# Assumes a Python environment with jax[cuda] already installed; installs only jaxdl itself
# (pip install -e .). Prints the bench table (tokens/s, model FLOP/s, MFU against a bf16 matmul
# timed on the same GPU, and the plain-Flax baseline) and writes gpu_check.json.
# Target (issue 8): MFU >= 45% on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

"$PYTHON" - <<'PY'
import sys
import jax
if jax.default_backend() != "gpu":
  sys.exit(f"gpu_check: jax sees no GPU (backend {jax.default_backend()!r}); install jax[cuda]")
print(f"gpu_check: jax {jax.__version__} on {jax.devices()[0].device_kind}", flush=True)
PY

"$PYTHON" -m pip install --quiet -e .
"$PYTHON" -m jaxdl bench --only gpt --json gpu_check.json

"$PYTHON" - <<'PY'
import json
r = json.load(open("gpu_check.json"))["results"]["gpt"]
j, b = r["jaxdl"], r["baseline"]
print(f"\njaxdl GPT-2 small bf16: {j['tokens_per_s']:,.0f} tokens/s, "
      f"{j['model_flops'] / 1e12:.1f} TFLOP/s, MFU {100 * j['mfu']:.1f}% "
      f"(peak {r['peak_flops'] / 1e12:.0f} TFLOP/s measured); "
      f"plain-Flax baseline {b['tokens_per_s']:,.0f} tokens/s, MFU {100 * b['mfu']:.1f}%")
PY
