# Sourced on the GPU machine (bash, from the repository root): installs the carried wheels (.whl/,
# DESIGN §8) into /tmp/site, lays the package out as an install does (conf/ and workflows/ inside it)
# and puts its commands on PATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
ln -sfn ../conf perception/conf && ln -sfn ../workflows perception/workflows
mkdir -p /tmp/site/bin
while read -r name module; do
  printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "$module" > "/tmp/site/bin/$name" && chmod +x "/tmp/site/bin/$name"
done <<'COMMANDS'
perception-sweep perception.sweep.cli
perception-train perception.train.cli
perception-data perception.train.data_cli
perception-gate perception.gate.cli
COMMANDS
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
perception-train --help >/dev/null || { echo "perception-train does not start"; return 1; }
