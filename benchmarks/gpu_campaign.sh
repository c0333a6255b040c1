#!/usr/bin/env bash
# The GPU campaign in one command (see benchmarks/gpu_campaign.py): install the project without
# its dependencies (the GPU image has JAX with CUDA, flax, optax, orbax, numba, transformers,
# safetensors; nothing can be downloaded there), then measure. Results go to $OUT (the device
# tool's folder) or ./gpu-campaign; append RESULTS-gpu.md to benchmarks/RESULTS.md afterwards.
# A later call goes on where one stopped: `bash benchmarks/gpu_campaign.sh --resume DIR` with DIR
# the earlier results (e.g. copied to benchmarks/results/<date>-h100/ and carried with the tree).
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu-campaign}"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
PYTHONUNBUFFERED=1 python3 benchmarks/gpu_campaign.py --out "$out" "$@"
