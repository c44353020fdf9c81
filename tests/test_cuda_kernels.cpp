// The CUDA backend's attention and small kernels one at a time, against float64 references
// computed on the host from the same bf16 inputs. The runner tests (test_cuda_runner.cpp) check
// whole forward passes of small models; these say which kernel is wrong when one of those
// fails, and cover what those models do not have: LLaMA-2-7B's head size with 1, 2, 4 and 8
// query heads per KV head, contexts of many decode partitions with a short last one, more
// partitions launched than a sequence needs, block tables scattered over the pool, block sizes
// from 1 to 512, and rows of 7B's hidden size and wider. Without a CUDA device every test skips,
// saying why.
#include <gtest/gtest.h>

#ifdef PIPELINE_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_objects.h"
#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/step_inputs.h"
#include "model/batch.h"
#include "model/sampling.h"
#include "tests/support/cuda_buffers.h"
#include "tests/support/environment_setting.h"

namespace pipeline::cuda {
namespace {

#define SKIP_WITHOUT_CUDA()                                                      \
  do {                                                                           \
    std::string why;                                                             \
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

constexpr double kRopeTheta = 10000.0;

double value(bf16 x) {
  return double(__bfloat162float(x));
}

bf16 to_bf16(double x) {
  return __float2bfloat16(float(x));
}

std::vector<bf16> random_bf16(std::mt19937& rng, size_t n, float low = -1.0f, float high = 1.0f) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(uniform(rng));
  return v;
}

// sqrt(sum (ours - ref)^2 / sum ref^2) over n values from each.
template <typename Ours>
double relative_l2(const Ours* ours, const double* ref, size_t n) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double o = double(ours[i]);
    if (!std::isfinite(o)) return INFINITY;
    err += (o - ref[i]) * (o - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(err / norm);
}

double relative_l2(const bf16* ours, const double* ref, size_t n) {
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = value(ours[i]);
  return relative_l2(values.data(), ref, n);
}

// One head of head_dim values rotated to `position` the rotate-half way, as Hugging Face's
// LlamaRotaryEmbedding does (and kernels/cpu/rope.cpp).
std::vector<double> rotated(const bf16* head, int head_dim, int position) {
  const int half = head_dim / 2;
  std::vector<double> out(static_cast<size_t>(head_dim));
  for (int i = 0; i < half; ++i) {
    const double angle = position * std::pow(kRopeTheta, -2.0 * i / head_dim);
    const double a = value(head[i]), b = value(head[i + half]);
    out[size_t(i)] = a * std::cos(angle) - b * std::sin(angle);
    out[size_t(i + half)] = b * std::cos(angle) + a * std::sin(angle);
  }
  return out;
}

struct HeadShape {
  int num_heads, num_kv_heads, head_dim;
  int qkv_dim() const { return (num_heads + 2 * num_kv_heads) * head_dim; }
  int group() const { return num_heads / num_kv_heads; }
  std::string name() const {
    return std::to_string(num_heads) + " query / " + std::to_string(num_kv_heads) +
           " KV heads of " + std::to_string(head_dim);
  }
};

// A batch whose block tables were drawn at random from a pool of pool_blocks blocks of
// block_size slots, as blocks come back from a BlockManager after churn; the runner's rows of
// block table hold max_blocks_per_seq entries, a few more than the longest sequence needs.
struct ScatteredBatch {
  Batch batch;
  int block_size = 0;
  int pool_blocks = 0;
  int max_blocks_per_seq = 0;
};

// Sequences of (start_pos, new tokens), their blocks drawn from a pool a quarter larger than
// they need, so that the tables are scattered and unused blocks lie between.
ScatteredBatch scattered_batch(std::mt19937& rng, const std::vector<std::pair<int, int>>& chunks,
                               int block_size) {
  ScatteredBatch out;
  out.block_size = block_size;
  int needed = 0, longest = 0;
  for (const auto& [start, n] : chunks) {
    const int blocks = (start + n + block_size - 1) / block_size;
    needed += blocks;
    longest = std::max(longest, blocks);
  }
  out.pool_blocks = needed + needed / 4 + 2;
  out.max_blocks_per_seq = longest + 3;
  std::vector<int32_t> free_blocks(static_cast<size_t>(out.pool_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  size_t next = 0;
  for (const auto& [start, n] : chunks) {
    SequenceChunk chunk;
    chunk.tokens.assign(size_t(n), 0);
    chunk.start_pos = start;
    const int blocks = (start + n + block_size - 1) / block_size;
    for (int b = 0; b < blocks; ++b) chunk.block_table.push_back(free_blocks.at(next++));
    out.batch.seqs.push_back(std::move(chunk));
  }
  return out;
}

// One layer's paged K and V pools ([block][slot][kv_head][head_dim]) filled at random, on the
// host and on the device, for a scattered batch's pool.
struct KvPool {
  KvPool(std::mt19937& rng, const ScatteredBatch& paged, const HeadShape& shape)
      : shape(shape),
        block_size(paged.block_size),
        k(random_bf16(rng, size_t(paged.pool_blocks) * paged.block_size * shape.num_kv_heads *
                               shape.head_dim)),
        v(random_bf16(rng, k.size())),
        k_d(upload(k)),
        v_d(upload(v)) {}

  // The cache slot of `seq`'s token at `position`.
  int slot_of(const SequenceChunk& seq, int position) const {
    return seq.block_table[size_t(position / block_size)] * block_size + position % block_size;
  }

  // K (or V) of `kv_head` at cache slot `slot`.
  const bf16* at(const std::vector<bf16>& pool, int slot, int kv_head) const {
    return pool.data() + (size_t(slot) * shape.num_kv_heads + kv_head) * shape.head_dim;
  }

  HeadShape shape;
  int block_size;
  std::vector<bf16> k, v;
  DeviceBuffer<bf16> k_d, v_d;
};

// The runner's packed step inputs (positions, slots, context lengths, block tables, prefill
// tiles) for a batch, on the device.
struct PackedStep {
  explicit PackedStep(const ScatteredBatch& paged)
      : layout({paged.batch.total_tokens(), int(paged.batch.seqs.size()), paged.batch.logit_rows()},
               paged.max_blocks_per_seq, kPrefillTileQueries) {
    std::vector<int32_t> packed(layout.total);
    shape = pack_step(paged.batch, layout, paged.block_size, packed.data());
    indices = upload(packed);
  }
  const int32_t* at(size_t offset) const { return indices.data() + offset; }

  StepLayout layout;
  StepShape shape;
  DeviceBuffer<int32_t> indices;
};

// The attention kernels' view of the pool through a step's block tables.
PagedKv paged_kv(const KvPool& pool, const PackedStep& step) {
  return {pool.k_d.data(),
          pool.v_d.data(),
          step.at(step.layout.block_tables),
          step.layout.max_blocks_per_seq,
          pool.block_size,
          pool.shape.num_kv_heads,
          pool.shape.head_dim};
}

// ---- Decode attention

// Float64 attention of sequence `s`'s new token (row s of qkv, at position start_pos) over the
// cache, the new k (rotated, as the kernel stores it in bf16) and v in place of the cache's
// slot for that position. Returns [num_heads * head_dim].
std::vector<double> decode_reference(const HeadShape& shape, const std::vector<bf16>& qkv,
                                     const KvPool& pool, const SequenceChunk& seq, int s) {
  const int D = shape.head_dim, position = seq.start_pos;
  const bf16* row = qkv.data() + size_t(s) * shape.qkv_dim();
  std::vector<double> out(size_t(shape.num_heads) * D, 0.0);
  for (int h = 0; h < shape.num_heads; ++h) {
    const int kv_head = h / shape.group();
    const std::vector<double> q = rotated(row + size_t(h) * D, D, position);
    const bf16* k_new = row + size_t(shape.num_heads + kv_head) * D;
    const bf16* v_new = row + size_t(shape.num_heads + shape.num_kv_heads + kv_head) * D;
    std::vector<double> k_new_stored = rotated(k_new, D, position);
    for (double& x : k_new_stored) x = value(to_bf16(x));
    std::vector<double> scores(size_t(position) + 1);
    for (int p = 0; p <= position; ++p) {
      double dot = 0.0;
      const bf16* key = pool.at(pool.k, pool.slot_of(seq, p), kv_head);
      for (int d = 0; d < D; ++d)
        dot += q[size_t(d)] * (p == position ? k_new_stored[size_t(d)] : value(key[d]));
      scores[size_t(p)] = dot / std::sqrt(double(D));
    }
    const double max = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (double& x : scores) sum += (x = std::exp(x - max));
    for (int p = 0; p <= position; ++p) {
      const bf16* val = p == position ? v_new : pool.at(pool.v, pool.slot_of(seq, p), kv_head);
      for (int d = 0; d < D; ++d)
        out[size_t(h) * D + size_t(d)] += scores[size_t(p)] / sum * value(val[d]);
    }
  }
  return out;
}

// Each sequence's attention output against the float64 reference, and the new token's k
// (rotated) and v in the cache at its slot.
void expect_decode_matches_reference(const HeadShape& shape, const std::vector<bf16>& qkv,
                                     KvPool& pool, const Batch& batch,
                                     const std::vector<bf16>& out) {
  const int seqs = int(batch.seqs.size()), D = shape.head_dim;
  const size_t row = size_t(shape.num_heads) * D;
  for (int s = 0; s < seqs; ++s) {
    const std::vector<double> ref = decode_reference(shape, qkv, pool, batch.seqs[size_t(s)], s);
    EXPECT_LT(relative_l2(out.data() + size_t(s) * row, ref.data(), row), 1e-2)
        << "sequence " << s << ", context " << batch.seqs[size_t(s)].start_pos + 1;
  }
  const std::vector<bf16> k_after = download(pool.k_d), v_after = download(pool.v_d);
  for (int s = 0; s < seqs; ++s) {
    const SequenceChunk& seq = batch.seqs[size_t(s)];
    const bf16* row_in = qkv.data() + size_t(s) * shape.qkv_dim();
    for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
      const int slot = pool.slot_of(seq, seq.start_pos);
      const std::vector<double> k_ref =
          rotated(row_in + size_t(shape.num_heads + kv_head) * D, D, seq.start_pos);
      EXPECT_LT(relative_l2(pool.at(k_after, slot, kv_head), k_ref.data(), size_t(D)), 1e-2)
          << "sequence " << s << ": k in the cache";
      const bf16* v_ref = row_in + size_t(shape.num_heads + shape.num_kv_heads + kv_head) * D;
      EXPECT_TRUE(std::equal(v_ref, v_ref + D, pool.at(v_after, slot, kv_head),
                             [](bf16 a, bf16 b) { return value(a) == value(b); }))
          << "sequence " << s << ": v in the cache";
    }
  }
}

// One new token for each of eight sequences whose contexts are 1 position, within the first
// partition, exactly one partition and one past it (for either partition length), several with
// a short last one, and nine; with partitions of each length, by each kernel (the pipelined
// one's new row falls in a stage it copies before the append in some of these contexts, after
// it in others). Then the same step with more partitions launched than the longest needs (as
// the runner rounds them up), and again (the arrival counts must be back at zero).
void check_decode_attention(const HeadShape& shape, int block_size = 16) {
  SCOPED_TRACE(shape.name() + ", blocks of " + std::to_string(block_size));
  std::mt19937 rng(11 + shape.group());
  const std::vector<int> contexts = {1,
                                     kShortDecodePartition,
                                     kShortDecodePartition + 1,
                                     100,
                                     kDecodePartition,
                                     kDecodePartition + 1,
                                     kLongDecodePartition,
                                     kLongDecodePartition + 1,
                                     300,
                                     1100};
  std::vector<std::pair<int, int>> chunks;
  for (int context : contexts) chunks.push_back({context - 1, 1});
  constexpr int kMaxSplits = 20;  // 1100 positions in 64-position partitions, rounded up
  const ScatteredBatch paged = scattered_batch(rng, chunks, block_size);
  const PackedStep step(paged);
  ASSERT_TRUE(step.shape.decode);
  KvPool pool(rng, paged, shape);
  const std::vector<bf16> qkv = random_bf16(rng, contexts.size() * shape.qkv_dim());
  const DeviceBuffer<bf16> qkv_d = upload(qkv);
  const int seqs = int(contexts.size());

  Stream stream;
  const DecodeScratch scratch(seqs, shape.num_heads, shape.num_kv_heads, shape.head_dim, kMaxSplits,
                              stream.get());
  const PagedKv kv = paged_kv(pool, step);
  const DecodeNewTokens fresh{step.at(step.layout.positions), step.at(step.layout.slots),
                              float(kRopeTheta), pool.k_d.data(), pool.v_d.data()};
  DeviceBuffer<bf16> out_d(size_t(seqs) * shape.num_heads * shape.head_dim);
  for (DecodeAttentionKernel kernel : kDecodeAttentionKernels)
    for (int partition : {kShortDecodePartition, kDecodePartition, kLongDecodePartition}) {
      SCOPED_TRACE(std::string(decode_attention_kernel_name(kernel)) + " kernel, partitions of " +
                   std::to_string(partition));
      // The pools as they were: without the new tokens' k and v, which each run must append
      // before it reads them back.
      restore(pool.k, pool.k_d);
      restore(pool.v, pool.v_d);
      auto run = [&](int splits) {
        paged_decode_attention(qkv_d.data(), shape.qkv_dim(), kv, fresh,
                               step.at(step.layout.context_lens), seqs, shape.num_heads, partition,
                               splits, kernel, scratch, out_d.data(), stream.get());
        return download(out_d);
      };
      const int needed = (contexts.back() + partition - 1) / partition;
      const std::vector<bf16> out = run(needed);
      expect_decode_matches_reference(shape, qkv, pool, paged.batch, out);
      // Partitions past a sequence's context do nothing, and the merge runs in partition order
      // whichever block ends last: the same bits with more partitions launched, and again.
      const int rounded = (needed + 3) / 4 * 4;
      for (int repeat = 0; repeat < 2; ++repeat) {
        const std::vector<bf16> again = run(rounded);
        EXPECT_TRUE(std::equal(out.begin(), out.end(), again.begin(),
                               [](bf16 a, bf16 b) { return value(a) == value(b); }))
            << rounded << " partitions launched, call " << repeat + 1;
      }
    }
}

// The longest partitions that still give kDecodeBlocksPerSm blocks per multiprocessor: 132 of
// them (an H100 SXM or H200) and llama2-7b's 32 KV heads, so 528 blocks; else the short ones
// where the scratch (32 partitions: 4096 positions in 128-position ones) holds them.
TEST(CudaKernels, DecodeTakesTheLongestPartitionsThatKeepTheGridFull) {
  EXPECT_EQ(decode_partition(1, 32, 1024, 132, 32), kShortDecodePartition);  // 512 blocks of 64
  EXPECT_EQ(decode_partition(2, 32, 1024, 132, 32), kShortDecodePartition);  // 512 of 128
  EXPECT_EQ(decode_partition(3, 32, 1024, 132, 32), kDecodePartition);       // 768 of 128
  EXPECT_EQ(decode_partition(4, 32, 1024, 132, 32), kDecodePartition);       // 512 of 256
  EXPECT_EQ(decode_partition(5, 32, 1024, 132, 32), kLongDecodePartition);   // 640 of 256
  EXPECT_EQ(decode_partition(16, 32, 1024, 132, 32), kLongDecodePartition);
  EXPECT_EQ(decode_partition(16, 32, 256, 132, 32), kDecodePartition);       // 1024 of 128
  EXPECT_EQ(decode_partition(16, 32, 257, 132, 32), kLongDecodePartition);   // 1024 of 256
  EXPECT_EQ(decode_partition(16, 32, 100, 132, 32), kShortDecodePartition);  // 1024 of 64
  // One sequence of 2049 positions would need 33 short partitions: 128-position ones instead.
  EXPECT_EQ(decode_partition(1, 32, 2048, 132, 32), kShortDecodePartition);
  EXPECT_EQ(decode_partition(1, 32, 2049, 132, 32), kDecodePartition);
}

// The names PIPELINE_CUDA_DECODE_ATTENTION takes, and a clear refusal of any other.
TEST(CudaKernels, DecodeAttentionKernelsAreFoundByName) {
  for (DecodeAttentionKernel kernel : kDecodeAttentionKernels)
    EXPECT_EQ(decode_attention_kernel_named(decode_attention_kernel_name(kernel)), kernel);
  try {
    decode_attention_kernel_named("Pipelined");
    ADD_FAILURE() << "an unknown name was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "no decode attention kernel is named 'Pipelined' (direct or pipelined)");
  }
}

TEST(CudaKernels, DecodeAttentionMatchesFloat64ReferenceForEveryGroupSize) {
  SKIP_WITHOUT_CUDA();
  for (int group : {1, 2, 4, 8}) check_decode_attention({2 * group, 2, 128});
  check_decode_attention({8, 4, 8});    // stories260K's heads
  check_decode_attention({8, 2, 64});   // TinyLlama's and llama2-110m's head size
  check_decode_attention({4, 2, 32});   // make-model tiny's
  check_decode_attention({4, 4, 256});  // the widest head the kernel takes
  check_decode_attention({4, 2, 96});   // 12 lanes cover a row, 4 of its row group idle
}

// scheduler.kv_block_size takes 1 to 1024: a block per position, blocks that straddle the
// partition boundaries (5), and blocks that hold a whole partition or more (256, 512).
TEST(CudaKernels, DecodeAttentionMatchesFloat64ReferenceAtOtherBlockSizes) {
  SKIP_WITHOUT_CUDA();
  for (int block_size : {1, 5, 256, 512}) check_decode_attention({8, 2, 128}, block_size);
}

// ---- Prefill attention and the rotary embedding it follows

// Four prompts, ragged, two of them chunks that start past position 0 (their earlier keys are
// already cached), one of a single token; tiles of kPrefillTileQueries with short last ones.
const std::vector<std::pair<int, int>> kPrefillChunks = {{0, 70}, {40, 33}, {0, 1}, {190, 64}};

void check_prefill_attention(const HeadShape& shape, int block_size = 16) {
  SCOPED_TRACE(shape.name() + ", blocks of " + std::to_string(block_size));
  std::mt19937 rng(23 + shape.group());
  const ScatteredBatch paged = scattered_batch(rng, kPrefillChunks, block_size);
  const Batch& batch = paged.batch;
  const PackedStep step(paged);
  KvPool pool(rng, paged, shape);
  const int tokens = batch.total_tokens(), D = shape.head_dim;
  const std::vector<bf16> qkv = random_bf16(rng, size_t(tokens) * shape.qkv_dim());
  const DeviceBuffer<bf16> qkv_d = upload(qkv);
  const PagedKv kv = paged_kv(pool, step);
  DeviceBuffer<bf16> out_d(size_t(tokens) * shape.num_heads * D);
  Stream stream;
  prefill_attention(qkv_d.data(), shape.qkv_dim(), kv, step.at(step.layout.tiles), step.shape.tiles,
                    step.at(step.layout.q_offsets), step.at(step.layout.q_lens),
                    step.at(step.layout.start_positions), shape.num_heads, out_d.data(),
                    stream.get());
  const std::vector<bf16> out = download(out_d);

  int t = 0;
  double worst = 0.0;
  for (const SequenceChunk& seq : batch.seqs) {
    for (int i = 0; i < int(seq.tokens.size()); ++i, ++t) {
      const int position = seq.start_pos + i;
      for (int h = 0; h < shape.num_heads; ++h) {
        const int kv_head = h / shape.group();
        const bf16* q = qkv.data() + size_t(t) * shape.qkv_dim() + size_t(h) * D;
        std::vector<double> scores(size_t(position) + 1);
        for (int p = 0; p <= position; ++p) {
          const bf16* key = pool.at(pool.k, pool.slot_of(seq, p), kv_head);
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += value(q[d]) * value(key[d]);
          scores[size_t(p)] = dot / std::sqrt(double(D));
        }
        const double max = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& x : scores) sum += (x = std::exp(x - max));
        std::vector<double> ref(size_t(D), 0.0);
        for (int p = 0; p <= position; ++p) {
          const bf16* val = pool.at(pool.v, pool.slot_of(seq, p), kv_head);
          for (int d = 0; d < D; ++d) ref[size_t(d)] += scores[size_t(p)] / sum * value(val[d]);
        }
        const double err =
            relative_l2(out.data() + (size_t(t) * shape.num_heads + h) * D, ref.data(), size_t(D));
        EXPECT_LT(err, 1e-2) << "token " << t << " (position " << position << "), head " << h;
        worst = std::max(worst, err);
      }
    }
  }
  std::cout << shape.name() << ": prefill attention worst relative L2 " << worst << "\n";
}

TEST(CudaKernels, PrefillAttentionMatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  check_prefill_attention({2, 2, 128});
  check_prefill_attention({8, 2, 128});
  check_prefill_attention({8, 2, 64});
  check_prefill_attention({8, 4, 8});
}

TEST(CudaKernels, PrefillAttentionMatchesFloat64ReferenceAtOtherBlockSizes) {
  SKIP_WITHOUT_CUDA();
  for (int block_size : {1, 5, 256}) check_prefill_attention({8, 2, 128}, block_size);
}

// q rotated in place and k (rotated) and v written to each token's slot, for head sizes whose
// half is a multiple of 8 and of 4 only.
TEST(CudaKernels, RopeWriteKvRotatesQAndFillsTheCache) {
  SKIP_WITHOUT_CUDA();
  for (const HeadShape shape : {HeadShape{8, 2, 128}, HeadShape{8, 4, 8}, HeadShape{4, 2, 24}}) {
    SCOPED_TRACE(shape.name());
    std::mt19937 rng(5);
    const ScatteredBatch paged = scattered_batch(rng, kPrefillChunks, 16);
    const Batch& batch = paged.batch;
    const PackedStep step(paged);
    KvPool pool(rng, paged, shape);
    const int tokens = batch.total_tokens(), D = shape.head_dim;
    const std::vector<bf16> qkv = random_bf16(rng, size_t(tokens) * shape.qkv_dim());
    DeviceBuffer<bf16> qkv_d = upload(qkv);
    Stream stream;
    rope_write_kv(qkv_d.data(), tokens, step.at(step.layout.positions), step.at(step.layout.slots),
                  shape.num_heads, shape.num_kv_heads, D, float(kRopeTheta), pool.k_d.data(),
                  pool.v_d.data(), stream.get());
    const std::vector<bf16> qkv_after = download(qkv_d);
    const std::vector<bf16> k_after = download(pool.k_d), v_after = download(pool.v_d);
    int t = 0;
    for (const SequenceChunk& seq : batch.seqs) {
      for (int i = 0; i < int(seq.tokens.size()); ++i, ++t) {
        const int position = seq.start_pos + i, slot = pool.slot_of(seq, position);
        const bf16* row = qkv.data() + size_t(t) * shape.qkv_dim();
        for (int h = 0; h < shape.num_heads; ++h) {
          const std::vector<double> ref = rotated(row + size_t(h) * D, D, position);
          EXPECT_LT(relative_l2(qkv_after.data() + size_t(t) * shape.qkv_dim() + size_t(h) * D,
                                ref.data(), size_t(D)),
                    1e-2)
              << "token " << t << ", q head " << h;
        }
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
          const std::vector<double> k_ref =
              rotated(row + size_t(shape.num_heads + kv_head) * D, D, position);
          EXPECT_LT(relative_l2(pool.at(k_after, slot, kv_head), k_ref.data(), size_t(D)), 1e-2)
              << "token " << t << ", k head " << kv_head;
          const bf16* v = row + size_t(shape.num_heads + shape.num_kv_heads + kv_head) * D;
          EXPECT_TRUE(std::equal(v, v + D, pool.at(v_after, slot, kv_head),
                                 [](bf16 a, bf16 b) { return value(a) == value(b); }))
              << "token " << t << ", v head " << kv_head;
        }
      }
    }
  }
}

// ---- The row kernels

// residual += delta then the normalised row, for 7B's hidden size, one that is a multiple of 4
// but not of 8, and the widest supported; then the logits' form: no delta, a gather of rows.
TEST(CudaKernels, AddRmsNormMatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  constexpr float kEps = 1e-5f;
  for (int hidden : {4096, 516, kMaxHiddenSize}) {
    SCOPED_TRACE("hidden " + std::to_string(hidden));
    std::mt19937 rng(hidden);
    constexpr int kRows = 3;
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    std::vector<float> residual(size_t(kRows) * hidden);
    for (float& x : residual) x = uniform(rng);
    const std::vector<bf16> delta = random_bf16(rng, residual.size());
    const std::vector<bf16> weight = random_bf16(rng, size_t(hidden), 0.5f, 1.5f);
    DeviceBuffer<float> residual_d = upload(residual);
    const DeviceBuffer<bf16> delta_d = upload(delta), weight_d = upload(weight);
    DeviceBuffer<bf16> out_d(residual.size());
    const std::vector<int32_t> gather = {2, 0};
    const DeviceBuffer<int32_t> gather_d = upload(gather);
    Stream stream;

    auto expect_normalised = [&](const std::vector<bf16>& out, int r, const float* x) {
      double sum_sq = 0.0;
      for (int c = 0; c < hidden; ++c) sum_sq += double(x[c]) * x[c];
      const double inv_rms = 1.0 / std::sqrt(sum_sq / hidden + kEps);
      std::vector<double> ref(static_cast<size_t>(hidden));
      for (int c = 0; c < hidden; ++c) ref[size_t(c)] = x[c] * inv_rms * value(weight[size_t(c)]);
      EXPECT_LT(relative_l2(out.data() + size_t(r) * hidden, ref.data(), size_t(hidden)), 1e-2)
          << "output row " << r;
    };

    add_rmsnorm(residual_d.data(), delta_d.data(), weight_d.data(), nullptr, kRows, hidden, kEps,
                out_d.data(), stream.get());
    std::vector<float> summed(residual.size());
    for (size_t i = 0; i < summed.size(); ++i) summed[i] = residual[i] + __bfloat162float(delta[i]);
    EXPECT_EQ(download(residual_d), summed) << "residual += delta";
    const std::vector<bf16> out = download(out_d);
    for (int r = 0; r < kRows; ++r) expect_normalised(out, r, summed.data() + size_t(r) * hidden);

    add_rmsnorm(residual_d.data(), nullptr, weight_d.data(), gather_d.data(), int(gather.size()),
                hidden, kEps, out_d.data(), stream.get());
    EXPECT_EQ(download(residual_d), summed) << "no delta: the residual stays";
    const std::vector<bf16> gathered = download(out_d);
    for (size_t r = 0; r < gather.size(); ++r)
      expect_normalised(gathered, int(r), summed.data() + size_t(gather[r]) * hidden);
  }
}

TEST(CudaKernels, EmbeddingGatherCopiesEachTokensRow) {
  SKIP_WITHOUT_CUDA();
  for (int hidden : {4096, 516}) {
    std::mt19937 rng(3);
    constexpr int kVocab = 64;
    const std::vector<bf16> embed = random_bf16(rng, size_t(kVocab) * hidden);
    const std::vector<int32_t> tokens = {5, 0, kVocab - 1, 5};
    const DeviceBuffer<bf16> embed_d = upload(embed);
    const DeviceBuffer<int32_t> tokens_d = upload(tokens);
    DeviceBuffer<float> residual_d(tokens.size() * hidden);
    Stream stream;
    embedding_gather(embed_d.data(), tokens_d.data(), int(tokens.size()), hidden, residual_d.data(),
                     stream.get());
    const std::vector<float> residual = download(residual_d);
    for (size_t t = 0; t < tokens.size(); ++t)
      for (int c = 0; c < hidden; ++c)
        ASSERT_EQ(residual[t * hidden + size_t(c)],
                  __bfloat162float(embed[size_t(tokens[t]) * hidden + size_t(c)]))
            << "hidden " << hidden << ", token " << t << ", column " << c;
  }
}

// Each row's argmax is the host's argmax_of, at 32,000 columns (float4 loads) and 509 (one float
// a load): ties (the lowest token), NaNs (never counted), the first and last columns, +inf, and
// rows without a finite maximum (all NaN, all -inf), whose value must say so.
TEST(CudaKernels, LogitsArgmaxIsTheHostsOnEveryRow) {
  SKIP_WITHOUT_CUDA();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const int vocab : {32000, 509}) {
    constexpr int kRows = 70;
    std::mt19937 rng{uint32_t(vocab)};
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> logits(size_t(kRows) * vocab);
    for (float& x : logits) x = normal(rng);
    const auto row = [&](int r) { return logits.begin() + ptrdiff_t(r) * vocab; };
    row(1)[vocab - 1] = row(1)[7] = 100.0f;
    row(2)[vocab - 3] = row(2)[vocab / 2] = row(2)[3] = 100.0f;
    std::fill(row(3), row(4), 1.5f);
    for (int c = 0; c < vocab; c += 3) row(4)[c] = nan;
    row(5)[0] = nan;
    row(5)[1] = 50.0f;
    row(6)[0] = 60.0f;
    row(7)[vocab - 1] = 60.0f;
    row(8)[vocab - 2] = inf;
    std::fill(row(9), row(10), nan);
    std::fill(row(10), row(11), -inf);
    const DeviceBuffer<float> logits_d = upload(logits);
    DeviceBuffer<RowArgmax> out_d(kRows);
    Stream stream;
    logits_argmax(logits_d.data(), kRows, vocab, out_d.data(), stream.get());
    const std::vector<RowArgmax> out = download(out_d);
    for (int r = 0; r < kRows; ++r) {
      const RowArgmax expected = argmax_of(std::span<const float>(&*row(r), size_t(vocab)));
      if (!std::isfinite(expected.value)) {
        EXPECT_FALSE(std::isfinite(out[size_t(r)].value)) << "vocab " << vocab << ", row " << r;
        continue;
      }
      EXPECT_EQ(out[size_t(r)].token, expected.token) << "vocab " << vocab << ", row " << r;
      EXPECT_EQ(out[size_t(r)].value, expected.value) << "vocab " << vocab << ", row " << r;
    }
  }
}

