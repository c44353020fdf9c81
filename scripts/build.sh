#!/usr/bin/env bash
# Configures and builds llm-pipeline into build/ (Release; the CUDA backend when nvcc exists).
# Extra arguments go to CMake's configure step, e.g. -DPIPELINE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
# Ninja, unless CMAKE_GENERATOR names another; a build folder keeps the generator it was made with.
export CMAKE_GENERATOR=${CMAKE_GENERATOR:-Ninja}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
