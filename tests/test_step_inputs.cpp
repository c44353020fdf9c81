// The CUDA runner's host side of a step (kernels/cuda/step_inputs.h): the checks a batch must
// pass and the packed index arrays every kernel of the step reads. Plain C++, so it runs here
// whether or not a GPU is present; it needs only a build with the CUDA backend.
#include <gtest/gtest.h>

#ifdef PIPELINE_HAVE_CUDA
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/step_inputs.h"

namespace pipeline::cuda {
namespace {

LlamaConfig config() {
  LlamaConfig c;
  c.vocab_size = 100;
  c.max_position_embeddings = 64;
  return c;
}

KvCacheShape pool(int block_size, int num_blocks) {
  KvCacheShape kv;
  kv.block_size = block_size;
  kv.num_blocks = num_blocks;
  return kv;
}

std::string validation_error(const Batch& batch, const KvCacheShape& kv) {
  try {
    validate_batch(batch, config(), kv);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(StepInputs, ValidationNamesTheSequenceAndWhatIsWrong) {
  const KvCacheShape kv = pool(4, 8);
  EXPECT_EQ(validation_error(Batch{}, kv), "CUDA forward: the batch has no sequences");
  const SequenceChunk good{{1, 2, 3}, 0, {0}, false};
  EXPECT_EQ(validation_error(Batch{{good}}, kv), "accepted");
  auto with_second = [&](SequenceChunk second) {
    return validation_error(Batch{{good, std::move(second)}}, kv);
  };
  EXPECT_EQ(with_second({{}, 0, {1}, false}), "CUDA forward: sequence 1: no new tokens");
  EXPECT_EQ(with_second({{1}, -1, {1}, false}), "CUDA forward: sequence 1: negative start_pos -1");
  EXPECT_EQ(with_second({{1, 2}, 63, {0, 1, 2, 3, 4, 5, 6, 7}, false}),
            "CUDA forward: sequence 1: positions up to 64 exceed max_position_embeddings 64");
  EXPECT_EQ(with_second({{1, 100}, 0, {1}, false}),
            "CUDA forward: sequence 1: token id 100 outside the vocabulary of 100");
  EXPECT_EQ(with_second({{1, -2}, 0, {1}, false}),
            "CUDA forward: sequence 1: token id -2 outside the vocabulary of 100");
  EXPECT_EQ(with_second({{1, 2}, 3, {1}, false}),
            "CUDA forward: sequence 1: block table has 1 blocks, positions up to 4 need 2");
  EXPECT_EQ(with_second({{1}, 4, {1, 8}, false}),
            "CUDA forward: sequence 1: block id 8 outside the KV pool of 8 blocks");
  EXPECT_EQ(with_second({{1}, 0, {-1}, false}),
            "CUDA forward: sequence 1: block id -1 outside the KV pool of 8 blocks");
  // Entries past what the positions need are not read, so they are not checked.
  EXPECT_EQ(with_second({{1}, 0, {1, 99}, false}), "accepted");
}

// A prompt chunk that wants every logit row, a decode token deep into its context, and a second
// chunk of a prompt, blocks of 4 positions, tiles of 3 queries: every array the kernels read.
TEST(StepInputs, PackedArraysDescribeEveryTokenAndSequence) {
  constexpr int kBlock = 4, kMaxBlocks = 6, kTile = 3;
  Batch batch;
  batch.seqs.push_back({{10, 11, 12, 13, 14}, 0, {5, 2}, true});
  batch.seqs.push_back({{20}, 9, {0, 7, 3}, false});
  batch.seqs.push_back({{30, 31, 32, 33}, 6, {1, 4, 6}, false});
  const StepLayout layout({16, 4, 8}, kMaxBlocks, kTile);
  std::vector<int32_t> packed(layout.total, -7);
  const StepShape shape = pack_step(batch, layout, kBlock, packed.data());

  EXPECT_FALSE(shape.decode);
  EXPECT_EQ(shape.seqs, 3);
  EXPECT_EQ(shape.tokens, 10);
  EXPECT_EQ(shape.logit_rows, 5 + 1 + 1);
  EXPECT_EQ(shape.tiles, 2 + 1 + 2);
  EXPECT_EQ(shape.max_context, 10);
  EXPECT_EQ(shape.packed_elements, layout.block_tables + 3 * kMaxBlocks);

  auto array = [&](size_t offset, size_t n) {
    return std::vector<int32_t>(packed.begin() + offset, packed.begin() + offset + n);
  };
  using V = std::vector<int32_t>;
  EXPECT_EQ(array(layout.token_ids, 10), (V{10, 11, 12, 13, 14, 20, 30, 31, 32, 33}));
  EXPECT_EQ(array(layout.positions, 10), (V{0, 1, 2, 3, 4, 9, 6, 7, 8, 9}));
  // Slot = block_table[position / 4] * 4 + position % 4.
  EXPECT_EQ(array(layout.slots, 10), (V{20, 21, 22, 23, 8, 13, 18, 19, 24, 25}));
  EXPECT_EQ(array(layout.logit_rows, 7), (V{0, 1, 2, 3, 4, 5, 9}));
  EXPECT_EQ(array(layout.context_lens, 3), (V{5, 10, 10}));
  EXPECT_EQ(array(layout.q_offsets, 3), (V{0, 5, 6}));
  EXPECT_EQ(array(layout.q_lens, 3), (V{5, 1, 4}));
  EXPECT_EQ(array(layout.start_positions, 3), (V{0, 9, 6}));
  // (sequence, first query) per tile.
  EXPECT_EQ(array(layout.tiles, 10), (V{0, 0, 0, 3, 1, 0, 2, 0, 2, 3}));
  EXPECT_EQ(array(layout.block_tables, 2), (V{5, 2}));
  EXPECT_EQ(array(layout.block_tables + kMaxBlocks, 3), (V{0, 7, 3}));
  EXPECT_EQ(array(layout.block_tables + 2 * kMaxBlocks, 3), (V{1, 4, 6}));
}

// A decode step: one token a sequence, so a captured graph replays it.
TEST(StepInputs, ADecodeStepIsMarkedAndTakesTheLongestContext) {
  Batch batch;
  batch.seqs.push_back({{1}, 30, {0, 1}, false});
  batch.seqs.push_back({{2}, 2, {2}, false});
  const StepLayout layout({2, 2, 2}, 4, 16);
  std::vector<int32_t> packed(layout.total);
  const StepShape shape = pack_step(batch, layout, 16, packed.data());
  EXPECT_TRUE(shape.decode);
  EXPECT_EQ(shape.max_context, 31);
  EXPECT_EQ(shape.tiles, 2);
  EXPECT_EQ(packed[layout.slots], 1 * 16 + 14);
  EXPECT_EQ(packed[layout.slots + 1], 2 * 16 + 2);
}

// The arrays lie apart, each 16-byte aligned, and the layout has room for tokens / tile + seqs
// tiles, more than any batch within its capacity makes (a sequence's tiles are at most its
// tokens / tile, rounded up).
TEST(StepInputs, LayoutArraysAreAlignedWithRoomForEveryTile) {
  const StepLayout layout({10, 4, 10}, 3, 4);
  const std::vector<size_t> offsets = {
      layout.token_ids,    layout.positions,    layout.slots,  layout.logit_rows,
      layout.context_lens, layout.q_offsets,    layout.q_lens, layout.start_positions,
      layout.tiles,        layout.block_tables, layout.total};
  for (size_t i = 0; i < offsets.size(); ++i) {
    EXPECT_EQ(offsets[i] % 4, 0u) << "array " << i;
    if (i > 0) {
      EXPECT_LT(offsets[i - 1], offsets[i]) << "array " << i;
    }
  }
  EXPECT_GE(layout.block_tables - layout.tiles, size_t(2 * (10 / 4 + 4)));
  Batch batch;  // 1 + 1 + 3 + 5 tokens: 1 + 1 + 1 + 2 tiles of 4 queries
  for (int n : {1, 1, 3, 5})
    batch.seqs.push_back({std::vector<int32_t>(size_t(n), 1), 0, {0, 1}, false});
  std::vector<int32_t> packed(layout.total);
  EXPECT_EQ(pack_step(batch, layout, 4, packed.data()).tiles, 5);
}

}  // namespace
}  // namespace pipeline::cuda

#else  // built without the CUDA backend

TEST(StepInputs, NeedTheCudaBackend) {
  GTEST_SKIP() << "built without the CUDA backend, which packs these inputs";
}

#endif
