#!/usr/bin/env bash
# Here, not on the GPU machine: the wheels its image lacks, for its Python (3.12, manylinux x86_64), into .whl/
# (DESIGN §8), for benchmarks/device_setup.sh to install there.
#   bash benchmarks/device_wheels.sh [OUT]    # default .whl; needs this repository's venv (torch, for mamba-ssm's wheel)
# The requirements are pyproject.toml's (the package's and its gpu extra) with the CUDA tests' runners; what the
# image already has is left out. hydra-core's antlr4 runtime has no wheel on PyPI and mamba-ssm none at all: both
# are built here (mamba-ssm without its CUDA extension: the backend uses its Triton kernels only).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.whl}")
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
target=(--python-version 3.12 --implementation cp --only-binary=:all:)
for tag in 2014 _2_17 _2_24 _2_27 _2_28 _2_31 _2_34 _2_35; do target+=(--platform "manylinux${tag}_x86_64"); done
IMAGE_HAS="torch numpy scipy scikit-learn pandas pyarrow matplotlib safetensors tqdm pillow contourpy cycler fonttools
kiwisolver pyparsing python-dateutil six joblib threadpoolctl pytest pluggy iniconfig packaging typing-extensions jinja2
markupsafe pygments"

python - "$tmp/requirements.txt" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = project["dependencies"] + project["optional-dependencies"]["gpu"] + ["pytest-timeout", "pytest-xdist", "hypothesis"]
# hydra-core and omegaconf go on their own below: their antlr4 runtime is an sdist, which a cross-platform resolve refuses
skip = {"torch", "hydra-core", "omegaconf"}
keep = [r for r in wanted if re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() not in skip]
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
EOF
python -m pip install -q --dry-run --ignore-installed --target "$tmp/t" --report "$tmp/report.json" "${target[@]}" \
  -r "$tmp/requirements.txt"
python - "$tmp/report.json" "$tmp/pinned.txt" "$IMAGE_HAS" <<'EOF'
import json, sys
image = set(sys.argv[3].lower().replace("_", "-").split())
rows = [i["metadata"] for i in json.load(open(sys.argv[1]))["install"]]
pinned = [f"{m['name']}=={m['version']}" for m in rows if m["name"].lower().replace("_", "-") not in image]
open(sys.argv[2], "w").write("\n".join(pinned) + "\n")
print(f"{len(pinned)} of {len(rows)} resolved packages to carry")
EOF
python -m pip download -q --no-deps -d "$out" "${target[@]}" -r "$tmp/pinned.txt" hydra-core==1.3.2 omegaconf==2.3.0
python -m pip wheel -q --no-deps -w "$out" antlr4-python3-runtime==4.9.3
MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE python -m pip wheel -q --no-deps --no-build-isolation -w "$out" \
  mamba-ssm==2.3.2.post1
echo "$(ls "$out"/*.whl | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
