// The CUDA runner against the CPU runner (float32, Hugging Face's computation) and the golden
// references: logits of a whole prompt, prefill in chunks and token-by-token decode (which goes
// through the captured CUDA graphs), greedy tokens of stories260K, and a ragged batch of 8
// against each sequence run alone. Without a CUDA device every test skips, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/batch.h"
#include "model/cpu_runner.h"
#include "model/kv_cache.h"
#include "model/llama_weights.h"
#include "tests/support/command.h"
#include "tests/support/shared_data.h"
#ifdef PIPELINE_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cublaslt_matmul.h"
#include "kernels/cuda/cuda_objects.h"
#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernels.h"
#include "tests/support/cuda_buffers.h"
#include "tests/support/environment_setting.h"
#endif

namespace pipeline {
namespace {

using nlohmann::json;
using testing::shared_path;

// Skips the calling test when no CUDA runner can be made here.
#ifdef PIPELINE_HAVE_CUDA
#define SKIP_WITHOUT_CUDA()                                                      \
  do {                                                                           \
    std::string why;                                                             \
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)
#else
#define SKIP_WITHOUT_CUDA() GTEST_SKIP() << "no CUDA device: built without the CUDA backend"
std::unique_ptr<ModelRunner> make_cuda_runner(std::shared_ptr<const LlamaWeights>,
                                              const RunnerOptions&) {
  throw std::logic_error("built without the CUDA backend");
}
#endif

// Small explicit pools: the tests never size the KV cache from free device memory.
RunnerOptions test_options(int blocks = 256, int block_size = 16) {
  RunnerOptions options;
  options.kv_block_size = block_size;
  options.kv_cache_blocks = blocks;
  options.max_num_seqs = 8;
  return options;
}

std::shared_ptr<const LlamaWeights> load_model(const std::filesystem::path& dir) {
  return std::make_shared<const LlamaWeights>(LlamaWeights::load(dir));
}

json read_json(const std::string& relative) {
  std::ifstream in(shared_path(relative));
  return json::parse(in);
}

double relative_l2(std::span<const float> ours, std::span<const float> ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < std::min(ours.size(), ref.size()); ++i) {
    EXPECT_TRUE(std::isfinite(ours[i])) << "element " << i;
    err += (double(ours[i]) - ref[i]) * (double(ours[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return std::sqrt(err / norm);
}

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// How far the best logit leads the second best.
float top_two_gap(std::span<const float> row) {
  std::vector<float> sorted(row.begin(), row.end());
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  return sorted[0] - sorted[1];
}

// One sequence's whole prompt with a logit row per token.
Logits prefill_all(ModelRunner& runner, BlockManager& blocks, const std::vector<int32_t>& ids) {
  Batch batch;
  batch.seqs.push_back({ids, 0, {}, true});
  EXPECT_TRUE(blocks.ensure_capacity(batch.seqs[0].block_table, int(ids.size()),
                                     runner.kv_shape().block_size));
  Logits logits;
  runner.forward(batch, logits);
  EXPECT_EQ(logits.rows(), int(ids.size()));
  blocks.release_all(batch.seqs[0].block_table);
  return logits;
}

// The same prompt as a prefill of `first` tokens, a second prefill chunk of `second` tokens at
// start_pos `first`, then one decode step per remaining token; rows in position order.
std::vector<std::vector<float>> chunked_then_decode(ModelRunner& runner, BlockManager& blocks,
                                                    const std::vector<int32_t>& ids, int first,
                                                    int second) {
  const int block_size = runner.kv_shape().block_size;
  std::vector<std::vector<float>> rows;
  Batch batch;
  batch.seqs.push_back({{ids.begin(), ids.begin() + first}, 0, {}, true});
  SequenceChunk& seq = batch.seqs[0];
  Logits logits;
  auto run = [&] {
    EXPECT_TRUE(blocks.ensure_capacity(seq.block_table, seq.start_pos + int(seq.tokens.size()),
                                       block_size));
    runner.forward(batch, logits);
    for (int r = 0; r < logits.rows(); ++r)
      rows.emplace_back(logits.row(r).begin(), logits.row(r).end());
  };
  run();
  seq.tokens.assign(ids.begin() + first, ids.begin() + first + second);
  seq.start_pos = first;
  run();
  for (int pos = first + second; pos < int(ids.size()); ++pos) {
    seq.tokens = {ids[pos]};
    seq.start_pos = pos;
    seq.all_logits = false;
    run();
  }
  blocks.release_all(seq.block_table);
  return rows;
}

std::vector<int32_t> random_h128_ids() {
  return read_json("golden/random-h128_logits.json")["ids"].get<std::vector<int32_t>>();
}

// A 300-token prompt of stories260K's vocabulary (the golden random-h128 ids use the same one).
void expect_matches_cpu(const std::filesystem::path& model) {
  const auto weights = load_model(model);
  const auto cuda = make_cuda_runner(weights, test_options());
  const auto cpu = make_cpu_runner(weights, test_options());
  BlockManager cuda_blocks(cuda->kv_shape().num_blocks), cpu_blocks(cpu->kv_shape().num_blocks);
  std::vector<int32_t> ids = random_h128_ids();
  ids.resize(std::min<size_t>(ids.size(), size_t(weights->config.max_position_embeddings)));
  const Logits ours = prefill_all(*cuda, cuda_blocks, ids);
  const Logits ref = prefill_all(*cpu, cpu_blocks, ids);
  const double err = relative_l2(ours.data, ref.data);
  EXPECT_LT(err, 2e-2) << model;
  double worst_row = 0.0;
  for (int r = 0; r < ref.rows(); ++r)
    worst_row = std::max(worst_row, relative_l2(ours.row(r), ref.row(r)));
  EXPECT_LT(worst_row, 4e-2) << model;
  std::cout << model << ": CUDA vs CPU relative L2 " << err << " (worst row " << worst_row
            << ") over " << ids.size() << " positions\n";
}

TEST(CudaRunner, LogitsMatchCpuOnStories260K) {
  SKIP_WITHOUT_CUDA();
  expect_matches_cpu(shared_path("models/stories260K"));
}

TEST(CudaRunner, LogitsMatchCpuOnRandomH128) {
  SKIP_WITHOUT_CUDA();
  expect_matches_cpu(shared_path("models/random-h128-bf16"));
}

// The demo shape (hidden 128, 4 query / 2 key-value heads of 32) as `pipeline make-model`
// writes it, in bf16.
TEST(CudaRunner, LogitsMatchCpuOnMakeModelTiny) {
  SKIP_WITHOUT_CUDA();
  const auto dir = testing::make_temp_dir("cuda-tiny");
  const auto made = testing::run_pipeline(
      {"make-model", "--shape", "tiny", "--dtype", "bf16", "--out", (dir / "tiny").string(),
       "--corpus", (testing::source_dir() / "data" / "tokenizer_corpus.txt").string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  expect_matches_cpu(dir / "tiny");
  std::filesystem::remove_all(dir);
}

TEST(CudaRunner, LogitsMatchFloat64GoldenOnRandomH128) {
  SKIP_WITHOUT_CUDA();
  const json golden = read_json("golden/random-h128_logits.json");
  const auto cuda =
      make_cuda_runner(load_model(shared_path("models/random-h128-bf16")), test_options());
  BlockManager blocks(cuda->kv_shape().num_blocks);
  const Logits logits = prefill_all(*cuda, blocks, golden["ids"].get<std::vector<int32_t>>());
  for (int pos : golden["positions"].get<std::vector<int>>()) {
    const auto ref = golden["logits"][std::to_string(pos)].get<std::vector<float>>();
    EXPECT_LT(relative_l2(logits.row(pos), ref), 2e-2) << "position " << pos;
  }
}

// Prefill of 100 tokens, a second chunk of 100 at start_pos 100 (attending to cached keys),
// then 100 decode steps crossing a decode partition boundary (position 256): every row must agree
// with the one-shot prefill up to bf16 rounding (the two paths round in different orders; a CPU
// emulation of this runner's rounding puts random-h128 at ~1e-2 from float32).
void expect_chunked_matches_one_shot(int block_size) {
  SCOPED_TRACE("blocks of " + std::to_string(block_size));
  const std::vector<int32_t> ids = random_h128_ids();
  const int pool = (int(ids.size()) + block_size - 1) / block_size + 2;
  const auto cuda = make_cuda_runner(load_model(shared_path("models/random-h128-bf16")),
                                     test_options(pool, block_size));
  BlockManager blocks(cuda->kv_shape().num_blocks);
  const Logits all = prefill_all(*cuda, blocks, ids);
  const auto stepped = chunked_then_decode(*cuda, blocks, ids, 100, 100);
  ASSERT_EQ(int(stepped.size()), all.rows());
  double worst = 0.0;
  for (int pos = 0; pos < all.rows(); ++pos) {
    const double err = relative_l2(stepped[pos], all.row(pos));
    EXPECT_LT(err, 2e-2) << "position " << pos;
    worst = std::max(worst, err);
  }
  std::cout << "blocks of " << block_size
            << ": prefill-all vs chunked prefill + decode: worst relative L2 " << worst << "\n";
}

TEST(CudaRunner, ChunkedPrefillAndDecodeMatchOneShotPrefill) {
  SKIP_WITHOUT_CUDA();
  expect_chunked_matches_one_shot(16);
}

// scheduler.kv_block_size takes 1 to 1024: a block per position, blocks that straddle the
// chunk and partition boundaries, and one block for the whole prompt.
TEST(CudaRunner, ChunkedPrefillAndDecodeMatchOneShotPrefillAtOtherBlockSizes) {
  SKIP_WITHOUT_CUDA();
  for (int block_size : {1, 7, 512}) expect_chunked_matches_one_shot(block_size);
}

// Each way a greedy server runs: the rows back on the host, and the device's argmax alone.
TEST(CudaRunner, GreedyTokensMatchStories260KGolden) {
  SKIP_WITHOUT_CUDA();
  const auto cuda = make_cuda_runner(load_model(shared_path("models/stories260K")), test_options());
  const int block_size = cuda->kv_shape().block_size;
  for (const bool argmax_only : {false, true}) {
    for (const json& c : read_json("golden/stories260K_greedy.json")["cases"]) {
      const auto expected = c["generated_ids"].get<std::vector<int32_t>>();
      BlockManager blocks(cuda->kv_shape().num_blocks);
      Batch batch;
      batch.seqs.push_back(
          {c["prompt_ids_sentencepiece"].get<std::vector<int32_t>>(), 0, {}, false, argmax_only});
      SequenceChunk& seq = batch.seqs[0];
      Logits logits;
      std::vector<int32_t> generated;
      while (generated.size() < 8) {
        ASSERT_TRUE(blocks.ensure_capacity(seq.block_table, seq.start_pos + int(seq.tokens.size()),
                                           block_size));
        cuda->forward(batch, logits);
        ASSERT_EQ(logits.rows(), 1);
        ASSERT_EQ(logits.argmax.size(), argmax_only ? 1u : 0u);
        generated.push_back(argmax_only ? logits.argmax[0].token : argmax(logits.row(0)));
        seq.start_pos += int(seq.tokens.size());
        seq.tokens = {generated.back()};
      }
      EXPECT_EQ(generated, std::vector<int32_t>(expected.begin(), expected.begin() + 8))
          << "prompt '" << c["prompt"].get<std::string>() << "'"
          << (argmax_only ? ", argmax on the device" : ", rows on the host");
    }
  }
}

// Eight ragged stories260K prompts (the golden cases, lengthened where one repeats) and their
// golden continuations, which the batch tests feed back (teacher forcing), so that a sequence
// sees the same tokens however it is batched.
struct GoldenSequences {
  std::vector<std::vector<int32_t>> prompts, continuations;
};

GoldenSequences golden_sequences(int count = 8) {
  const json cases = read_json("golden/stories260K_greedy.json")["cases"];
  GoldenSequences g;
  for (int i = 0; i < count; ++i) {
    const json& c = cases[size_t(i) % cases.size()];
    std::vector<int32_t> prompt = c["prompt_ids_sentencepiece"].get<std::vector<int32_t>>();
    for (int extra = 0; extra < i / int(cases.size()) * 3; ++extra) prompt.push_back(400 + extra);
    g.prompts.push_back(prompt);
    g.continuations.push_back(c["generated_ids"].get<std::vector<int32_t>>());
  }
  return g;
}

// Eight sequences' decode steps, each run twice over the same positions: once returning the rows,
// once the argmaxes alone (the same captured graph, copied back either way). Each argmax is its
// row's, up to the last bits a replay may round differently.
TEST(CudaRunner, ArgmaxOnlyStepsGiveTheArgmaxOfTheirRows) {
  SKIP_WITHOUT_CUDA();
  const auto cuda =
      make_cuda_runner(load_model(shared_path("models/stories260K")), test_options(512));
  const GoldenSequences g = golden_sequences();
  BlockManager blocks(cuda->kv_shape().num_blocks);
  Batch batch;
  for (const auto& prompt : g.prompts) batch.seqs.push_back({prompt, 0, {}, false});
  Logits rows, argmaxes;
  for (int step = 0; step <= 6; ++step) {
    for (SequenceChunk& seq : batch.seqs) {
      seq.argmax_only = false;
      ASSERT_TRUE(blocks.ensure_capacity(seq.block_table, seq.start_pos + int(seq.tokens.size()),
                                         cuda->kv_shape().block_size));
    }
    cuda->forward(batch, rows);
    for (SequenceChunk& seq : batch.seqs) seq.argmax_only = true;
    cuda->forward(batch, argmaxes);
    ASSERT_TRUE(argmaxes.data.empty());
    ASSERT_EQ(argmaxes.argmax.size(), batch.seqs.size());
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const std::span<const float> row = rows.row(int(i));
      const RowArgmax& found = argmaxes.argmax[i];
      EXPECT_NEAR(found.value, *std::max_element(row.begin(), row.end()), 1e-4)
          << "sequence " << i << " step " << step;
      if (top_two_gap(row) > 1e-3f) {
        EXPECT_EQ(found.token, argmax(row)) << "sequence " << i << " step " << step;
      }
      SequenceChunk& seq = batch.seqs[i];
      seq.start_pos += int(seq.tokens.size());
      seq.tokens = {g.continuations[i][size_t(step)]};
    }
  }
}

// rows[sequence][step]: the logits of a prompt's last token, then of each decode step.
using StepRows = std::vector<std::vector<std::vector<float>>>;

// `members` prefilled in one batch, then `steps` decode steps of all of them.
StepRows run_together(ModelRunner& runner, const GoldenSequences& g,
                      const std::vector<int>& members, int steps, BlockManager& blocks) {
  StepRows rows(members.size());
  Batch batch;
  for (int m : members) batch.seqs.push_back({g.prompts[m], 0, {}, false});
  Logits logits;
  for (int step = 0; step <= steps; ++step) {
    for (SequenceChunk& seq : batch.seqs)
      EXPECT_TRUE(blocks.ensure_capacity(seq.block_table, seq.start_pos + int(seq.tokens.size()),
                                         runner.kv_shape().block_size));
    runner.forward(batch, logits);
    EXPECT_EQ(logits.rows(), int(members.size()));
    for (size_t i = 0; i < members.size(); ++i) {
      rows[i].emplace_back(logits.row(int(i)).begin(), logits.row(int(i)).end());
      SequenceChunk& seq = batch.seqs[i];
      seq.start_pos += int(seq.tokens.size());
      seq.tokens = {g.continuations[members[i]][step]};
    }
  }
  for (SequenceChunk& seq : batch.seqs) blocks.release_all(seq.block_table);
  return rows;
}

// Each sequence's rows against the same sequence run alone, up to bf16 rounding.
void expect_rows_match_solo(ModelRunner& runner, const GoldenSequences& g, const StepRows& batched,
                            int steps, BlockManager& blocks, const char* what) {
  double worst = 0.0;
  for (int i = 0; i < int(batched.size()); ++i) {
    const auto alone = run_together(runner, g, {i}, steps, blocks);
    ASSERT_EQ(batched[i].size(), alone[0].size()) << "sequence " << i;
    for (int step = 0; step <= steps; ++step) {
      const double err = relative_l2(batched[i][step], alone[0][step]);
      EXPECT_LT(err, 1e-2) << "sequence " << i << " step " << step;
      if (top_two_gap(alone[0][step]) > 0.1f) {  // a near-tie may flip on rounding alone
        EXPECT_EQ(argmax(batched[i][step]), argmax(alone[0][step]))
            << "sequence " << i << " step " << step;
      }
      worst = std::max(worst, err);
    }
  }
  std::cout << what << " vs solo: worst relative L2 " << worst << "\n";
}

// 8 ragged prompts prefilled in one batch, then 12 decode steps of all 8, against each alone.
TEST(CudaRunner, BatchOfEightMatchesSolo) {
  SKIP_WITHOUT_CUDA();
  const auto cuda =
      make_cuda_runner(load_model(shared_path("models/stories260K")), test_options(512));
  const GoldenSequences g = golden_sequences();
  BlockManager blocks(cuda->kv_shape().num_blocks);
  const int steps = 12;
  const auto together = run_together(*cuda, g, {0, 1, 2, 3, 4, 5, 6, 7}, steps, blocks);
  expect_rows_match_solo(*cuda, g, together, steps, blocks, "batch of 8");
}

// 40 sequences: the decode step's projections take 40 rows (SkinnyGemm's larger tiles, or
// cuBLAS where warm-up timed it faster) inside a captured graph of that batch size, which the
// batches of 8 never reach.
TEST(CudaRunner, BatchOfFortyMatchesSolo) {
  SKIP_WITHOUT_CUDA();
  RunnerOptions options = test_options(512);
  options.max_num_seqs = 40;
  const auto cuda = make_cuda_runner(load_model(shared_path("models/stories260K")), options);
  const GoldenSequences g = golden_sequences(40);
  BlockManager blocks(cuda->kv_shape().num_blocks);
  std::vector<int> members(40);
  std::iota(members.begin(), members.end(), 0);
  const int steps = 6;
  const auto together = run_together(*cuda, g, members, steps, blocks);
  expect_rows_match_solo(*cuda, g, together, steps, blocks, "batch of 40");
}

// Prompts that join running sequences, as the scheduler's prefill batches carry them: each
// prompt in the same forward pass as the others' decode tokens (the prefill path), one of them
// in two chunks over two passes. Every sequence's rows match its solo run's.
TEST(CudaRunner, PromptsJoiningRunningSequencesMatchSolo) {
  SKIP_WITHOUT_CUDA();
  const auto cuda =
      make_cuda_runner(load_model(shared_path("models/stories260K")), test_options(512));
  const GoldenSequences g = golden_sequences();
  const std::vector<int> join_pass = {0, 0, 0, 0, 2, 2, 5, 5};
  const int split = 6, steps = 8;
  struct Member {
    int index;
    SequenceChunk chunk;
  };
  BlockManager blocks(cuda->kv_shape().num_blocks);
  StepRows rows(join_pass.size());
  std::vector<Member> active;
  Logits logits;
  for (int pass = 0; pass == 0 || !active.empty(); ++pass) {
    ASSERT_LT(pass, 100);
    for (int i = 0; i < int(join_pass.size()); ++i) {
      if (join_pass[i] != pass) continue;
      Member m{i, {g.prompts[i], 0, {}, false}};
      if (i == split) m.chunk.tokens.resize(m.chunk.tokens.size() / 2);
      active.insert(active.begin() + std::ptrdiff_t(active.size() / 2), std::move(m));
    }
    Batch batch;
    for (Member& m : active) {
      ASSERT_TRUE(blocks.ensure_capacity(m.chunk.block_table,
                                         m.chunk.start_pos + int(m.chunk.tokens.size()),
                                         cuda->kv_shape().block_size));
      batch.seqs.push_back(m.chunk);
    }
    cuda->forward(batch, logits);
    ASSERT_EQ(logits.rows(), int(active.size()));
    for (size_t s = 0; s < active.size(); ++s) {
      Member& m = active[s];
      const std::vector<int32_t>& prompt = g.prompts[m.index];
      const int end = m.chunk.start_pos + int(m.chunk.tokens.size());
      m.chunk.start_pos = end;
      if (end < int(prompt.size())) {  // the prompt's second chunk next
        m.chunk.tokens.assign(prompt.begin() + end, prompt.end());
        continue;
      }
      rows[m.index].emplace_back(logits.row(int(s)).begin(), logits.row(int(s)).end());
      const int step = int(rows[m.index].size()) - 1;
      m.chunk.tokens = {g.continuations[m.index][step]};
    }
    for (auto it = active.begin(); it != active.end();) {
      if (int(rows[it->index].size()) <= steps) {
        ++it;
        continue;
      }
      blocks.release_all(it->chunk.block_table);
      it = active.erase(it);
    }
  }
  expect_rows_match_solo(*cuda, g, rows, steps, blocks, "prompts joining running sequences");
}

#ifdef PIPELINE_HAVE_CUDA
// `count` random-h128 sequences of 230 to 325 tokens, prefixes of the golden ids followed by
// them reversed, each continued by the tokens after its prefix: one to feed back after the
// prompt and after each of `steps` decode steps (run_together feeds one after the last too).
GoldenSequences random_h128_sequences(int count, int steps) {
  std::vector<int32_t> ids = random_h128_ids();
  const std::vector<int32_t> reversed(ids.rbegin(), ids.rend());
  ids.insert(ids.end(), reversed.begin(), reversed.end());
  GoldenSequences g;
  for (int i = 0; i < count; ++i) {
    const auto end = ids.begin() + 230 + i * 37 % 96;
    g.prompts.emplace_back(ids.begin(), end);
    g.continuations.emplace_back(end, end + steps + 1);
  }
  return g;
}

// As many random-h128 sequences (head_dim 128) as the device has multiprocessors, decoding at
// contexts of 231 to 331 positions: enough blocks that the runner takes 256-position
// partitions, whose 16 stages wrap the pipelined attention kernel's ring, in captured graphs
// and behind the QKV projection (programmatic dependent launch), which neither the kernel tests
// nor one sequence's shorter partitions reach. The kernel is the one the warm-up timed faster
// at 64 sequences; gpu_check runs this test again with each set. Every seventh sequence against
// its solo run, which takes 64-position partitions, up to bf16 rounding (as the chunked prefill
// test).
TEST(CudaRunner, DecodeInLongPartitionsMatchesSolo) {
  SKIP_WITHOUT_CUDA();
  const auto weights = load_model(shared_path("models/random-h128-bf16"));
  const int multiprocessors = cuda::multiprocessor_count();
  const int seqs = multiprocessors, steps = 6;
  const GoldenSequences g = random_h128_sequences(seqs, steps);
  const int max_splits =  // as the runner sizes them
      (weights->config.max_position_embeddings + cuda::kDecodePartition - 1) /
      cuda::kDecodePartition;
  for (const int context : {326, 331})  // the longest at the first and the last decode step
    ASSERT_EQ(cuda::decode_partition(seqs, weights->config.num_kv_heads, context, multiprocessors,
                                     max_splits),
              cuda::kLongDecodePartition);
  RunnerOptions options = test_options(seqs * 24);
  options.max_num_seqs = seqs;
  const auto cuda = make_cuda_runner(weights, options);
  BlockManager blocks(cuda->kv_shape().num_blocks);
  std::vector<int> members(static_cast<size_t>(seqs));
  std::iota(members.begin(), members.end(), 0);
  const StepRows together = run_together(*cuda, g, members, steps, blocks);
  double worst = 0.0;
  for (int i = 0; i < seqs; i += 7) {
    const StepRows alone = run_together(*cuda, g, {i}, steps, blocks);
    for (int step = 0; step <= steps; ++step) {
      const double err = relative_l2(together[size_t(i)][size_t(step)], alone[0][size_t(step)]);
      EXPECT_LT(err, 2e-2) << "sequence " << i << " step " << step;
      worst = std::max(worst, err);
    }
  }
  std::cout << seqs << " sequences in 256-position partitions vs solo: worst relative L2 " << worst
            << "\n";
}

std::vector<float> as_floats(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

std::vector<__nv_bfloat16> random_bf16(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(uniform(rng));
  return v;
}

// x [rows, in] . w [out, in]^T in float64, from the same bf16 values the device multiplies.
std::vector<float> float64_product(const std::vector<__nv_bfloat16>& x,
                                   const std::vector<__nv_bfloat16>& w, int rows, int in, int out) {
  std::vector<float> y(size_t(rows) * out);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < out; ++c) {
      double sum = 0.0;
      for (int k = 0; k < in; ++k)
        sum += double(__bfloat162float(x[size_t(r) * in + k])) *
               double(__bfloat162float(w[size_t(c) * in + k]));
      y[size_t(r) * out + c] = float(sum);
    }
  return y;
}

// The projections at one row (the GEMV kernel), 2..64 (SkinnyGemm, each of its builds for up
// to 8, 16, 32 and 64 rows: 1000 inputs split the k axis across blocks, 264 do not) and more
// (cuBLAS), bf16 and float32 results and SiLU*mul of the columns taken as interleaved (gate, up)
// pairs, against a float64 product of the same bf16 values. Sizes are not multiples of the
// kernels' tiles. Then again after Gemm::tune() has timed SkinnyGemm, cuBLAS and cuBLASLt's
// proposals for each shape and product, whichever it chose.
TEST(CudaRunner, ProjectionsMatchFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    cuda::Gemm gemm(stream);
    for (const auto& [in, out, tuned] : {std::tuple{1000, 300, false}, std::tuple{264, 600, false},
                                         std::tuple{1000, 300, true}, std::tuple{264, 600, true}}) {
      const auto w = random_bf16(rng, size_t(out) * in);
      const auto w_d = cuda::upload(w);
      if (tuned) {
        constexpr int kRows = cuda::kSkinnyMaxRows;
        const auto x_d = cuda::upload(random_bf16(rng, size_t(kRows) * in));
        cuda::DeviceBuffer<__nv_bfloat16> y16_d(size_t(kRows) * out),
            act_d(size_t(kRows) * out / 2);
        cuda::DeviceBuffer<float> y32_d(size_t(kRows) * out);
        const std::vector<const __nv_bfloat16*> weights{w_d.data()};
        using Product = cuda::Gemm::Product;
        for (const auto& [product, y] :
             {std::pair<Product, void*>{Product::bf16, y16_d.data()},
              std::pair<Product, void*>{Product::f32, y32_d.data()},
              std::pair<Product, void*>{Product::silu_mul, act_d.data()}}) {
          const std::string report =
              gemm.tune(product, x_d.data(), weights, y, y16_d.data(), in, out, kRows);
          EXPECT_NE(report.find("64 rows: SkinnyGemm "), std::string::npos) << report;
          std::cout << in << " -> " << out << ": " << report << "\n";
        }
      }
      for (int rows : {1, 2, 3, 5, 8, 9, 16, 17, 24, 32, 33, 40, 64, 65}) {
        const auto x = random_bf16(rng, size_t(rows) * in);
        const std::vector<float> ref = float64_product(x, w, rows, in, out);
        std::vector<float> ref_act(ref.size() / 2);
        for (size_t i = 0; i < ref_act.size(); ++i) {
          const double gate = ref[2 * i], up = ref[2 * i + 1];
          ref_act[i] = float(gate / (1.0 + std::exp(-gate)) * up);
        }
        const auto x_d = cuda::upload(x);
        cuda::DeviceBuffer<__nv_bfloat16> y16_d(ref.size()), act_d(ref_act.size());
        cuda::DeviceBuffer<float> y32_d(ref.size());
        gemm.linear(x_d.data(), w_d.data(), y16_d.data(), rows, in, out);
        gemm.linear_f32(x_d.data(), w_d.data(), y32_d.data(), rows, in, out);
        const auto y16 = cuda::download(y16_d);
        const auto y32 = cuda::download(y32_d);
        // gate_up scratch for the cuBLAS rows: y16_d, already compared.
        gemm.linear_silu_mul(x_d.data(), w_d.data(), y16_d.data(), act_d.data(), rows, in, out / 2);
        const auto act = cuda::download(act_d);
        const std::string what = std::to_string(rows) + "x" + std::to_string(in) + " -> " +
                                 std::to_string(out) + (tuned ? " (tuned)" : "");
        EXPECT_LT(relative_l2(y32, ref), 1e-5) << what << ", float32";
        EXPECT_LT(relative_l2(as_floats(y16), ref), 5e-3) << what << ", bf16";
        // Every path rounds gate and up to bf16 before SiLU*mul, as cuBLAS rows are stored.
        EXPECT_LT(relative_l2(as_floats(act), ref_act), 1e-2) << what << ", SiLU*mul of the pairs";
      }
    }
  }
  cudaStreamDestroy(stream);
}

// An algorithm's split of k and how it sums the parts, from its configuration.
std::pair<int32_t, uint32_t> split_and_scheme(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 0;
  uint32_t scheme = 0;
  size_t written = 0;
  EXPECT_EQ(cuda::cublas().LtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                          &splits, sizeof splits, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cuda::cublas().LtMatmulAlgoConfigGetAttribute(
                &algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme, &written),
            CUBLAS_STATUS_SUCCESS);
  return {splits, scheme};
}

// Every algorithm cuBLASLt proposes for each SkinnyGemm build's row count (8, 16, 32, 64),
// against a float64 product: which one Gemm::tune() picks, if any, depends on the device's
// timings, so the test above may never run most of them. Each runs at the rows it was proposed
// for and at the fewest rows of the same build (2, 9, 17, 33), which the tuned route also sends
// to it where cuBLASLt takes them; bf16 and float32 results, on a shape whose long k and few
// columns invite splitting k (4096 -> 256) and one whose sizes are not multiples of tiles. A
// bf16 result's split-k parts must be summed in float32. y is cleared before each run, so a
// proposal that writes nothing, or part of y, fails.
TEST(CudaRunner, CublasLtProposalsMatchFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(11);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    cuda::DeviceBuffer<std::byte> workspace(size_t(32) << 20);
    cuda::CublasLtMatmul cublaslt(stream, workspace.data(), workspace.bytes());
    for (const auto& [in, out] : {std::pair{4096, 256}, std::pair{1000, 600}}) {
      const auto w = random_bf16(rng, size_t(out) * in);
      const auto w_d = cuda::upload(w);
      for (const auto& [proposed_for, fewest] :
           {std::pair{8, 2}, std::pair{16, 9}, std::pair{32, 17}, std::pair{64, 33}}) {
        for (const cudaDataType_t y_type : {CUDA_R_16BF, CUDA_R_32F}) {
          const bool bf16 = y_type == CUDA_R_16BF;
          const std::string problem = std::to_string(out) + "x" + std::to_string(in) + ", " +
                                      (bf16 ? "bf16" : "float32") + ", proposed for " +
                                      std::to_string(proposed_for) + " rows";
          const auto proposals =
              cublaslt.candidates(y_type, proposed_for, in, out, cuda::Gemm::kCublasLtCandidates);
          EXPECT_FALSE(proposals.empty()) << problem;
          for (size_t i = 0; i < proposals.size(); ++i) {
            const auto [splits, scheme] = split_and_scheme(proposals[i]);
            std::cout << problem << ": proposal " << i << " splits k " << splits
                      << " ways, reduction scheme " << scheme << "\n";
            // No part summed in bf16: neither in y itself nor in bf16 scratch.
            const uint32_t bf16_sums =
                CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
            if (bf16) {
              EXPECT_EQ(scheme & bf16_sums, 0u) << problem << ", proposal " << i;
            }
          }
          for (const int rows : {proposed_for, fewest}) {
            const auto x = random_bf16(rng, size_t(rows) * in);
            const auto x_d = cuda::upload(x);
            const std::vector<float> ref = float64_product(x, w, rows, in, out);
            cuda::DeviceBuffer<__nv_bfloat16> y16_d(ref.size());
            cuda::DeviceBuffer<float> y32_d(ref.size());
            void* y = bf16 ? static_cast<void*>(y16_d.data()) : static_cast<void*>(y32_d.data());
            const size_t y_bytes = bf16 ? y16_d.bytes() : y32_d.bytes();
            for (size_t i = 0; i < proposals.size(); ++i) {
              const std::string what = problem + ", proposal " + std::to_string(i) + " at " +
                                       std::to_string(rows) + " rows";
              // Where cuBLASLt does not take these rows, Gemm's route takes its fallback.
              if (!cublaslt.runs(proposals[i], y_type, rows, in, out)) {
                EXPECT_NE(rows, proposed_for) << what << ": proposed, but does not run";
                continue;
              }
              ASSERT_EQ(cudaMemsetAsync(y, 0, y_bytes, stream), cudaSuccess);
              if (!cublaslt.run(proposals[i], x_d.data(), w_d.data(), y, y_type, rows, in, out)) {
                EXPECT_NE(rows, proposed_for) << what << ": proposed, but turned down";
                continue;
              }
              ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
              const double error = bf16 ? relative_l2(as_floats(cuda::download(y16_d)), ref)
                                        : relative_l2(cuda::download(y32_d), ref);
              EXPECT_LT(error, bf16 ? 5e-3 : 1e-5) << what;
            }
          }
        }
      }
    }
  }
  cudaStreamDestroy(stream);
}
#endif

// PIPELINE_CUDA_DECODE_ATTENTION set to `value` (unset where null) for the guard's life.
class DecodeAttentionSetting : public EnvironmentSetting {
 public:
  explicit DecodeAttentionSetting(const char* value)
      : EnvironmentSetting("PIPELINE_CUDA_DECODE_ATTENTION", value) {}
};

// The setup report's line about the decode attention kernels.
std::string decode_attention_line(const ModelRunner& runner) {
  for (const std::string& line : runner.setup_report())
    if (line.starts_with("decode attention: ")) return line;
  return "";
}

// The warm-up times both decode attention kernels at each batch up to the runner's largest (8
// here; stories260K's 512 positions) and says which it took; the environment may set one
// instead, and a name that is neither is refused.
TEST(CudaRunner, DecodeAttentionKernelIsTimedPerBatchOrSetByTheEnvironment) {
  SKIP_WITHOUT_CUDA();
  const auto weights = load_model(shared_path("models/stories260K"));
  {
    const DecodeAttentionSetting unset(nullptr);
    const std::string line = decode_attention_line(*make_cuda_runner(weights, test_options()));
    EXPECT_TRUE(line.starts_with("decode attention: batch 1 at 512 positions in partitions of "))
        << line;
    const size_t second = line.find("; batch 8 at 512 positions in partitions of ");
    EXPECT_NE(second, std::string::npos) << line;
    for (const std::string& clause : {line.substr(0, second), line.substr(second)}) {
      EXPECT_NE(clause.find("direct "), std::string::npos) << clause;
      EXPECT_NE(clause.find(", pipelined "), std::string::npos) << clause;
      EXPECT_TRUE(clause.ends_with("-> direct") || clause.ends_with("-> pipelined")) << clause;
    }
  }
  {
    const DecodeAttentionSetting pipelined("pipelined");
    EXPECT_EQ(decode_attention_line(*make_cuda_runner(weights, test_options())),
              "decode attention: pipelined, set by PIPELINE_CUDA_DECODE_ATTENTION");
  }
  const DecodeAttentionSetting unknown("Pipelined");
  try {
    make_cuda_runner(weights, test_options());
    ADD_FAILURE() << "an unknown kernel name was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "PIPELINE_CUDA_DECODE_ATTENTION: no decode attention kernel is named "
                 "'Pipelined' (direct or pipelined)");
  }
}

TEST(CudaRunner, RejectsBadBatchesAndOversizedPools) {
  SKIP_WITHOUT_CUDA();
  const auto weights = load_model(shared_path("models/stories260K"));
  const auto cuda = make_cuda_runner(weights, test_options(8));
  EXPECT_EQ(cuda->kv_shape().num_blocks, 8);
  EXPECT_EQ(cuda->kv_shape().dtype, DType::BF16);
  EXPECT_EQ(cuda->device_name(), "cuda");
  Batch batch;
  batch.seqs.push_back({{1, 2, 3}, 0, {8}, false});  // block 8 is outside a pool of 8
  Logits logits;
  EXPECT_THROW(cuda->forward(batch, logits), std::invalid_argument);
  batch.seqs[0] = {{1, 2, 3}, 0, {0}, false};
  batch.seqs[0].tokens[1] = weights->config.vocab_size;  // token outside the vocabulary
  EXPECT_THROW(cuda->forward(batch, logits), std::invalid_argument);
  EXPECT_THROW(make_cuda_runner(weights, test_options(INT_MAX)), std::runtime_error);
  RunnerOptions f32_kv = test_options(8);
  f32_kv.kv_cache_dtype = DType::F32;  // the CUDA kernels read a bf16 cache only
  EXPECT_THROW(make_cuda_runner(weights, f32_kv), std::invalid_argument);
  RunnerOptions f32_activations = test_options(8);
  f32_activations.matmul_activations = DType::F32;  // and multiply bf16 activations only
  EXPECT_THROW(make_cuda_runner(weights, f32_activations), std::invalid_argument);
}

}  // namespace
}  // namespace pipeline
