#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (it has torch, cuda-bindings, numpy, rich,
# typer, pytest but no pydantic, langgraph, nvtx, flash-linear-attention and no package index) into .whl/, for
# Python 3.12 x86-64. scripts/gpu_suite.sh installs them there with pip --target.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
# nvidia-cudnn-frontend 1.20 (FP8 attention baseline): the release for cuDNN 9.19, the device's; no
# required dependencies, and it binds to the libcudnn torch has loaded.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "pydantic>=2.6" "nvtx>=0.2.10" "langgraph>=1.2,<1.3" "langgraph-checkpoint-sqlite>=3.0" \
  "tenacity>=8.2" "pyyaml>=6" "fastapi>=0.115" "uvicorn>=0.30" \
  "fla-core==0.6.0" "einops>=0.8" \
  "nvidia-cudnn-frontend==1.20.0" 2>&1 | grep -v '^WARNING: Location' || true
# Already on the device image: keep its builds (numpy in particular is ABI-bound to torch).
for pkg in numpy certifi charset_normalizer idna requests urllib3 packaging anyio h11 httpcore httpx xxhash pyyaml; do
  rm -f .whl/${pkg}-[0-9]*.whl
done
du -sh .whl
