#!/usr/bin/env bash
# The CPU benchmarks of bench/README.md, start to finish: builds them into build/, writes the two
# random-weight bf16 checkpoints they run on into build/bench-models/ (once), runs the kernel
# and forward-pass benchmarks with 2 threads (3 repetitions, medians) and prints the tables.
# Extra arguments go to CMake's configure step, e.g. -DPIPELINE_CUDA=OFF.
#
# Environment: BUILD_DIR (default build), PIPELINE_BENCH_MODELS (default $BUILD_DIR/bench-models),
# PIPELINE_BENCH_THREADS (default 2). Results: $BUILD_DIR/bench-results/{kernels,forward}.json.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
export PIPELINE_BENCH_MODELS=${PIPELINE_BENCH_MODELS:-$build/bench-models}
export PIPELINE_BENCH_THREADS=${PIPELINE_BENCH_THREADS:-2}
results=$build/bench-results

export CMAKE_GENERATOR=${CMAKE_GENERATOR:-Ninja}  # as scripts/build.sh, which shares build/
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPIPELINE_BENCH=ON "$@"
cmake --build "$build" --target pipeline bench_cpu_kernels bench_cpu_forward -j"$(nproc)"

for shape in llama2-110m tinyllama-1.1b; do
  if [[ ! -f $PIPELINE_BENCH_MODELS/$shape/model.safetensors ]]; then
    "$build/pipeline" make-model --shape "$shape" --dtype bf16 --out "$PIPELINE_BENCH_MODELS/$shape"
  fi
done

mkdir -p "$results"
repeat=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out_format=json)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bench_cpu_kernels" "${repeat[@]}" --benchmark_out="$results/kernels.json"
"$build/bench_cpu_forward" "${repeat[@]}" --benchmark_out="$results/forward.json"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Markdown tables of the medians, as bench/README.md quotes them.
python3 - "$results/kernels.json" "$results/forward.json" <<'PY'
import json, sys

def medians(path):
    report = json.load(open(path))
    rows = [b for b in report["benchmarks"] if b.get("aggregate_name") == "median"]
    return report["context"], rows

def name(row):
    return row["run_name"].removesuffix("/real_time")

def ms(row, clock="real_time"):
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[row["time_unit"]]
    return row[clock] * scale

kernels_context, kernels = medians(sys.argv[1])
forward_context, forward = medians(sys.argv[2])
for label, context in (("kernels", kernels_context), ("forward", forward_context)):
    print(f"\n{label}: {context['num_cpus']} CPUs, {context['threads']} threads, "
          f"first probe: read {context['read_GB/s']} GB/s, FMA {context['fma_GFLOP/s']} GFLOP/s, "
          f"load average {', '.join(f'{x:.1f}' for x in context.get('load_avg', []))}")

# "cpu ms" is the main thread's CPU time: well below "ms" means the threads waited for a core.
print("\n| benchmark | ms | cpu ms | tok/s | weights MB | KV MB | bw_floor | flop_floor | probe GB/s | probe GFLOP/s | peak mem GB | mem_budget |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for row in forward:
    kv = f"{row['kv_MB']:.0f}" if "kv_MB" in row else ""
    bw = f"{row['bw_floor']:.2f}" if "bw_floor" in row else ""
    probe = f"{row['probe_GB/s']:.1f}" if "probe_GB/s" in row else ""
    print(f"| {name(row)} | {ms(row):.1f} | {ms(row, 'cpu_time'):.1f} | {row['tok/s']:.1f} | {row['weight_MB']:.0f} | {kv} | "
          f"{bw} | {row['flop_floor']:.2f} | {probe} | {row['probe_GFLOP/s']:.0f} | "
          f"{row['peak_mem_GB']:.2f} | {row['mem_budget']:.2f} |")

print("\n| kernel | us | cpu us | GB/s | GFLOP/s | bw_floor | flop_floor | probe GB/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for row in kernels:
    print(f"| {name(row)} | {ms(row) * 1e3:.0f} | {ms(row, 'cpu_time') * 1e3:.0f} | {row['GB/s']:.2f} | {row['GFLOP/s']:.1f} | "
          f"{row['bw_floor']:.2f} | {row['flop_floor']:.3f} | {row['probe_GB/s']:.1f} |")
PY
