#!/usr/bin/env bash
# Bring Ray to the GPU machine (Python 3.12 x86-64, no package index, no ray, no jsonschema)
# for scripts/ray_gpu_sweep.sh. Run here, in a machine with pip access:
#   bash scripts/fetch_ray_wheels.sh
# It writes (all git-ignored through .git/info/exclude):
#   .whl/   ray's own needs that the device image lacks: jsonschema, jsonschema-specifications,
#           referencing, rpds-py (next to scripts/fetch_device_wheels.sh's wheels; run that first:
#           it empties .whl/). Ray's other needs (click, filelock, msgpack, packaging, protobuf,
#           pyyaml, requests, attrs, typing-extensions) are on the image.
#   .ray/   ray-2.60.0-cp312-min.tar.xz: the wheel's files without the Java jar and the
#           dashboard's web page (neither used by ray.init(include_dashboard=False) with
#           Python workers), xz-compressed to ~30 MiB: it travels in ONE device call with .whl.
#   .ray_a/ .ray_b/  the whole wheel split in two (split -b 40M) for two calls, if preferred:
#           ray.whl.part-aa and ray.whl.part-ab, and ray.whl.sha256 beside the first.
# The wheel is checked: its Requires-Dist (extras skipped) must be on the image or in .whl/.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION=2.60.0
WHEEL="ray-${RAY_VERSION}-cp312-cp312-manylinux2014_x86_64.whl"
DL="$(mktemp -d)"
trap 'rm -rf "$DL"' EXIT
for d in /.whl/ /.ray/ /.ray_a/ /.ray_b/; do
  grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
mkdir -p .whl

PIP_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
DEPS=(jsonschema jsonschema-specifications referencing rpds-py)
python3 -m pip download -q --no-deps "${PIP_PLATFORM[@]}" -d "$DL" "ray==${RAY_VERSION}" "${DEPS[@]}" 2>&1 \
  | grep -v '^WARNING: Location' || true
test -f "$DL/$WHEEL" || { echo "no $WHEEL downloaded" >&2; exit 1; }

# Every non-extra requirement of ray and of the deps we carry: on the image, or carried.
python3 - "$DL" <<'PYEOF'
import re, sys, zipfile
from pathlib import Path
# From the device's package list (/work/.library/device/KINDS.md, image 'cuda', 2026-11-17).
ON_IMAGE = {"click", "filelock", "msgpack", "packaging", "protobuf", "pyyaml", "requests", "attrs",
            "typing-extensions", "aiohttp", "grpcio", "frozenlist", "aiosignal", "idna", "multidict",
            "propcache", "yarl", "aiohappyeyeballs"}
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
DEVICE = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
dl = Path(sys.argv[1])
carried = {norm(p.name.split("-")[0]) for p in dl.glob("*.whl")}
missing = []
for whl in sorted(dl.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        reqs = [l.split(":", 1)[1].strip() for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist:")]
    for r in map(Requirement, reqs):
        if r.marker is not None and not r.marker.evaluate(DEVICE):  # extras, other Pythons
            continue
        name = norm(r.name)
        if name not in ON_IMAGE and name not in carried:
            missing.append(f"{whl.name}: {r}")
print("ray needs (besides the image):", ", ".join(sorted(carried - {"ray"})))
if missing:
    sys.exit("not on the image and not carried:\n  " + "\n  ".join(missing))
PYEOF

# Deps into .whl/, one version of each (pip --target stops on two).
for w in "$DL"/*.whl; do
  base="$(basename "$w")"
  [[ "$base" == ray-* ]] && continue
  rm -f ".whl/${base%%-*}-"[0-9]*.whl
  cp "$w" .whl/
done

# The whole wheel in two chunks (two calls) ...
rm -rf .ray_a .ray_b && mkdir -p .ray_a .ray_b
(cd "$DL" && sha256sum "$WHEEL") > .ray_a/ray.whl.sha256
split -b 40M "$DL/$WHEEL" "$DL/ray.whl.part-"
mv "$DL/ray.whl.part-aa" .ray_a/ && mv "$DL/ray.whl.part-ab" .ray_b/
test ! -e "$DL/ray.whl.part-ac" || { echo "the wheel needs more than two 40M chunks" >&2; exit 1; }
# ... and the stripped tree in one tarball (one call).
rm -rf .ray && mkdir -p .ray "$DL/tree"
python3 - "$DL/$WHEEL" "$DL/tree" <<'PYEOF'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:  # as pip does: keep the executable bits (gcs_server, raylet)
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        if (info.external_attr >> 16) & 0o111:
            os.chmod(path, 0o755)
PYEOF
(cd "$DL/tree" && rm -rf ray/jars ray/dashboard/client/build \
  && tar -cf - ray "ray-${RAY_VERSION}.dist-info" | xz -T0 -6 > "$OLDPWD/.ray/ray-${RAY_VERSION}-cp312-min.tar.xz")
(cd .ray && sha256sum "ray-${RAY_VERSION}-cp312-min.tar.xz" > "ray-${RAY_VERSION}-cp312-min.tar.xz.sha256")

mib() { du -sm "$@" | awk '{s+=$1} END {print s}'; }
whl=$(mib .whl); a=$(mib .ray_a); b=$(mib .ray_b); one=$(mib .ray)
echo ".whl ${whl} MiB; .ray_a ${a} MiB; .ray_b ${b} MiB; .ray ${one} MiB"
echo "one call:  carry .whl .ray        = $((whl + one)) MiB"
echo "two calls: carry .whl .ray_a      = $((whl + a)) MiB, then .ray_b = ${b} MiB"
for total in $((whl + one)) $((whl + a)) "$b"; do
  if [ "$total" -ge 60 ]; then echo "over 60 MiB with the repo: carry less" >&2; exit 1; fi
done
