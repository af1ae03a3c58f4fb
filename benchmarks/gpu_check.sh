#!/usr/bin/env bash
# The checks that need a GPU, in one command of under 8 minutes on one H100:
#
#   bash benchmarks/gpu_check.sh WHEELS OUT
#
# WHEELS: a folder of wheels for what the GPU machine lacks, installed with no network (islpy for
#   its Python, e.g. `pip download --no-deps --only-binary=:all: --python-version 3.12
#   --platform manylinux_2_28_x86_64 -d WHEELS islpy`); jax with CUDA, numpy, sympy, tqdm,
#   safetensors and ml_dtypes are expected there already.
# OUT: where the results go: devices.txt, tests.log (tests/test_gpu.py), and the decode
#   benchmark at Llama-3.2-1B's widths (its 16 layers) in float32 and in bfloat16 against the
#   plain-JAX baseline: decode_1b_<dtype>.json and .log.
set -uo pipefail
WHEELS=${1:?give a folder of wheels}
OUT=${2:?give an output folder}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
python3 -c 'import jax, islpy; print(jax.__version__, jax.devices())' 2>&1 | tee "$OUT/devices.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py \
    tests/test_checkpoint.py 2>&1 | tee "$OUT/tests.log"
for dtype in bfloat16 float32; do
    timeout 170 python3 -m benchmarks.decode --preset llama-3.2-1b --dtype "$dtype" \
        --systems tempo_lab jax_scan --runs 3 --no-progress \
        --out "$OUT/decode_1b_$dtype.json" 2>&1 | tee "$OUT/decode_1b_$dtype.log"
done
