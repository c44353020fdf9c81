#!/usr/bin/env bash
# The CUDA backend's check on a GPU machine, in under 10 minutes on one H200 with 16 cores: build
# (Release, sm_90 only, just the targets needed), run the CUDA tests (the kernels alone, then the
# runner, then the runner with each decode attention kernel and each SkinnyGemm kernel), run them
# again under compute-sanitizer (memcheck; racecheck for the kernels alone), write a random
# llama2-7b checkpoint, run the decode benchmark on it, serve it with `pipeline run` and measure
# that with `pipeline bench-serve`, and print a short table last. A pipelined kernel that fails
# the runner's tests where the direct one passes is left out of the benchmarks. The result files
# (JSON) go to $OUT (or /tmp/gpu_check), the logs to $LOGS_DIR (/tmp/gpu_check_logs), archived
# into $OUT/logs.tar.gz after every stage: the device tool brings back at most eight files from
# $OUT, and a run cut off at its time limit still brings back the logs of the stages it finished.
#
#   scripts/gpu_check.sh            run the check
#   scripts/gpu_check.sh --prepare  (on a machine with network, nvcc and ../shared) fill
#                                   build-gpu-deps/ for a GPU machine without network or
#                                   ../shared: the Debian packages the build needs, the test
#                                   data the CUDA tests read, and the five executables of
#                                   TARGETS built here for sm_90 (bin/, stamped with a hash of
#                                   the sources), which the check uses when they run there and
#                                   come from the same sources, and otherwise builds its own.
#                                   build-gpu-deps/ goes inside the checkout, at its root.
# Through the session tools: run(command="BUDGET_S=420 scripts/gpu_check.sh",
# carry=["build-gpu-deps"], timeout_s=480); build-gpu-deps/ is git-ignored (/build*/), so it
# travels only when carried. BUDGET_S is the whole check's seconds (570 when unset).
set -uo pipefail
cd "$(dirname "$0")/.."

DEPS_DIR=build-gpu-deps
# What the executables are built from (the C++ and CUDA sources and the build file): prebuilt
# ones are used only when this matches.
sources_hash() {
  find CMakeLists.txt apps bench graph io kernels model server stages tests -type f \
    \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name CMakeLists.txt \) \
    -not -path 'tests/node/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}
DEPS_PREFIX=/opt/pipeline-deps
TARGETS=(test_cuda_kernels test_cuda_runner bench_cuda_kernels bench_cuda_decode pipeline)
DEPS_PACKAGES=(
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libhwloc15 libconcurrentqueue-dev
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 libssl-dev zlib1g-dev
  libyaml-cpp-dev libyaml-cpp0.7 libsentencepiece-dev libsentencepiece0 nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian pkgconf pkgconf-bin libpkgconf3
)
if [[ ${1:-} == --prepare ]]; then
  mkdir -p "$DEPS_DIR/shared/models" || exit 1
  (cd "$DEPS_DIR" && apt-get download "${DEPS_PACKAGES[@]}") || exit 1
  cp -r ../shared/golden "$DEPS_DIR/shared/" || exit 1
  cp -r ../shared/models/stories260K ../shared/models/random-h128-bf16 "$DEPS_DIR/shared/models/" \
    || exit 1
  cmake -S . -B build-gpubin -DCMAKE_BUILD_TYPE=Release -DPIPELINE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null && \
    cmake --build build-gpubin --target "${TARGETS[@]}" -j"$(nproc)" || exit 1
  mkdir -p "$DEPS_DIR/bin" && for t in "${TARGETS[@]}"; do
    strip -o "$DEPS_DIR/bin/$t" "build-gpubin/$t" || exit 1
  done
  sources_hash > "$DEPS_DIR/bin/SOURCES"
  du -sh "$DEPS_DIR"
  exit 0
fi

