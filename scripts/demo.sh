#!/usr/bin/env bash
# Installs the dependencies, builds, writes the built-in demo model (random weights, no
# download) and serves it on http://127.0.0.1:2000 with configs/demo.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
[ -f build/demo-model/model.safetensors ] ||
  build/pipeline make-model --shape tiny --out build/demo-model
exec build/pipeline run configs/demo.yaml "$@"
