// Continuous batching on the CPU runner: eight prompts decoded greedily together, joining the
// running batch at different steps (their prefill in the same Batch as the others' decode, one
// prompt prefilled in two chunks), give exactly the tokens each gives alone. The KV pool is small
// and fragmented, so block tables are non-contiguous and interleaved, and finished sequences'
// blocks are reused by later ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "model/batch.h"
#include "model/cpu_runner.h"
#include "model/kv_cache.h"
#include "model/llama_weights.h"
#include "model/sampling.h"
#include "tests/support/shared_data.h"

// Counts the C++ heap allocations of this test program, to check that decode steps make none.
// GCC cannot see that these replacements pair malloc with free, hence the pragma.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
std::atomic<long> g_allocations{0};

void* operator new(std::size_t size) {
  ++g_allocations;
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace pipeline {
namespace {

constexpr int kNewTokens = 24;

std::shared_ptr<const LlamaWeights> stories260k() {
  static const auto weights = std::make_shared<const LlamaWeights>(
      LlamaWeights::load(testing::shared_path("models/stories260K")));
  return weights;
}

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// Eight prompts of different lengths (BOS + token ids the model knows).
std::vector<std::vector<int32_t>> prompts() {
  return {{1},
          {1, 403, 407, 261, 378},
          {1, 317, 391, 266, 267},
          {1, 385, 328, 432, 261, 268, 414, 422, 395, 326},
          {1,   274, 287, 269, 345, 357, 263, 377, 267, 265, 349, 414, 276, 267, 268, 425, 422,
           262, 287, 411, 261, 339, 305, 419, 426, 274, 287, 394, 261, 370, 352, 266, 267, 422},
          {1, 268, 414},
          {1, 370, 352, 266, 267, 422, 280, 295, 269, 336, 432, 403, 407, 261},
          {1, 432, 383, 286, 261, 376, 298, 315}};
}

std::vector<int32_t> greedy_alone(ModelRunner& runner, const std::vector<int32_t>& prompt) {
  BlockManager blocks(runner.kv_shape().num_blocks);
  Batch batch;
  batch.seqs.push_back({prompt, 0, {}, false});
  SequenceChunk& seq = batch.seqs[0];
  Logits logits;
  std::vector<int32_t> out;
  while (int(out.size()) < kNewTokens) {
    EXPECT_TRUE(blocks.ensure_capacity(seq.block_table, seq.start_pos + int(seq.tokens.size()),
                                       runner.kv_shape().block_size));
    runner.forward(batch, logits);
    out.push_back(argmax(logits.row(0)));
    seq.start_pos += int(seq.tokens.size());
    seq.tokens = {out.back()};
  }
  return out;
}

// A BlockManager whose free list is shuffled, so consecutive allocations are far apart.
void fragment(BlockManager& blocks, std::mt19937& rng) {
  std::vector<int32_t> all(size_t(blocks.num_total()));
  for (int32_t& b : all) b = blocks.allocate();
  std::shuffle(all.begin(), all.end(), rng);
  for (int32_t b : all) blocks.release(b);
}

struct Running {
  int index;                 // which prompt
  SequenceChunk chunk;       // what it brings to the next Batch
  std::vector<int32_t> out;  // generated so far
};

TEST(Batching, StaggeredJoinsGiveTheSameTokensAsAlone) {
  const auto all_prompts = prompts();
  std::vector<std::vector<int32_t>> alone;
  {
    const auto runner = make_cpu_runner(stories260k(), RunnerOptions{});
    for (const auto& p : all_prompts) alone.push_back(greedy_alone(*runner, p));
  }

  RunnerOptions options;
  options.kv_block_size = 4;
  options.kv_cache_blocks = 64;  // fewer than the 72 blocks all eight need: finished ones make room
  const auto runner = make_cpu_runner(stories260k(), options);
  const int block_size = 4;
  BlockManager blocks(options.kv_cache_blocks);
  std::mt19937 rng(11);
  fragment(blocks, rng);

  // Decode step at which each prompt joins; prompt 4 (34 tokens) is prefilled in two chunks.
  const std::vector<int> join_step = {0, 0, 2, 3, 5, 5, 9, 30};
  const size_t split_prompt = 4, split_at = 20;
  std::vector<std::vector<int32_t>> together(all_prompts.size());
  std::vector<Running> running;
  Batch batch;
  Logits logits;
  std::vector<std::vector<int32_t>> tables_seen;
  for (int step = 0; step < 200 && std::any_of(together.begin(), together.end(),
                                               [](const auto& t) { return t.size() < kNewTokens; });
       ++step) {
    for (size_t i = 0; i < all_prompts.size(); ++i) {
      if (join_step[i] != step) continue;
      Running r{int(i), {all_prompts[i], 0, {}, false}, {}};
      if (i == split_prompt) r.chunk.tokens.resize(split_at);
      // Newcomers go to the front, so prefill and decode rows interleave in the packed batch.
      running.insert(running.begin() + std::ptrdiff_t(running.size() / 2), std::move(r));
    }
    batch.seqs.clear();
    for (Running& r : running) {
      ASSERT_TRUE(blocks.ensure_capacity(
          r.chunk.block_table, r.chunk.start_pos + int(r.chunk.tokens.size()), block_size))
          << "pool exhausted at step " << step;
      batch.seqs.push_back(r.chunk);
    }
    runner->forward(batch, logits);
    ASSERT_EQ(logits.rows(), int(running.size()));
    for (size_t s = 0; s < running.size(); ++s) {
      Running& r = running[s];
      SequenceChunk& c = r.chunk;
      const int end = c.start_pos + int(c.tokens.size());
      if (size_t(r.index) == split_prompt &&
          end == int(split_at)) {  // second half of the prompt next
        c.tokens.assign(all_prompts[split_prompt].begin() + split_at,
                        all_prompts[split_prompt].end());
        c.start_pos = end;
        continue;
      }
      r.out.push_back(argmax(logits.row(int(s))));
      c.start_pos = end;
      c.tokens = {r.out.back()};
    }
    // Finished sequences leave and hand their blocks to the ones still to come.
    for (auto it = running.begin(); it != running.end();) {
      if (int(it->out.size()) < kNewTokens) {
        ++it;
        continue;
      }
      together[it->index] = it->out;
      tables_seen.push_back(it->chunk.block_table);
      blocks.release_all(it->chunk.block_table);
      it = running.erase(it);
    }
  }

  for (size_t i = 0; i < all_prompts.size(); ++i)
    EXPECT_EQ(together[i], alone[i]) << "prompt " << i;
  // The tables really were scattered: some neighbouring entries are not consecutive ids.
  int jumps = 0;
  for (const auto& t : tables_seen) {
    for (size_t j = 1; j < t.size(); ++j) jumps += t[j] != t[j - 1] + 1;
  }
  EXPECT_GT(jumps, 20);
  EXPECT_EQ(blocks.num_free(), blocks.num_total());
}

TEST(Batching, AllLogitsRowsComeInBatchOrder) {
  const auto runner = make_cpu_runner(stories260k(), RunnerOptions{});
  BlockManager blocks(runner->kv_shape().num_blocks);
  const int bs = runner->kv_shape().block_size;
  const std::vector<int32_t> a = {1, 403, 407, 261}, b = {1, 317, 391};
  Batch batch;
  batch.seqs.push_back({a, 0, {}, true});
  batch.seqs.push_back({b, 0, {}, false});
  for (SequenceChunk& s : batch.seqs)
    ASSERT_TRUE(blocks.ensure_capacity(s.block_table, int(s.tokens.size()), bs));
  Logits both;
  runner->forward(batch, both);
  ASSERT_EQ(both.rows(), 5);

  // The same rows, computed one sequence at a time in fresh blocks.
  Batch solo;
  Logits la, lb;
  solo.seqs.push_back({a, 0, {}, true});
  ASSERT_TRUE(blocks.ensure_capacity(solo.seqs[0].block_table, 4, bs));
  runner->forward(solo, la);
  solo.seqs[0] = {b, 0, {}, false};
  ASSERT_TRUE(blocks.ensure_capacity(solo.seqs[0].block_table, 3, bs));
  runner->forward(solo, lb);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(std::equal(both.row(r).begin(), both.row(r).end(), la.row(r).begin()))
        << "row " << r;
  }
  EXPECT_TRUE(std::equal(both.row(4).begin(), both.row(4).end(), lb.row(0).begin()));
}

// A batch whose every chunk is argmax_only gets each row's argmax_of (the rows' own, computed the
// same way) and no rows; one chunk that wants its row gets every row back.
TEST(Batching, AnArgmaxOnlyBatchGetsEachRowsArgmaxInsteadOfTheRows) {
  const auto runner = make_cpu_runner(stories260k(), RunnerOptions{});
  BlockManager blocks(runner->kv_shape().num_blocks);
  const int bs = runner->kv_shape().block_size;
  const auto batch_of = [&](bool first_argmax_only) {
    Batch batch;
    for (const auto& p : {prompts()[1], prompts()[2], prompts()[3]}) {
      batch.seqs.push_back({p, 0, {}, false, true});
      EXPECT_TRUE(blocks.ensure_capacity(batch.seqs.back().block_table, int(p.size()), bs));
    }
    batch.seqs[0].argmax_only = first_argmax_only;
    return batch;
  };
  Logits rows, argmaxes;
  runner->forward(batch_of(false), rows);
  ASSERT_EQ(rows.rows(), 3);
  EXPECT_TRUE(rows.argmax.empty());
  runner->forward(batch_of(true), argmaxes);
  ASSERT_EQ(argmaxes.rows(), 3);
  EXPECT_TRUE(argmaxes.data.empty());
  for (int r = 0; r < 3; ++r) {
    const RowArgmax expected = argmax_of(rows.row(r));
    EXPECT_EQ(argmaxes.argmax[size_t(r)].token, expected.token) << "row " << r;
    EXPECT_EQ(argmaxes.argmax[size_t(r)].value, expected.value) << "row " << r;
    EXPECT_EQ(expected.token, argmax(rows.row(r))) << "row " << r;
  }
}

// The CPU runner asks the model step's watch before each layer and stops a pass it no longer
// wants with PassAbandoned; the same pass run again whole (its K and V slots rewritten) gives
// the logits it gives unwatched.
TEST(Batching, ARunnerStopsAPassItsWatchNoLongerWants) {
  const auto runner = make_cpu_runner(stories260k(), RunnerOptions{});
  const int layers = runner->config().num_layers;
  ASSERT_GE(layers, 3);
  BlockManager blocks(runner->kv_shape().num_blocks);
  Batch batch;
  batch.seqs.push_back({{1, 403, 407, 261}, 0, {}, false});
  ASSERT_TRUE(blocks.ensure_capacity(batch.seqs[0].block_table, 4, runner->kv_shape().block_size));
  Logits unwatched, watched;
  runner->forward(batch, unwatched);

  int asked = 0;
  runner->watch_pass([&] { return ++asked <= 2; });  // wanted for the first two layers
  EXPECT_THROW(runner->forward(batch, watched), PassAbandoned);
  EXPECT_EQ(asked, 3);
  runner->watch_pass([&] { return ++asked > 0; });
  runner->forward(batch, watched);
  EXPECT_EQ(asked, 3 + layers);
  runner->watch_pass(nullptr);
  EXPECT_TRUE(std::ranges::equal(watched.row(0), unwatched.row(0)));
}

TEST(Batching, DecodeStepsDoNotAllocateOnceWarm) {
  const auto runner = make_cpu_runner(stories260k(), RunnerOptions{});
  BlockManager blocks(runner->kv_shape().num_blocks);
  const int bs = runner->kv_shape().block_size;
  Batch batch;
  for (const auto& p : prompts()) {
    batch.seqs.push_back({p, 0, {}, false});
    ASSERT_TRUE(blocks.ensure_capacity(batch.seqs.back().block_table, int(p.size()) + 40, bs));
  }
  Logits logits;
  runner->forward(batch, logits);  // the prefill sizes the scratch buffers
  for (SequenceChunk& s : batch.seqs) {
    s.start_pos = int(s.tokens.size());
    s.tokens.assign(1, 300);
  }
  runner->forward(batch, logits);  // the first decode step sizes the logits
  for (SequenceChunk& s : batch.seqs) s.argmax_only = true;
  runner->forward(batch, logits);  // the first greedy step sizes the argmaxes
  const long before = g_allocations.load();
  for (int step = 0; step < 30; ++step) {
    for (SequenceChunk& s : batch.seqs) {
      ++s.start_pos;
      s.argmax_only = step % 2 == 0;  // greedy steps and steps that return rows, in turn
    }
    runner->forward(batch, logits);
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
}

}  // namespace
}  // namespace pipeline
