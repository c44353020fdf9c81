#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test (the shared test data must be at
# ../shared). GPU tests say "no CUDA device" and skip where none exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j2