OUT=${OUT:-/tmp/gpu_check}
LOGS=${LOGS_DIR:-/tmp/gpu_check_logs}
MODEL_DIR=${MODEL_DIR:-/tmp/llama2-7b-bf16}
rm -rf -- "$LOGS"  # a warm machine keeps /tmp: no earlier run's logs in this run's archive
mkdir -p "$OUT" "$LOGS"
# Written beside and then moved over the last one, so a kill during tar keeps the last whole one.
archive_logs() {
  tar czf "$OUT/logs.partial.tar.gz" -C "$LOGS" . 2>/dev/null \
    && mv -f "$OUT/logs.partial.tar.gz" "$OUT/logs.tar.gz"
}
trap archive_logs EXIT  # also after an early exit; a kill at the time limit keeps the last stage's
declare -a SUMMARY=()
note() { SUMMARY+=("$(printf '%-28s %s' "$1" "$2")"); echo "== $1: $2"; }
seconds_since() { echo $(($(date +%s) - $1)); }
START=$(date +%s)
BUDGET=${BUDGET_S:-570}  # the whole check, leaving headroom under the 10-minute limit
# Seconds left for a stage, capped at $1, at least 1 (timeout 0 would mean no limit).
left() {
  local l=$((BUDGET - $(seconds_since "$START")))
  l=$((l < $1 ? l : $1))
  echo $((l > 0 ? l : 1))
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"

# ---- Test data: ../shared beside the checkout, else the copy --prepare carried.
SHARED=$PWD/../shared
if [[ ! -d $SHARED && -d $DEPS_DIR/shared ]]; then
  SHARED=$PWD/$DEPS_DIR/shared
  note "test data" "$DEPS_DIR/shared"
fi

# ---- Dependencies: installed, or carried as .deb files and unpacked into a private prefix.
if ! dpkg -s libtbb-dev libyaml-cpp-dev libsentencepiece-dev libcpp-httplib-dev libgtest-dev \
       libbenchmark-dev nlohmann-json3-dev libconcurrentqueue-dev >/dev/null 2>&1; then
  if compgen -G "$DEPS_DIR/*.deb" >/dev/null; then
    for deb in "$DEPS_DIR"/*.deb; do dpkg -x "$deb" "$DEPS_PREFIX"; done
    lib="$DEPS_PREFIX/usr/lib/x86_64-linux-gnu"
    export CMAKE_PREFIX_PATH="$DEPS_PREFIX/usr"
    export PKG_CONFIG="$DEPS_PREFIX/usr/bin/pkgconf"
    export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$DEPS_PREFIX/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$DEPS_PREFIX"
    export CPATH="$DEPS_PREFIX/usr/include:$DEPS_PREFIX/usr/include/x86_64-linux-gnu"
    export LIBRARY_PATH="$lib"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$DEPS_PREFIX/usr/bin:$PATH"
    note deps "unpacked $(ls "$DEPS_DIR"/*.deb | wc -l) carried packages into $DEPS_PREFIX"
  else
    scripts/install_deps.sh > "$LOGS/install_deps.log" 2>&1 \
      && note deps "installed with scripts/install_deps.sh" \
      || { note deps "MISSING (no network? run scripts/gpu_check.sh --prepare elsewhere and carry $DEPS_DIR)"; exit 1; }
  fi
else
  note deps "already installed"
fi

# ---- Executables: the ones --prepare built from these very sources, when they run here;
# otherwise a build of one CUDA architecture (the device's) and only the targets this check
# runs. The tests read the test data and the `pipeline` command from the paths given below, not
# from the tree that built them.
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=$DEPS_DIR/bin
if [[ ! -x $BIN/test_cuda_runner ]]; then
  rebuild_why="none prebuilt"
elif [[ $(cat "$BIN/SOURCES" 2>/dev/null) != "$(sources_hash)" ]]; then
  rebuild_why="the prebuilt ones come from other sources than these"
elif ! "$BIN/test_cuda_runner" --gtest_list_tests >/dev/null 2>"$LOGS/prebuilt.log"; then
  rebuild_why="the prebuilt ones do not run here: $(head -1 "$LOGS/prebuilt.log")"
else
  rebuild_why=
fi
if [[ -z $rebuild_why ]]; then
  note executables "prebuilt by --prepare (sm_90) from sources $(cat "$BIN/SOURCES")"
else
  note executables "building: $rebuild_why"
  BIN=build-gpu
  t=$(date +%s)
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  # Warnings stay warnings: this machine's compiler may warn where CI's does not.
  cmake -S . -B "$BIN" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DPIPELINE_CUDA=ON \
    -DPIPELINE_WERROR=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    > "$LOGS/configure.log" 2>&1 \
    || { note configure "FAILED (see configure.log)"; tail -30 "$LOGS/configure.log"; exit 1; }
  cmake --build "$BIN" --target "${TARGETS[@]}" -j16 > "$LOGS/build.log" 2>&1 \
    || { note build "FAILED"; grep -m20 -E "error" "$LOGS/build.log"; exit 1; }
  note build "$(seconds_since "$t") s (-j16, sm_90)"
fi
export PIPELINE_SHARED_DIR="$SHARED" PIPELINE_BINARY="$PWD/$BIN/pipeline" PIPELINE_SOURCE_DIR="$PWD"
archive_logs

# ---- A random llama2-7b checkpoint in bf16 for the benchmarks, written on the CPU while the
# tests use the GPU.
t_model=$(date +%s)
model_pid=
if [[ ! -f $MODEL_DIR/config.json ]]; then
  timeout "$(left 240)" "$BIN/pipeline" make-model --shape llama2-7b --dtype bf16 --out "$MODEL_DIR" \
    --corpus "$PWD/data/tokenizer_corpus.txt" > "$LOGS/make_model.log" 2>&1 &
  model_pid=$!
fi

# ---- Tests: each kernel alone (which one is wrong, when something is), then the runner; then
# the sanitizers over the kernels and the prefill/decode/graph paths.
for test in test_cuda_kernels test_cuda_runner; do
  t=$(date +%s)
  timeout "$(left 150)" "$BIN/$test" > "$LOGS/$test.log" 2>&1
  status=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |relative L2|^\[  FAILED" "$LOGS/$test.log"
  note "$test" "exit $status, $(grep -c '^\[       OK' "$LOGS/$test.log") passed, $(grep -c '^\[  FAILED  \] .* ms)$' "$LOGS/$test.log") failed, $(seconds_since "$t") s"
  if [[ $status -ne 0 ]]; then
    grep -m60 -B2 -A8 -E "Failure|error" "$LOGS/$test.log"
    # The failed tests again with programmatic dependent launch off: passing then points at the
    # overlap of kernels (a read before its wait), failing again at a kernel's own arithmetic.
    failed=$(grep -E '^\[  FAILED  \] .* ms\)$' "$LOGS/$test.log" | awk '{print $4}' | paste -sd:)
    if [[ -n $failed ]]; then
      PIPELINE_CUDA_PDL=0 timeout "$(left 60)" "$BIN/$test" --gtest_filter="$failed" \
        > "$LOGS/$test.pdl_off.log" 2>&1
      note "$test, PDL off" "exit $?, $(grep -c '^\[       OK' "$LOGS/$test.pdl_off.log") of the failed passed"
    fi
  fi
  archive_logs
done

declare -a FALLBACK=()  # the kernel choices the benchmarks and serving run with
# The runner's tests again with each decode attention kernel set, then with each SkinnyGemm
# kernel set, whichever the warm-up timed faster above: each must match the CPU runner, the
# golden tokens and solo runs. $1: the variable, $2: its value, $3: the summary's name, $4: the
# gtest filter.
run_runner_tests_with() {
  local t=$(date +%s) log="$LOGS/test_cuda_runner.$1.$2.log"
  env "${FALLBACK[@]}" "$1=$2" timeout "$(left 60)" "$BIN/test_cuda_runner" --gtest_filter="$4" \
    > "$log" 2>&1
  local status=$?
  note "test_cuda_runner, $3" "exit $status, $(grep -c '^\[       OK' "$log") passed, $(grep -c '^\[  FAILED  \] .* ms)$' "$log") failed, $(seconds_since "$t") s"
  [[ $status -ne 0 ]] && grep -m30 -B2 -A8 -E "Failure|error" "$log"
  archive_logs
  return $status
}
# Both kernels of $1 (the summary's names prefixed with $2) through the tests of filter $3. A
# pipelined kernel that fails where the direct one passes is left out of everything after
# (FALLBACK; returns 1): the warm-up would otherwise time it, and a fault there loses the
# context and every figure after it. The sanitizers still run it, to say where it goes wrong.
test_each_kernel() {
  local -A status=()
  local kernel
  for kernel in direct pipelined; do
    run_runner_tests_with "$1" $kernel "$2$kernel" "$3"
    status[$kernel]=$?
  done
  ((status[direct] == 0 && status[pipelined] != 0)) || return 0
  FALLBACK+=("$1=direct")
  return 1
}
BENCH_KERNELS_FILTER=.
test_each_kernel PIPELINE_CUDA_DECODE_ATTENTION "" '-*Projections*:*CublasLt*' \
  || BENCH_KERNELS_FILTER=-pipelined:1
test_each_kernel PIPELINE_CUDA_SKINNY_GEMM "SkinnyGemm " '*'
if ((${#FALLBACK[@]})); then
  note "benchmarks and serving" "with ${FALLBACK[*]} (pipelined failed where direct passed)"
fi

sanitizer=/usr/local/cuda/bin/compute-sanitizer
[[ -x $sanitizer ]] || sanitizer=$(command -v compute-sanitizer || true)
# 240 s stay for the three benchmarks (each also capped by left()), so that a run with
# BUDGET_S=420 still has two minutes for the sanitizers.
sanitizer_s=$(($(left 9999) - 240))
((sanitizer_s > 180)) && sanitizer_s=180
# $1: tool, $2: seconds at most, $3: test executable, $4: gtest filter.
sanitize() {
  local log="$LOGS/$1_$3.log" t=$(date +%s)
  timeout "$2" "$sanitizer" --tool "$1" --error-exitcode 99 "$BIN/$3" --gtest_filter="$4" \
    > "$log" 2>&1
  local status=$?
  note "$1 $3" "exit $status, $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" || echo 'no summary'), $(seconds_since "$t") s"
  [[ $status -ne 0 ]] && grep -m40 -E "Invalid|ERROR|Race|hazard|at 0x|by thread|FAILED" "$log"
  archive_logs
}
if [[ -z $sanitizer ]]; then
  note sanitizers "compute-sanitizer not found"
elif ((sanitizer_s < 30)); then
  note sanitizers "skipped: the benchmarks need the $(left 9999) s left"
else
  # Not the test whose allocation fails on purpose: memcheck reports every failed API call.
  sanitize memcheck $((sanitizer_s / 6)) test_cuda_kernels '*:-*At7BShapes*:*AFailedAllocation*'
  sanitize racecheck $((sanitizer_s / 6)) test_cuda_kernels '*Attention*:*SkinnyGemmPlans*:-*AtOtherBlockSizes*'
  sanitize memcheck $((sanitizer_s * 2 / 3)) test_cuda_runner \
    'CudaRunner.ChunkedPrefillAndDecodeMatchOneShotPrefill:CudaRunner.GreedyTokensMatchStories260KGolden:CudaRunner.BatchOfEightMatchesSolo:CudaRunner.ProjectionsMatchFloat64Reference:CudaRunner.CublasLtProposalsMatchFloat64Reference'
fi

# ---- The decode step's parts alone on llama2-7b's shapes (no checkpoint needed), then the
# whole step on the checkpoint.
t=$(date +%s)
env "${FALLBACK[@]}" timeout "$(left 90)" "$BIN/bench_cuda_kernels" \
  --benchmark_filter="$BENCH_KERNELS_FILTER" --benchmark_out="$OUT/kernels.json" \
  --benchmark_out_format=json > "$LOGS/kernels.log" 2>&1
note bench_cuda_kernels "exit $?, $(seconds_since "$t") s"
archive_logs

if [[ -n $model_pid ]]; then
  wait "$model_pid" || { note make-model "FAILED"; tail -20 "$LOGS/make_model.log"; }
  note make-model "$(du -sh "$MODEL_DIR" 2>/dev/null | cut -f1), done $(seconds_since "$t_model") s after its start"
fi

t=$(date +%s)
env "${FALLBACK[@]}" PIPELINE_BENCH_MODEL="$MODEL_DIR" \
  timeout "$(left 300)" "$BIN/bench_cuda_decode" \
  --benchmark_out="$OUT/bench.json" --benchmark_out_format=json > "$LOGS/bench.log" 2>&1
note bench_cuda_decode "exit $?, $(seconds_since "$t") s (model load and 64 x 1024-token prefill included)"
cat "$LOGS/bench.log"
archive_logs

# ---- Serving: `pipeline run` on the same checkpoint (16 sequences at once, the prompts of one
# batch window prefilled together), measured by `pipeline bench-serve`: 16 streams of exactly
# 1024 tokens (ignore_eos) from 32-token prompts, all sent together. At most 120 s in all.
t=$(date +%s)
serve_s=$(left 120)
cat > "$LOGS/serve.yaml" <<EOF
model:
  path: $MODEL_DIR
device: cuda
server:
  host: 127.0.0.1
  port: 0
  shutdown_grace_s: 5
scheduler:
  max_num_seqs: 16
  max_batch: 16
  window_ms: 200
EOF
env "${FALLBACK[@]}" "$BIN/pipeline" run "$LOGS/serve.yaml" > "$LOGS/serve.log" 2>&1 &
server_pid=$!
url=
while [[ -z $url ]] && (($(seconds_since "$t") < serve_s)) && kill -0 "$server_pid" 2>/dev/null; do
  sleep 1
  url=$(grep -m1 -o 'listening on http://[^ ]*' "$LOGS/serve.log" | cut -d' ' -f3)
done
if [[ -n $url ]]; then
  note "serve start" "$(seconds_since "$t") s (model load, KV pool)"
  serve_left=$((serve_s - $(seconds_since "$t")))
  timeout $((serve_left > 0 ? serve_left : 1)) "$BIN/pipeline" bench-serve --url "$url" \
    --requests 16 --max-tokens 1024 --prompt-tokens 32 --json \
    > "$OUT/bench_serve.json" 2> "$LOGS/bench_serve.log"
  note bench-serve "exit $?, $(seconds_since "$t") s with the server start"
  cat "$LOGS/bench_serve.log"
  # The server's own view: time in each flow-graph node, to set against the step rate.
  python3 -c "import sys, urllib.request; open(sys.argv[2], 'w').write(
urllib.request.urlopen(sys.argv[1] + '/metrics', timeout=10).read().decode())" "$url" "$OUT/metrics.txt"
else
  note bench-serve "skipped: pipeline run did not listen within $(seconds_since "$t") s"
  tail -20 "$LOGS/serve.log"
fi
kill -TERM "$server_pid" 2>/dev/null
for _ in {1..10}; do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
kill -KILL "$server_pid" 2>/dev/null
wait "$server_pid" 2>/dev/null

# ---- Where a step's time goes: Nsight Compute times each kernel of one replayed decode step
# at batch 1, 16 and 64 on its own (bench_cuda_decode brackets that step for the profiler), so
# the sum beside the step's time says how much is kernels and how much the gaps between them.
# Last and optional: it needs what the budget leaves. ncu slows every launch, so the runner's
# tuning there may send some projections another way than in the benchmark above: the
# kernel names say which ran.
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -z $ncu ]]; then
  note ncu "not found"
elif (($(left 9999) < 60)); then
  note ncu "skipped: $(left 9999) s left"
else
  t=$(date +%s)
  env "${FALLBACK[@]}" PIPELINE_BENCH_MODEL="$MODEL_DIR" timeout "$(left 150)" "$ncu" \
    --profile-from-start off \
    --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --print-units base --csv --log-file "$OUT/ncu.csv" \
    "$BIN/bench_cuda_decode" --benchmark_filter='BM_CudaDecode/' --benchmark_min_time=0.01 \
    > "$LOGS/ncu_bench.log" 2>&1
  note ncu "exit $?, $(seconds_since "$t") s"
fi

echo
echo "==== gpu_check summary ($(seconds_since "$START") s; results in $OUT, logs in $LOGS)"
printf '%s\n' "${SUMMARY[@]}"
# The two benchmark tables: the decode step's parts, then the whole step.
python3 - "$OUT/kernels.json" "$OUT/bench.json" <<'PY'
import json, os, sys
tables = [
    (sys.argv[1], "7b parts (rows/seqs)", [("us", "real_time", 8, 1), ("GB/s", "GB/s", 7, 0),
                                           ("floor", "bw_floor", 6, 2), ("TFLOP/s", "TFLOP/s", 8, 1)]),
    (sys.argv[2], "decode 7b bf16, ctx 1024 (serving: 33-1055)",
     [("ms/step", "real_time", 9, 2), ("tok/s", "tok/s", 9, 0), ("floor", "floor", 7, 2)]),
]
for path, title, columns in tables:
    if not os.path.exists(path):
        continue
    print(f"{title:80}" + "".join(f" {name:>{width}}" for name, _, width, _ in columns))
    for r in json.load(open(path))["benchmarks"]:
        name = r["name"].split("/iterations")[0]
        if r.get("error_occurred"):
            print(f"{name:80} skipped: {r.get('error_message')}")
            continue
        # A benchmark that times many steps per iteration (the serving-shaped one) says how many.
        r["real_time"] /= r.get("steps", 1)
        # The decode attention's partition lengths: * marks the one the runner takes.
        name += " *" if r.get("chosen") == 1 else ""
        # A tuned projection's label starts with the route its calls take.
        name += " -> " + r["label"].split(" | ")[0] if " | " in r.get("label", "") else ""
        print(f"{name:80}" + "".join(f" {r.get(key, 0):{width}.{digits}f}"
                                     for _, key, width, digits in columns))
PY
if [[ -s $OUT/ncu.csv ]]; then
  python3 - "$OUT/ncu.csv" <<'PY'
import csv, re, sys
from collections import defaultdict
def kernel_name(signature):
    # The name and template arguments, without the parameter list (the first "(" outside <>).
    name, depth = signature.replace("(anonymous namespace)::", ""), 0
    for i, c in enumerate(name):
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            name = name[:i]
            break
    return re.sub(r"^void ", "", name).replace("pipeline::cuda::", "")
# One step per embedding kernel (each forward pass starts with it): batch 1, 16, 64 in order.
steps = []
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = kernel_name(row["Kernel Name"])
    if "embedding_kernel" in name or not steps:
        steps.append(defaultdict(lambda: [0, 0.0]))
    entry = steps[-1][name[:72]]
    entry[0] += 1
    entry[1] += float(row["Metric Value"].replace(",", "")) * 1e-3  # ns -> us
for batch, step in zip((1, 16, 64), steps):
    total = sum(us for _, us in step.values())
    print(f"ncu, batch {batch}: {sum(n for n, _ in step.values())} kernels, {total / 1e3:.2f} ms "
          "timed one by one")
    for name, (n, us) in sorted(step.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:72} {n:4d} x {us / n:8.1f} us = {us / 1e3:6.2f} ms")
PY
fi
# Which route the runner's warm-up found fastest for each projection and row count: SkinnyGemm,
# cuBLAS's own choice or one of cuBLASLt's proposals.
grep -h "engine: cuda:" "$LOGS/serve.log" 2>/dev/null | sed 's/^\[[^]]*\] engine: cuda: /tuned: /'
if [[ -s $OUT/metrics.txt ]]; then
  python3 - "$OUT/metrics.txt" <<'PY'
import re, sys
sums, counts = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r'pipeline_(stage|forward)_seconds_(sum|count)\{(?:stage|phase)="([^"]+)"\} (\S+)',
                 line)
    if m:
        (sums if m[2] == "sum" else counts)[(m[1], m[3])] = float(m[4])
    m = re.match(r'pipeline_decode_turnaround_seconds_(sum|count) (\S+)', line)
    if m:
        (sums if m[1] == "sum" else counts)[("turnaround", "decode")] = float(m[2])
def mean_ms(key):
    return f"{counts[key]:.0f} x {1e3 * sums[key] / counts[key]:.2f} ms" if counts.get(key) else "none"
print("serve, per node: " + ", ".join(
    f"{node} {mean_ms((kind, node))}" for kind, node in sums if kind == "stage"))
# The decode node's time less its forward passes is the host's share: sampling and bookkeeping.
print("serve, forward passes: prefill " + mean_ms(("forward", "prefill")) + ", decode " +
      mean_ms(("forward", "decode")) + "; the host between decode passes " +
      mean_ms(("turnaround", "decode")))
PY
fi
if [[ -s $OUT/bench_serve.json ]]; then
  python3 - "$OUT/bench_serve.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
floor = 3850  # tok/s: the issue's floor for 16 streams of llama2-7b served on one H200
tok_s = r["output_tokens_per_s"]
print(f"serve llama2-7b bf16: {r['requests']} x {r['max_tokens']} tokens, concurrency "
      f"{r['concurrency']}: {tok_s:.0f} tok/s = {tok_s / floor:.2f} of the {floor} tok/s floor; "
      f"TTFT median {r['ttft_ms']['median']:.0f} ms, ITL median/p99 "
      f"{r['itl_ms']['median']:.2f}/{r['itl_ms']['p99']:.2f} ms")
PY
fi
exit 0
