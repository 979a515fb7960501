#!/usr/bin/env bash
# One sha256 over the files the GPU suite runs (code, kernels, manifests, task data, tests, scripts), so that
# device calls can be shown to have run the same tree: scripts/gpu_suite.sh prints it into suite.log, and
# here it gives the same value for the same commit's files (the device gets a copy of the tree without .git).
# Links are followed (tasks share kernels by symbolic link): a copy that made them files reads the same.
#   bash scripts/tree_fingerprint.sh        # -> "tree <sha256> (<n> files)"
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(find -L agent tasks tools knowledge tests scripts pyproject.toml -type f \
  \( -name '*.py' -o -name '*.cu' -o -name '*.ptx' -o -name '*.json' -o -name '*.md' -o -name '*.sh' \
     -o -name '*.toml' \) -not -path '*/__pycache__/*' | LC_ALL=C sort)
sum=$(printf '%s\n' "$files" | while IFS= read -r f; do printf '%s  %s\n' "$(sha256sum < "$f" | cut -c1-64)" "$f"; done \
  | sha256sum | cut -c1-16)
echo "tree $sum ($(printf '%s\n' "$files" | wc -l) files)"