// A failed call is reported by its own check alone. The runtime also keeps its error as the
// "last error", which the next launch's check would have reported as that launch's failure (a
// pass whose buffers could not grow failed the next, unrelated prefill).
TEST(CudaKernels, AFailedAllocationIsNotReportedAgainByTheNextLaunch) {
  SKIP_WITHOUT_CUDA();
  EXPECT_THROW(DeviceBuffer<char>(size_t(1) << 52), std::runtime_error);  // 4 PiB
  const std::vector<float> ones(1000, 1.0f);
  const DeviceBuffer<float> src_d = upload(ones);
  DeviceBuffer<bf16> dst_d(ones.size());
  Stream stream;
  EXPECT_NO_THROW(
      convert_to_bf16(src_d.data(), DType::F32, dst_d.data(), ones.size(), stream.get()));
  for (bf16 x : download(dst_d)) ASSERT_EQ(__bfloat162float(x), 1.0f);
}

// A GEMV with no output columns would launch an empty grid, an error the next kernel's check
// would report as its own; it is refused before anything reaches the device (so this runs
// without one).
TEST(CudaKernels, AGemvOfNoColumnsIsRefusedBeforeItLaunches) {
  EXPECT_THROW(gemv(nullptr, nullptr, static_cast<bf16*>(nullptr), 64, 0, nullptr),
               std::invalid_argument);
  EXPECT_THROW(gemv(nullptr, nullptr, static_cast<float*>(nullptr), 64, 0, nullptr),
               std::invalid_argument);
  EXPECT_THROW(gemv_silu_mul(nullptr, nullptr, nullptr, 64, 0, nullptr), std::invalid_argument);
}

