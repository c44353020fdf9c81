// Each logits row's argmax, found on the device for a batch whose rows are read only for it
// (Batch::argmax_only: greedy decoding). The host then copies 8 bytes a row instead of the row,
// 128 KB at LLaMA-2's vocabulary of 32,000.
//
// One block per row. Each thread keeps the best of the values it loads, eight loads in flight
// at a time (a row of 32,000 is eight float4 a thread, one round trip to memory), then the block
// picks among its threads. The result is the host's (argmax_of in model/sampling.h): the largest
// value, NaNs never counting, and of equal values the lowest token.
#include <climits>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/kernels.h"

namespace pipeline::cuda {
namespace {

constexpr int kArgmaxThreads = 1024;
constexpr int kWarps = kArgmaxThreads / 32;
constexpr int kUnroll = 8;  // loads in flight a thread: a row of 32,000 floats is 8 float4 each

struct Candidate {
  float value;
  int32_t token;
};

// Of two candidates, the larger value, and of equal values the lower token.
__device__ __forceinline__ Candidate better(Candidate a, Candidate b) {
  return b.value > a.value || (b.value == a.value && b.token < a.token) ? b : a;
}

__device__ __forceinline__ Candidate warp_best(Candidate c) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Candidate other{__shfl_xor_sync(0xffffffffu, c.value, offset),
                          __shfl_xor_sync(0xffffffffu, c.token, offset)};
    c = better(c, other);
  }
  return c;
}

// kVec floats a load: 4 where every row starts on a float4 (vocab % 4 == 0), else 1. One block
// a multiprocessor is all a row needs: the bound lets ptxas give a thread the registers of all
// kUnroll loads (56 at kVec 4), where fitting two blocks it kept 32 and spread the loads out.
template <int kVec>
__global__ void __launch_bounds__(kArgmaxThreads, 1)
    argmax_kernel(const float* __restrict__ logits, int vocab, RowArgmax* __restrict__ out) {
  __shared__ Candidate warps[kWarps];
  wait_for_previous_kernel();  // the logits are the previous kernel's
  allow_next_kernel();
  const float* row = logits + size_t(blockIdx.x) * vocab;
  // No value yet: -inf at no token, which any value but -inf and NaN replaces. A row without a
  // finite maximum keeps a value that is not finite, and then its token does not matter.
  Candidate best{-INFINITY, INT_MAX};
  const int vectors = vocab / kVec;
  // kUnroll loads in flight, all issued before any is compared. Loads past the row read its last
  // vector again, a candidate already there, which changes nothing: no branch stands between
  // the loads. A thread's tokens rise from load to load, so `>` keeps the first of equal values.
  for (int first = threadIdx.x; first < vectors; first += kUnroll * kArgmaxThreads) {
    float x[kUnroll][kVec];
    int at[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      at[u] = min(first + u * kArgmaxThreads, vectors - 1);
      if constexpr (kVec == 4) {
        const float4 f = reinterpret_cast<const float4*>(row)[at[u]];
        x[u][0] = f.x, x[u][1] = f.y, x[u][2] = f.z, x[u][3] = f.w;
      } else {
        x[u][0] = row[at[u]];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        if (x[u][k] > best.value) best = {x[u][k], at[u] * kVec + k};
  }
  best = warp_best(best);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = warp_best(lane < kWarps ? warps[lane] : Candidate{-INFINITY, INT_MAX});
    if (lane == 0) {
      out[blockIdx.x].token = best.token;
      out[blockIdx.x].value = best.value;
    }
  }
}

}  // namespace

void logits_argmax(const float* logits, int rows, int vocab, RowArgmax* out, cudaStream_t stream) {
  if (rows == 0) return;
  if (vocab % 4 == 0) {
    launch_dependent(argmax_kernel<4>, rows, kArgmaxThreads, 0, stream, logits, vocab, out);
  } else {
    launch_dependent(argmax_kernel<1>, rows, kArgmaxThreads, 0, stream, logits, vocab, out);
  }
}

}  // namespace pipeline::cuda
