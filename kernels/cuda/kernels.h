// Launchers of the CUDA backend's own kernels (everything that is not a GEMM). Every launcher
// enqueues on `stream` and checks the launch; none synchronises, so all of them can be captured
// into a CUDA graph. Activations are bf16; norms, softmax and rotary angles compute in float32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/dtype.h"
#include "kernels/cuda/device_buffer.h"
#include "model/row_argmax.h"

namespace pipeline::cuda {

using bf16 = __nv_bfloat16;

// ---- elementwise_kernels.cu

// The widest residual row the norm kernels hold in registers.
constexpr int kMaxHiddenSize = 16384;

// Whether the norm and embedding kernels handle rows of `hidden` values (a multiple of 4 up to
// kMaxHiddenSize); false with the reason otherwise.
bool hidden_size_supported(int hidden, std::string* why);

// dst[i] = bf16(src[i]) for n elements of a checkpoint tensor already copied to the device.
void convert_to_bf16(const void* src, DType src_dtype, bf16* dst, size_t n, cudaStream_t stream);

// residual[t, :] = embed[tokens[t], :] as float32, for each of num_tokens tokens.
void embedding_gather(const bf16* embed, const int32_t* tokens, int num_tokens, int hidden,
                      float* residual, cudaStream_t stream);

// The residual stream stays float32 between layers. For each output row r, with input row
// i = rows ? rows[r] : r: residual[i] += delta[i] (skipped when delta is null), then
// out[r] = bf16(rmsnorm(residual[i]) * weight).
void add_rmsnorm(float* residual, const bf16* delta, const bf16* weight, const int32_t* rows,
                 int num_rows, int hidden, float eps, bf16* out, cudaStream_t stream);

// Rotary embedding (rotate-half, each token at positions[t]) on q in place and on k, then
// writes k and v into the paged cache at slots[t] (slot = block * block_size + offset). For
// prefill: the decode attention does this for its own new tokens (DecodeNewTokens).
// qkv rows are [q heads | k heads | v heads]; a cache slot is [kv_head][head_dim].
void rope_write_kv(bf16* qkv, int num_tokens, const int32_t* positions, const int32_t* slots,
                   int num_heads, int num_kv_heads, int head_dim, float rope_theta, bf16* k_cache,
                   bf16* v_cache, cudaStream_t stream);

// out[t, j] = silu(gate_up[t, 2j]) * gate_up[t, 2j + 1]: gate and up interleaved, as the
// device weights stack their rows (device_weights.h).
void silu_mul(const bf16* gate_up, int num_tokens, int inter, bf16* out, cudaStream_t stream);

// ---- attention (attention_decode.cu, attention_prefill.cu)

// One layer's paged KV cache: [block][slot][kv_head][head_dim] for K and for V, and the block
// tables of the batch's sequences, row s at block_tables + s * max_blocks_per_seq.
struct PagedKv {
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  const int32_t* block_tables = nullptr;
  int max_blocks_per_seq = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Query heads per KV head and head sizes the attention kernels handle; false with the reason
// when a model is outside them.
bool attention_supports(int num_heads, int num_kv_heads, int head_dim, std::string* why);

// Decode keys are split into partitions (flash-decoding) of 64, 128 or 256 positions, one
// block each per KV head: the longest that still gives the device enough blocks. Longer ones
// weigh a block's fixed work (its block table, the rotary angles, q, its share of the merge)
// over more positions; shorter ones cut the chain of K/V round trips each block waits through
// when the grid is small. On an H200 with 1024-token contexts (llama2-7b's heads), one layer
// took 81.9 us in 256-position partitions against 86.4 in 128 at 16 sequences, 286.5 against
// 312.3 at 64, and at one sequence, whose 128 blocks of 256 positions leave the device short of
// work, 11.4 in 64-position partitions against 12.7 in 128 and 18.2 in 256. A sequence of n
// positions uses ceil(n / partition) partitions.
constexpr int kShortDecodePartition = 64;
constexpr int kDecodePartition = 128;
constexpr int kLongDecodePartition = 256;

// The partition a decode step uses: the longest whose grid (sequences x KV heads x partitions
// of the longest context) gives each of the device's multiprocessors kDecodeBlocksPerSm
// blocks, or else the short one where a scratch of max_splits partitions holds its splits
// (a scratch sized for kDecodePartition holds them for the first half of the positions), or
// else kDecodePartition.
constexpr int kDecodeBlocksPerSm = 4;
int decode_partition(int num_seqs, int num_kv_heads, int max_context, int multiprocessors,
                     int max_splits);

// The flash-decoding split's float32 partials and, per (sequence, KV head), the count of its
// partitions that have finished, for up to `seqs` sequences of up to max_splits partitions.
// The last partition of a head group to finish merges the partials and resets the count, so
// the counts are zero between calls.
struct DecodePartials {         // what the kernel is given
  float* out = nullptr;         // [seq][head][max_splits][head_dim], normalised per partition
  float* max = nullptr;         // [seq][head][max_splits], in log2 units
  float* sum = nullptr;         // [seq][head][max_splits]
  int32_t* arrivals = nullptr;  // [seq][kv_head]
  int max_splits = 0;
};
class DecodeScratch {
 public:
  // The counts are zeroed on `stream`, the one the attention kernels that use them run on.
  DecodeScratch(int seqs, int num_heads, int num_kv_heads, int head_dim, int max_splits,
                cudaStream_t stream);
  const DecodePartials& partials() const { return partials_; }
  int seqs() const { return seqs_; }

