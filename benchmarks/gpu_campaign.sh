#!/usr/bin/env bash
# The GPU campaign in one command (see benchmarks/gpu_campaign.py): install the project without
# its dependencies (the GPU image has JAX with CUDA, flax, optax, orbax, numba, transformers,
# safetensors; nothing can be downloaded there), then measure.
#
# With $OUT set (the device tool's folder, which brings back at most 8 files) the results go to a
# work folder and come back as $OUT/campaign.tar.gz (packed after every stage) and
# $OUT/RESULTS-gpu.md; else to ./gpu-campaign. Unpack the archive into
# benchmarks/results/<date>-<gpu>/ and append RESULTS-gpu.md to benchmarks/RESULTS.md. A later
# call goes on where one stopped: `bash benchmarks/gpu_campaign.sh --resume DIR` with DIR the
# unpacked earlier results (carried with the tree).
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
if [ -n "${OUT:-}" ]; then
    work="$(mktemp -d /tmp/dart_jax_campaign.XXXXXX)"
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_campaign.py --out "$work" --archive "$OUT/campaign.tar.gz" "$@"
    cp "$work/RESULTS-gpu.md" "$OUT/" 2>/dev/null
    for f in "$work"/*.log; do echo "== $(basename "$f")"; tail -n 3 "$f"; done
else
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_campaign.py --out gpu-campaign "$@"
fi