// 7B's intermediate size and sizes that take the kernel's 4-, 2- and 1-wide builds.
TEST(CudaKernels, SiluMulOfInterleavedPairs) {
  SKIP_WITHOUT_CUDA();
  for (int inter : {11008, 1376, 6, 5}) {
    std::mt19937 rng(inter);
    constexpr int kTokens = 3;
    const std::vector<bf16> gate_up = random_bf16(rng, size_t(kTokens) * 2 * inter, -4.0f, 4.0f);
    const DeviceBuffer<bf16> gate_up_d = upload(gate_up);
    DeviceBuffer<bf16> out_d(size_t(kTokens) * inter);
    Stream stream;
    silu_mul(gate_up_d.data(), kTokens, inter, out_d.data(), stream.get());
    const std::vector<bf16> out = download(out_d);
    std::vector<double> ref(out.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double gate = value(gate_up[2 * i]), up = value(gate_up[2 * i + 1]);
      ref[i] = gate / (1.0 + std::exp(-gate)) * up;
    }
    EXPECT_LT(relative_l2(out.data(), ref.data(), ref.size()), 1e-2) << "inter " << inter;
  }
}

// ---- The projections at LLaMA-2-7B's shapes

// Fills a buffer with NaN (all bits set, in bf16 as in float32) on `stream`: outputs a kernel
// fails to write then fail their comparison.
template <typename T>
void poison(DeviceBuffer<T>& buffer, cudaStream_t stream) {
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 0xFF, buffer.bytes(), stream), cudaSuccess);
}

