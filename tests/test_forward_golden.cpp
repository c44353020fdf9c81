// The CPU forward pass against reference outputs computed independently (llama2.c's run.c and a
// float64 Hugging Face-convention forward pass): greedy tokens and logits of stories260K in f32
// and bf16, and logits of a random head_dim-128 GQA model at positions up to 300, both prefilled
// at once and decoded token by token through the paged KV cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/packed_matmul.h"
#include "model/batch.h"
#include "model/cpu_runner.h"
#include "model/kv_cache.h"
#include "model/llama_weights.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using nlohmann::json;
using testing::shared_path;

json read_json(const std::string& relative) {
  std::ifstream in(shared_path(relative));
  return json::parse(in);
}

std::shared_ptr<const LlamaWeights> load_model(const std::string& relative) {
  return std::make_shared<const LlamaWeights>(LlamaWeights::load(shared_path(relative)));
}

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// Greedy decoding with a plain argmax loop: the prompt in one forward pass, then one token per
// step. `first_logits` receives the logits that predict the first generated token.
std::vector<int32_t> greedy(ModelRunner& runner, const std::vector<int32_t>& prompt, int steps,
                            std::vector<float>* first_logits = nullptr) {
  BlockManager blocks(runner.kv_shape().num_blocks);
  const int block_size = runner.kv_shape().block_size;
  Batch batch;
  batch.seqs.resize(1);
  SequenceChunk& seq = batch.seqs[0];
  seq.tokens = prompt;
  Logits logits;
  std::vector<int32_t> generated;
  while (int(generated.size()) < steps) {
    EXPECT_TRUE(blocks.ensure_capacity(seq.block_table, seq.start_pos + int(seq.tokens.size()),
                                       block_size));
    runner.forward(batch, logits);
    EXPECT_EQ(logits.rows(), 1);
    if (generated.empty() && first_logits)
      first_logits->assign(logits.row(0).begin(), logits.row(0).end());
    generated.push_back(argmax(logits.row(0)));
    seq.start_pos += int(seq.tokens.size());
    seq.tokens = {generated.back()};
  }
  return generated;
}

float max_abs_diff(std::span<const float> a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float diff = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff;
}