 private:
  int seqs_;
  DeviceBuffer<float> out_, max_, sum_;
  DeviceBuffer<int32_t> arrivals_;
  DecodePartials partials_;
};

// The token each sequence of a decode step brings: its position positions[s], its cache slot
// slots[s], and its q, k and v unrotated in row s of the QKV projection. The decode attention
// applies the rotary embedding itself (rotate-half with rope_theta, as rope_write_kv does for
// prefill): it rotates q as it loads it, and the block that holds a sequence's last partition
// rotates k and appends k and v to the layer's cache before it reads them back.
struct DecodeNewTokens {
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  float rope_theta = 0.0f;
  bf16* k_cache = nullptr;  // the pools PagedKv::k and ::v read
  bf16* v_cache = nullptr;
};

// How a decode block's K and V rows reach it. direct: each pass loads 4 rows per thread into
// registers, then scores them; blocks stay small (about 80 registers a thread at llama2-7b's
// heads), so many are resident and their loads overlap. pipelined: each thread copies its rows
// into a ring in shared memory (cp.async), 3 stages of 2 rows ahead of the one it scores, so
// every block keeps bytes in flight while it computes, at the cost of 32 KiB of shared memory a
// block. Both compute the same attention; their online softmax folds rows in groups of
// different sizes, so float32 rounding may differ in the last bits.
enum class DecodeAttentionKernel { direct, pipelined };
constexpr DecodeAttentionKernel kDecodeAttentionKernels[] = {DecodeAttentionKernel::direct,
                                                             DecodeAttentionKernel::pipelined};
const char* decode_attention_kernel_name(DecodeAttentionKernel kernel);
// The kernel of that name; std::invalid_argument naming the choices for any other.
DecodeAttentionKernel decode_attention_kernel_named(const std::string& name);

// One new token per sequence, row s of qkv at qkv + s * qkv_stride ([q heads | k heads |
// v heads]), attending to context_lens[s] positions, the new one included. `splits` partitions
// of `partition` positions (64, 128 or 256) are launched per sequence
// and KV head, at least ceil(longest context / partition) and at most the scratch's max_splits.
// out is [num_seqs, num_heads * head_dim].
void paged_decode_attention(const bf16* qkv, int qkv_stride, const PagedKv& kv,
                            const DecodeNewTokens& fresh, const int32_t* context_lens, int num_seqs,
                            int num_heads, int partition, int splits, DecodeAttentionKernel kernel,
                            const DecodeScratch& scratch, bf16* out, cudaStream_t stream);

// Causal attention for ragged packed prompts. Sequence s's new tokens are packed rows
// q_offsets[s] .. q_offsets[s] + q_lens[s] - 1 of q (row stride q_stride), at positions
// start_positions[s] onwards; their keys and values (earlier positions too) are read from the
// paged cache. `tiles` holds num_tiles pairs (sequence, first query of the tile), each tile
// kPrefillTileQueries queries of one sequence. out is [tokens, num_heads * head_dim].
constexpr int kPrefillTileQueries = 32;
void prefill_attention(const bf16* q, int q_stride, const PagedKv& kv, const int32_t* tiles,
                       int num_tiles, const int32_t* q_offsets, const int32_t* q_lens,
                       const int32_t* start_positions, int num_heads, bf16* out,
                       cudaStream_t stream);

// ---- argmax.cu

// out[r] = row r's argmax among `rows` rows of `vocab` float32 logits (model/row_argmax.h):
// the largest value, NaNs never counting, and of equal values the lowest token.
void logits_argmax(const float* logits, int rows, int vocab, RowArgmax* out, cudaStream_t stream);

}  // namespace pipeline::cuda