// n bf16 values in [-1, 1) from a hash of their index: a 7B matrix's hundred million values in
// a fraction of a second. The hash mixes all of its bits (SplitMix64's finaliser): the top bits
// of a bare multiplicative hash of consecutive indices make a sawtooth, the same in every row,
// whose dot products are large and alike and hide an error inside the tolerance.
std::vector<bf16> hashed_bf16(size_t n, uint64_t seed) {
  std::vector<bf16> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = (i + (seed << 40)) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    v[i] = __float2bfloat16(float((h >> 40) & 0xffff) / 32768.0f - 1.0f);
  }
  return v;
}

// The five projections as the runner calls them through Gemm, before any tuning: one row (the
// GEMV), 5, 16 and 64 rows (SkinnyGemm, whose split of the k axis depends on the shape: none for
// gate/up and the lm_head, 2 ways for qkv, 8 for o and down on an H200) and 65 (cuBLAS); then
// SkinnyGemm at each of its plans (both kernels at every split option, which Gemm::tune() may
// choose) at 5, 16 and 64 rows, into outputs filled with NaN first. The test-sized matrices of
// test_cuda_runner.cpp do not reach those splits (they do reach a partial last column tile, which
// these shapes, multiples of 128, do not); here 61 output columns (the first, the last and spread
// between) are checked against float64.
TEST(CudaKernels, ProjectionsAt7BShapesMatchFloat64OnSampledColumns) {
  SKIP_WITHOUT_CUDA();
  struct Shape {
    const char* name;
    int in, out;
    Gemm::Product product;
  };
  const Shape shapes[] = {{"qkv", 4096, 12288, Gemm::Product::bf16},
                          {"o", 4096, 4096, Gemm::Product::bf16},
                          {"gate_up", 4096, 22016, Gemm::Product::silu_mul},
                          {"down", 11008, 4096, Gemm::Product::bf16},
                          {"lm_head", 4096, 32000, Gemm::Product::f32}};
  constexpr int kMaxRows = 65, kSamples = 61;
  Stream stream;
  Gemm gemm(stream.get());
  SkinnyGemm skinny(stream.get());
  for (const Shape& shape : shapes) {
    const bool silu = shape.product == Gemm::Product::silu_mul;
    const int results = silu ? shape.out / 2 : shape.out;  // columns of y
    const std::vector<bf16> w = hashed_bf16(size_t(shape.out) * shape.in, 1);
    const std::vector<bf16> x = hashed_bf16(size_t(kMaxRows) * shape.in, 7);
    const DeviceBuffer<bf16> w_d = upload(w), x_d = upload(x);
    DeviceBuffer<bf16> y16_d(size_t(kMaxRows) * shape.out), gate_up_d(size_t(kMaxRows) * shape.out);
    DeviceBuffer<float> y32_d(size_t(kMaxRows) * shape.out);
    auto dot = [&](int r, int c) {
      double sum = 0.0;
      for (int k = 0; k < shape.in; ++k)
        sum += value(x[size_t(r) * shape.in + k]) * value(w[size_t(c) * shape.in + k]);
      return sum;
    };
    // y's sampled columns of `rows` rows, against float64; `how` names the call.
    auto check = [&](int rows, const std::string& how) {
      const std::vector<bf16> y16 = download(y16_d);
      const std::vector<float> y32 = download(y32_d);
      std::vector<double> ours, ref;
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < kSamples; ++i) {
          const int c = int(int64_t(results - 1) * i / (kSamples - 1));
          const size_t at = size_t(r) * results + c;
          ours.push_back(shape.product == Gemm::Product::f32 ? double(y32[at]) : value(y16[at]));
          if (silu) {
            const double gate = dot(r, 2 * c), up = dot(r, 2 * c + 1);
            ref.push_back(gate / (1.0 + std::exp(-gate)) * up);
          } else {
            ref.push_back(dot(r, c));
          }
        }
      const double tolerance = shape.product == Gemm::Product::f32 ? 1e-4 : silu ? 1e-2 : 5e-3;
      EXPECT_LT(relative_l2(ours.data(), ref.data(), ref.size()), tolerance)
          << shape.name << " " << shape.out << "x" << shape.in << ", " << rows << " rows, " << how;
    };
    for (int rows : {1, 5, 16, 64, kMaxRows}) {
      switch (shape.product) {
        case Gemm::Product::bf16:
          gemm.linear(x_d.data(), w_d.data(), y16_d.data(), rows, shape.in, shape.out);
          break;
        case Gemm::Product::f32:
          gemm.linear_f32(x_d.data(), w_d.data(), y32_d.data(), rows, shape.in, shape.out);
          break;
        case Gemm::Product::silu_mul:
          gemm.linear_silu_mul(x_d.data(), w_d.data(), gate_up_d.data(), y16_d.data(), rows,
                               shape.in, shape.out / 2);
          break;
      }
      check(rows, "Gemm");
    }
    // Every plan, each into outputs filled with NaN first, so that one that leaves columns
    // unwritten fails.
    const std::vector<SkinnyPlan> plans = skinny.plans(shape.in, shape.out);
    for (int rows : {5, 16, 64})
      for (const SkinnyPlan& plan : plans) {
        poison(y16_d, stream.get());
        poison(y32_d, stream.get());
        switch (shape.product) {
          case Gemm::Product::bf16:
            skinny.run(x_d.data(), w_d.data(), y16_d.data(), rows, shape.in, shape.out, plan);
            break;
          case Gemm::Product::f32:
            skinny.run(x_d.data(), w_d.data(), y32_d.data(), rows, shape.in, shape.out, plan);
            break;
          case Gemm::Product::silu_mul:
            skinny.run_silu_mul(x_d.data(), w_d.data(), y16_d.data(), rows, shape.in, shape.out / 2,
                                plan);
            break;
        }
        check(rows, std::string("SkinnyGemm ") + skinny_gemm_kernel_name(plan.kernel) +
                        ", k split " + std::to_string(plan.splits) + " ways");
      }
    EXPECT_EQ(plans.size(),
              skinny.kernels().size() * skinny.split_options(shape.in, shape.out).size());
  }
}

