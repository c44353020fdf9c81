#!/usr/bin/env bash
# Installs the build and test dependencies from Debian's packages.
# The CUDA toolkit is optional and expected under /usr/local/cuda when present.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libtbb-dev libconcurrentqueue-dev libcpp-httplib-dev libyaml-cpp-dev
  libsentencepiece-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev
  curl
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# The OpenAI client test runs the official npm package: Debian's Node.js where none is installed.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# The benchmark scripts (scripts/bench_*.sh) compute their tables with Python.
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