double relative_l2(std::span<const float> ours, const std::vector<float>& ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < std::min(ours.size(), ref.size()); ++i) {
    err += (double(ours[i]) - ref[i]) * (double(ours[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return std::sqrt(err / norm);
}

TEST(ForwardGolden, Stories260KF32GreedyTokensAndLogits) {
  const json golden = read_json("golden/stories260K_greedy.json");
  const auto runner = make_cpu_runner(load_model("models/stories260K"), RunnerOptions{});
  float worst = 0.0f;
  for (const json& c : golden["cases"]) {
    SCOPED_TRACE("prompt '" + c["prompt"].get<std::string>() + "'");
    const auto prompt = c["prompt_ids_sentencepiece"].get<std::vector<int32_t>>();
    const auto expected = c["generated_ids"].get<std::vector<int32_t>>();
    std::vector<float> first_logits;
    EXPECT_EQ(greedy(*runner, prompt, int(expected.size()), &first_logits), expected);
    if (c.contains("first_position_logits")) {
      const auto ref = c["first_position_logits"]["all_logits_run_c"].get<std::vector<float>>();
      const float diff = max_abs_diff(first_logits, ref);
      EXPECT_LT(diff, 1e-4f);
      worst = std::max(worst, diff);
    }
  }
  std::cout << "stories260K f32: first-position logits max abs error " << worst << "\n";
}

TEST(ForwardGolden, Stories260KBf16LogitsAndFirstGreedyTokens) {
  const json golden = read_json("golden/stories260K_greedy.json");
  const auto runner = make_cpu_runner(load_model("models/stories260K-bf16"), RunnerOptions{});
  float worst = 0.0f;
  for (const json& c : golden["cases"]) {
    SCOPED_TRACE("prompt '" + c["prompt"].get<std::string>() + "'");
    const auto prompt = c["prompt_ids_sentencepiece"].get<std::vector<int32_t>>();
    const auto expected = c["generated_ids"].get<std::vector<int32_t>>();
    std::vector<float> first_logits;
    const std::vector<int32_t> generated = greedy(*runner, prompt, 8, &first_logits);
    EXPECT_EQ(generated, std::vector<int32_t>(expected.begin(), expected.begin() + 8));
    if (c.contains("first_position_logits")) {
      // The f32 reference: bf16 rounding of the weights moves the logits by up to about 0.08.
      const auto ref = c["first_position_logits"]["all_logits_run_c"].get<std::vector<float>>();
      const float diff = max_abs_diff(first_logits, ref);
      EXPECT_LT(diff, 0.15f);
      worst = std::max(worst, diff);
    }
  }
  std::cout << "stories260K bf16: first-position logits max abs error vs f32 reference " << worst
            << "\n";
}

struct RandomH128Golden {
  std::vector<int32_t> ids;
  std::vector<int> positions;
  json logits;

  RandomH128Golden() {
    const json golden = read_json("golden/random-h128_logits.json");
    ids = golden["ids"].get<std::vector<int32_t>>();
    positions = golden["positions"].get<std::vector<int>>();
    logits = golden["logits"];
  }
  std::vector<float> at(int pos) const {
    return logits[std::to_string(pos)].get<std::vector<float>>();
  }
};

TEST(ForwardGolden, RandomH128AllLogitsInOnePrefill) {
  const RandomH128Golden golden;
  const auto runner = make_cpu_runner(load_model("models/random-h128-bf16"), RunnerOptions{});
  BlockManager blocks(runner->kv_shape().num_blocks);
  Batch batch;
  batch.seqs.push_back({golden.ids, 0, {}, true});
  ASSERT_TRUE(blocks.ensure_capacity(batch.seqs[0].block_table, int(golden.ids.size()),
                                     runner->kv_shape().block_size));
  Logits logits;
  runner->forward(batch, logits);
  ASSERT_EQ(logits.rows(), int(golden.ids.size()));
  double worst = 0.0;
  for (int pos : golden.positions) {
    const double err = relative_l2(logits.row(pos), golden.at(pos));
    EXPECT_LT(err, 2e-2) << "position " << pos;
    worst = std::max(worst, err);
  }
  std::cout << "random-h128 prefill: worst relative L2 error " << worst << "\n";
}

// The first 128 ids prefilled, then the rest decoded one by one, with the KV cache in `kv_dtype`
// and the matmuls' activations in `activations`: every listed position's logits within `bound`
// (relative L2) of the float64 reference.
void check_prefill_then_decode(DType kv_dtype, DType activations, double bound) {
  SCOPED_TRACE(std::string("KV cache in ") + dtype_name(kv_dtype) + ", activations in " +
               dtype_name(activations));
  const RandomH128Golden golden;
  RunnerOptions options;
  options.kv_cache_dtype = kv_dtype;
  options.matmul_activations = activations;
  const auto runner = make_cpu_runner(load_model("models/random-h128-bf16"), options);
  ASSERT_EQ(runner->kv_shape().dtype, kv_dtype);
  const int block_size = runner->kv_shape().block_size;
  BlockManager blocks(runner->kv_shape().num_blocks);
  const int prefill = 128;
  Batch batch;
  batch.seqs.push_back({{golden.ids.begin(), golden.ids.begin() + prefill}, 0, {}, true});
  SequenceChunk& seq = batch.seqs[0];
  ASSERT_TRUE(blocks.ensure_capacity(seq.block_table, prefill, block_size));
  Logits logits;
  runner->forward(batch, logits);
  ASSERT_EQ(logits.rows(), prefill);

  double worst = 0.0;
  int checked = 0;
  const auto check = [&](int pos, std::span<const float> row) {
    if (std::find(golden.positions.begin(), golden.positions.end(), pos) == golden.positions.end())
      return;
    const double err = relative_l2(row, golden.at(pos));
    EXPECT_LT(err, bound) << "position " << pos;
    worst = std::max(worst, err);
    ++checked;
  };
  for (int pos = 0; pos < prefill; ++pos) check(pos, logits.row(pos));
  for (int pos = prefill; pos < int(golden.ids.size()); ++pos) {
    seq = {{golden.ids[pos]}, pos, std::move(seq.block_table), false};
    ASSERT_TRUE(blocks.ensure_capacity(seq.block_table, pos + 1, block_size));
    runner->forward(batch, logits);
    ASSERT_EQ(logits.rows(), 1);
    check(pos, logits.row(0));
  }
  EXPECT_EQ(checked, int(golden.positions.size()));
  std::cout << "random-h128 prefill 128 + decode, KV cache in " << dtype_name(kv_dtype)
            << ", activations in " << dtype_name(activations) << ": worst relative L2 error "
            << worst << "\n";
}

// Rounding the activations and the cached keys and values to bf16, as the CUDA backend does,
// stays within the bound the CUDA runner is held to (the reference is float64 throughout).
TEST(ForwardGolden, RandomH128PrefillThenDecodeWithBf16ActivationsAndEitherKvCache) {
  check_prefill_then_decode(DType::F32, DType::BF16, 2e-2);
  check_prefill_then_decode(DType::BF16, DType::BF16, 2e-2);
}

// With float32 activations and a float32 cache, only the bf16 weights are rounded: the logits
// are then float32-exact up to summation order.
TEST(ForwardGolden, RandomH128PrefillThenDecodeWithF32ActivationsAndKvCache) {
  check_prefill_then_decode(DType::F32, DType::F32, 1e-4);
}

// A runner sized for one short context, for the error cases.
std::unique_ptr<ModelRunner> small_stories_runner() {
  RunnerOptions options;
  options.kv_block_size = 4;
  options.kv_cache_blocks = 8;
  return make_cpu_runner(load_model("models/stories260K"), options);
}

TEST(ForwardErrors, BlockTableTooShort) {
  const auto runner = small_stories_runner();
  Batch batch;
  batch.seqs.push_back({{1, 2, 3, 4, 5}, 0, {0}, false});  // 5 positions need 2 blocks of 4
  Logits logits;
  EXPECT_THROW(runner->forward(batch, logits), std::invalid_argument);
  batch.seqs[0].block_table = {0, 8};  // a block outside the pool
  EXPECT_THROW(runner->forward(batch, logits), std::invalid_argument);
  batch.seqs[0].block_table = {0, 7};
  EXPECT_NO_THROW(runner->forward(batch, logits));
}

TEST(ForwardErrors, TokenOutsideVocabulary) {
  const auto runner = small_stories_runner();
  Batch batch;
  batch.seqs.push_back({{1, 512}, 0, {0}, false});
  Logits logits;
  EXPECT_THROW(runner->forward(batch, logits), std::invalid_argument);
  batch.seqs[0].tokens = {1, -1};
  EXPECT_THROW(runner->forward(batch, logits), std::invalid_argument);
}

TEST(ForwardErrors, PositionBeyondContext) {
  RunnerOptions options;
  options.kv_cache_blocks = 64;
  const auto runner = make_cpu_runner(load_model("models/stories260K"), options);
  std::vector<int32_t> table(33);
  for (int i = 0; i < 33; ++i) table[i] = i;
  Batch batch;
  batch.seqs.push_back({{1}, 512, table, false});  // max_position_embeddings is 512
  Logits logits;
  EXPECT_THROW(runner->forward(batch, logits), std::invalid_argument);
  batch.seqs[0].start_pos = 511;
  EXPECT_NO_THROW(runner->forward(batch, logits));
}

TEST(CpuRunnerOptions, DerivesPoolFromMaxNumSeqsAndRejectsBadOptions) {
  const auto weights = load_model("models/stories260K");
  RunnerOptions options;
  options.max_num_seqs = 3;
  const auto runner = make_cpu_runner(weights, options);
  EXPECT_EQ(runner->kv_shape().num_blocks, 3 * 512 / 16);  // three full 512-token contexts
  EXPECT_EQ(runner->kv_shape().block_size, 16);
  EXPECT_EQ(runner->device_name(), "cpu");
  options.kv_block_size = 0;
  EXPECT_THROW(make_cpu_runner(weights, options), std::invalid_argument);
  options.kv_block_size = 16;
  options.threads = -1;
  EXPECT_THROW(make_cpu_runner(weights, options), std::invalid_argument);
  options.threads = 0;
  options.matmul_activations = DType::F16;
  EXPECT_THROW(make_cpu_runner(weights, options), std::invalid_argument);
}

// The start-up report names the matmul kernel and what its activations are rounded to: bf16 only
// for a bf16 checkpoint that asks for it.
TEST(CpuRunnerOptions, ReportsTheMatmulActivations) {
  RunnerOptions options;
  options.max_num_seqs = 1;
  // vdpbf16ps serves bf16 weights only (where it was timed the faster, for each kind of
  // activations on its own); float32 ones take the AVX-512 kernel on such a CPU.
  const std::string bf16_isa = cpu::isa_name(cpu::bf16_matmul_isa(DType::BF16));
  const std::string bf16_f32_isa = cpu::isa_name(cpu::bf16_matmul_isa(DType::F32));
  const std::string f32_isa = cpu::isa_name(cpu::best_isa());
  const auto bf16_weights = load_model("models/stories260K-bf16");
  EXPECT_EQ(make_cpu_runner(bf16_weights, options)->setup_report(),
            std::vector<std::string>{"matmuls on " + bf16_isa + ", activations in BF16"});
  EXPECT_EQ(make_cpu_runner(load_model("models/stories260K"), options)->setup_report(),
            std::vector<std::string>{"matmuls on " + f32_isa + ", activations in F32"});
  options.matmul_activations = DType::F32;
  EXPECT_EQ(make_cpu_runner(bf16_weights, options)->setup_report(),
            std::vector<std::string>{"matmuls on " + bf16_f32_isa + ", activations in F32"});
}

// Auto follows the weights: float32 KV for a float32 checkpoint, bf16 for a bf16 one, which
// then fits twice the blocks in the same bytes.
TEST(CpuRunnerOptions, KvCacheDtypeFollowsTheWeightsUnlessGiven) {
  RunnerOptions options;
  options.max_num_seqs = 2;
  EXPECT_EQ(make_cpu_runner(load_model("models/stories260K"), options)->kv_shape().dtype,
            DType::F32);
  const auto bf16_weights = load_model("models/stories260K-bf16");
  EXPECT_EQ(make_cpu_runner(bf16_weights, options)->kv_shape().dtype, DType::BF16);
  options.kv_cache_dtype = DType::F32;
  EXPECT_EQ(make_cpu_runner(bf16_weights, options)->kv_shape().dtype, DType::F32);
  options.kv_cache_dtype = DType::F16;
  EXPECT_THROW(make_cpu_runner(bf16_weights, options), std::invalid_argument);

  // A pool sized by the machine's memory holds twice the blocks in bf16.
  RunnerOptions sized_by_memory;
  sized_by_memory.max_num_seqs = 1'000'000;
  sized_by_memory.kv_cache_dtype = DType::F32;
  const int f32_blocks = make_cpu_runner(bf16_weights, sized_by_memory)->kv_shape().num_blocks;
  sized_by_memory.kv_cache_dtype = DType::BF16;
  const int bf16_blocks = make_cpu_runner(bf16_weights, sized_by_memory)->kv_shape().num_blocks;
  EXPECT_NEAR(bf16_blocks, 2 * f32_blocks, 1);
}

TEST(CpuRunnerOptions, RefusesAKvPoolLargerThanTheMachinesMemory) {
  const auto weights = load_model("models/stories260K");
  const auto message_of = [&](const RunnerOptions& options) -> std::string {
    try {
      make_cpu_runner(weights, options);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "accepted";
  };
  RunnerOptions many_blocks;
  many_blocks.kv_cache_blocks = 2'000'000'000;  // 2e9 blocks of 20 KiB
  EXPECT_EQ(
      message_of(many_blocks).rfind("the KV cache of 2000000000 blocks of 16 tokens needs ", 0), 0u)
      << message_of(many_blocks);
  RunnerOptions huge_block;
  huge_block.kv_block_size = 2'147'483'647;  // the derived pool: one block of 2.5 TiB
  EXPECT_NE(
      message_of(huge_block).find("lower scheduler.kv_cache_blocks or scheduler.kv_block_size"),
      std::string::npos)
      << message_of(huge_block);
}

TEST(CpuRunnerOptions, OwnThreadArenaGivesTheSameLogits) {
  const auto weights = load_model("models/stories260K");
  RunnerOptions one_thread;
  one_thread.threads = 1;
  const auto a = make_cpu_runner(weights, one_thread);
  const auto b = make_cpu_runner(weights, RunnerOptions{});
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  std::vector<float> la, lb;
  EXPECT_EQ(greedy(*a, prompt, 4, &la), greedy(*b, prompt, 4, &lb));
  EXPECT_EQ(la, lb);
}

}  // namespace
}  // namespace pipeline