// Every SkinnyGemm plan (each kernel at each split of k) on shapes small enough for the
// sanitizers: a partial last column tile (300 and 600 columns), a k range that ends inside a
// pipelined stage (264), a shorter last split (1000 in 3 splits), an 8-way split, and an 8-way
// split of 2056 (seven splits of 288, five pipelined stages each, as many as the ring holds, and
// a last one of 40, a single stage), at each build's row counts and one past them; bf16 and
// float32 results and SiLU*mul of the column pairs, against float64. The pipelined kernel's
// results equal the direct one's at the same split bit for bit. gpu_check runs this test under
// memcheck and racecheck.
TEST(CudaKernels, SkinnyGemmPlansMatchFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  Stream stream;
  SkinnyGemm skinny(stream.get());
  for (const auto& [in, out] :
       {std::pair{1000, 300}, std::pair{264, 600}, std::pair{4096, 256}, std::pair{2056, 256}}) {
    const std::vector<bf16> w = hashed_bf16(size_t(out) * in, 3);
    const std::vector<bf16> x = hashed_bf16(size_t(kSkinnyMaxRows) * in, 5);
    const DeviceBuffer<bf16> w_d = upload(w), x_d = upload(x);
    std::vector<double> ref(size_t(kSkinnyMaxRows) * out), ref_act(ref.size() / 2);
    for (int r = 0; r < kSkinnyMaxRows; ++r)
      for (int c = 0; c < out; ++c) {
        double sum = 0.0;
        for (int k = 0; k < in; ++k)
          sum += value(x[size_t(r) * in + k]) * value(w[size_t(c) * in + k]);
        ref[size_t(r) * out + c] = sum;
      }
    for (size_t i = 0; i < ref_act.size(); ++i)
      ref_act[i] = ref[2 * i] / (1.0 + std::exp(-ref[2 * i])) * ref[2 * i + 1];
    for (int rows : {2, 8, 9, 16, 17, 32, 33, 64}) {
      std::map<int, std::tuple<std::vector<bf16>, std::vector<float>, std::vector<bf16>>> direct;
      for (const SkinnyPlan& plan : skinny.plans(in, out)) {
        DeviceBuffer<bf16> y16_d(size_t(rows) * out), act_d(size_t(rows) * out / 2);
        DeviceBuffer<float> y32_d(size_t(rows) * out);
        poison(y16_d, stream.get());
        poison(y32_d, stream.get());
        poison(act_d, stream.get());
        skinny.run(x_d.data(), w_d.data(), y16_d.data(), rows, in, out, plan);
        skinny.run(x_d.data(), w_d.data(), y32_d.data(), rows, in, out, plan);
        skinny.run_silu_mul(x_d.data(), w_d.data(), act_d.data(), rows, in, out / 2, plan);
        auto results = std::tuple{download(y16_d), download(y32_d), download(act_d)};
        const auto& [y16, y32, act] = results;
        const std::string what = std::to_string(rows) + "x" + std::to_string(in) + " -> " +
                                 std::to_string(out) + ", " + skinny_gemm_kernel_name(plan.kernel) +
                                 " kernel, k split " + std::to_string(plan.splits) + " ways";
        EXPECT_LT(relative_l2(y16.data(), ref.data(), y16.size()), 5e-3) << what << ", bf16";
        EXPECT_LT(relative_l2(y32.data(), ref.data(), y32.size()), 1e-5) << what << ", float32";
        EXPECT_LT(relative_l2(act.data(), ref_act.data(), act.size()), 1e-2)
            << what << ", SiLU*mul";
        if (plan.kernel == SkinnyGemmKernel::direct) {
          direct[plan.splits] = std::move(results);
          continue;
        }
        const auto& [y16_direct, y32_direct, act_direct] = direct.at(plan.splits);
        EXPECT_EQ(0, std::memcmp(y16.data(), y16_direct.data(), y16.size() * sizeof(bf16)))
            << what << ", bf16 against the direct kernel";
        EXPECT_EQ(y32, y32_direct) << what << ", float32 against the direct kernel";
        EXPECT_EQ(0, std::memcmp(act.data(), act_direct.data(), act.size() * sizeof(bf16)))
            << what << ", SiLU*mul against the direct kernel";
      }
    }
  }
}

