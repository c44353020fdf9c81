// BlockManager: a free list with reference counts. Blocks come out once each until freed,
// shared blocks return only with their last reference, and misuse is an error, never a
// silently corrupted pool.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <vector>

#include "model/kv_cache.h"

namespace pipeline {
namespace {

TEST(BlockManager, HandsOutEveryBlockOnceThenRefuses) {
  BlockManager blocks(4);
  EXPECT_EQ(blocks.num_total(), 4);
  EXPECT_EQ(blocks.num_free(), 4);
  std::set<int32_t> handed_out;
  for (int i = 0; i < 4; ++i) {
    const int32_t block = blocks.allocate();
    EXPECT_GE(block, 0);
    EXPECT_LT(block, 4);
    handed_out.insert(block);
  }
  EXPECT_EQ(handed_out.size(), 4u);
  EXPECT_EQ(blocks.num_free(), 0);
  EXPECT_EQ(blocks.num_used(), 4);
  EXPECT_FALSE(blocks.can_allocate(1));
  EXPECT_TRUE(blocks.can_allocate(0));
  EXPECT_THROW(blocks.allocate(), std::runtime_error);
}

TEST(BlockManager, ReleasedBlocksComeBack) {
  BlockManager blocks(2);
  const int32_t a = blocks.allocate();
  const int32_t b = blocks.allocate();
  blocks.release(a);
  EXPECT_EQ(blocks.num_free(), 1);
  EXPECT_EQ(blocks.allocate(), a);
  blocks.release(b);
  blocks.release(a);
  EXPECT_EQ(blocks.num_free(), 2);
}

TEST(BlockManager, SharedBlockReturnsWithItsLastReference) {
  BlockManager blocks(3);
  const int32_t shared = blocks.allocate();
  blocks.retain(shared);
  blocks.retain(shared);
  blocks.release(shared);
  blocks.release(shared);
  EXPECT_EQ(blocks.num_used(), 1);
  blocks.release(shared);
  EXPECT_EQ(blocks.num_used(), 0);
}

TEST(BlockManager, MisuseIsAnError) {
  BlockManager blocks(2);
  const int32_t block = blocks.allocate();
  blocks.release(block);
  EXPECT_THROW(blocks.release(block), std::logic_error);  // double free
  EXPECT_THROW(blocks.retain(block), std::logic_error);   // retain of a free block
  EXPECT_THROW(blocks.release(2), std::out_of_range);
  EXPECT_THROW(blocks.retain(-1), std::out_of_range);
  EXPECT_EQ(blocks.num_free(), 2);  // the pool is intact after the errors
  EXPECT_THROW(BlockManager(-1), std::invalid_argument);
}

TEST(BlockManager, EnsureCapacityGrowsTheTableToCoverThePositions) {
  BlockManager blocks(5);
  std::vector<int32_t> table;
  EXPECT_TRUE(blocks.ensure_capacity(table, 1, 4));
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(blocks.ensure_capacity(table, 4, 4));  // still one block
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(blocks.ensure_capacity(table, 9, 4));
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(std::set<int32_t>(table.begin(), table.end()).size(), 3u);
  EXPECT_TRUE(blocks.ensure_capacity(table, 0, 4));
  EXPECT_EQ(table.size(), 3u);  // never shrinks

  // Not enough left: false, and nothing taken.
  const std::vector<int32_t> before = table;
  EXPECT_FALSE(blocks.ensure_capacity(table, 21, 4));
  EXPECT_EQ(table, before);
  EXPECT_EQ(blocks.num_free(), 2);
  EXPECT_THROW(blocks.ensure_capacity(table, 4, 0), std::invalid_argument);
}

TEST(BlockManager, ReleaseAllFreesTheTableAndEmptiesIt) {
  BlockManager blocks(4);
  std::vector<int32_t> table;
  ASSERT_TRUE(blocks.ensure_capacity(table, 10, 4));
  blocks.retain(table[0]);  // shared with another sequence
  blocks.release_all(table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(blocks.num_used(), 1);
}

}  // namespace
}  // namespace pipeline