TEST(CudaKernels, SkinnyGemmKernelsAreFoundByName) {
  for (SkinnyGemmKernel kernel : kSkinnyGemmKernels)
    EXPECT_EQ(skinny_gemm_kernel_named(skinny_gemm_kernel_name(kernel)), kernel);
  try {
    skinny_gemm_kernel_named("Direct");
    ADD_FAILURE() << "an unknown name was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "no SkinnyGemm kernel is named 'Direct' (direct or pipelined)");
  }
}

// PIPELINE_CUDA_SKINNY_GEMM leaves SkinnyGemm the kernel it names, for every plan; a name that
// is neither kernel's is refused when a SkinnyGemm is made.
TEST(CudaKernels, SkinnyGemmKernelIsSetByTheEnvironment) {
  SKIP_WITHOUT_CUDA();
  Stream stream;
  std::vector<SkinnyGemmKernel> available;
  {
    const EnvironmentSetting unset(kSkinnyGemmVariable, nullptr);
    available = SkinnyGemm(stream.get()).kernels();
  }
  for (SkinnyGemmKernel kernel : available) {
    const EnvironmentSetting set(kSkinnyGemmVariable, skinny_gemm_kernel_name(kernel));
    const SkinnyGemm skinny(stream.get());
    EXPECT_EQ(skinny.kernels(), std::vector<SkinnyGemmKernel>{kernel});
    for (const SkinnyPlan& plan : skinny.plans(4096, 4096)) EXPECT_EQ(plan.kernel, kernel);
  }
  const EnvironmentSetting set(kSkinnyGemmVariable, "Direct");
  try {
    SkinnyGemm skinny(stream.get());
    ADD_FAILURE() << "an unknown name was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "PIPELINE_CUDA_SKINNY_GEMM: no SkinnyGemm kernel is named 'Direct' "
                 "(direct or pipelined)");
  }
}

// The split options on an H200 (132 multiprocessors, two SkinnyGemm blocks each) for the 7B
// projections: the first fills one wave of blocks where the column tiles (128 columns each)
// leave room, the others double it while k allows 256 per split, 8 splits at most, and the
// partials' room of four waves. Host code: it runs without a device.
TEST(CudaKernels, SkinnyGemmSplitOptionsStartAtOneWave) {
  constexpr int kH200Blocks = 264;
  EXPECT_EQ(skinny_split_options(4096, 12288, kH200Blocks), (std::vector<int>{2, 4, 8}));  // qkv
  EXPECT_EQ(skinny_split_options(4096, 4096, kH200Blocks), (std::vector<int>{8}));         // o
  EXPECT_EQ(skinny_split_options(4096, 22016, kH200Blocks),
            (std::vector<int>{1, 2, 4}));                                            // gate_up
  EXPECT_EQ(skinny_split_options(11008, 4096, kH200Blocks), (std::vector<int>{8}));  // down
  EXPECT_EQ(skinny_split_options(4096, 32000, kH200Blocks),
            (std::vector<int>{1, 2, 4}));                                          // lm_head
  EXPECT_EQ(skinny_split_options(264, 600, kH200Blocks), (std::vector<int>{1}));   // k too short
  EXPECT_EQ(skinny_split_options(1024, 600, kH200Blocks), (std::vector<int>{4}));  // 256 per split
  // Vocabularies of 64k and 128k (500 and 1000 tiles): more than a wave unsplit, and only the
  // first has room for 2 splits' partials.
  EXPECT_EQ(skinny_split_options(4096, 64000, kH200Blocks), (std::vector<int>{1, 2}));
  EXPECT_EQ(skinny_split_options(4096, 128000, kH200Blocks), (std::vector<int>{1}));
}

}  // namespace
}  // namespace pipeline::cuda

#else  // built without the CUDA backend

TEST(CudaKernels, NeedTheCudaBackend) {
  GTEST_SKIP() << "no CUDA device: built without the CUDA backend";
}

#endif
