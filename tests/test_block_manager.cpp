// BlockManager: a free list with reference counts. Blocks come out once each until freed,
// shared blocks return only with their last reference, and misuse is an error, never a
// silently corrupted pool. The prefix cache finds registered blocks by their tokens and those
// before them, keeps them after their last reference until a block is needed, and then gives
// up the least recently freed first.
#include <gtest/gtest.h>

#include <set>
#include <span>
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
  const int32_t tokens[] = {1, 2, 3, 4};
  ASSERT_EQ(blocks.register_block(shared, BlockManager::kNoParent, tokens), shared);
  blocks.share(shared);
  blocks.share(shared);
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
  EXPECT_THROW(blocks.share(block), std::logic_error);    // share of a block that caches nothing
  EXPECT_THROW(blocks.release(2), std::out_of_range);
  EXPECT_THROW(blocks.share(-1), std::out_of_range);
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
  const int32_t tokens[] = {1, 2, 3, 4};
  ASSERT_EQ(blocks.register_block(table[0], BlockManager::kNoParent, tokens), table[0]);
  blocks.share(table[0]);  // shared with another sequence
  blocks.release_all(table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(blocks.num_used(), 1);
}

constexpr int kBlock = 4;

// Allocates a table for `tokens` (whole blocks) and registers every block, as the scheduler
// does once their keys and values are computed.
std::vector<int32_t> register_all(BlockManager& blocks, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> table;
  EXPECT_TRUE(blocks.ensure_capacity(table, int(tokens.size()), kBlock));
  for (size_t i = 0; i < table.size(); ++i)
    blocks.register_block(table[i], i == 0 ? BlockManager::kNoParent : table[i - 1],
                          std::span(tokens).subspan(i * kBlock, kBlock));
  return table;
}

TEST(BlockManager, AMatchIsTheLongestRegisteredPrefixOfWholeBlocks) {
  BlockManager blocks(8);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const auto table = register_all(blocks, tokens);
  EXPECT_EQ(blocks.num_cached(), 3);

  EXPECT_EQ(blocks.match(tokens, kBlock, 3), table);
  EXPECT_EQ(blocks.match(tokens, kBlock, 2), (std::vector{table[0], table[1]}));
  // A longer sequence with the same start; a partial last block is never matched.
  std::vector<int32_t> longer = tokens;
  longer.insert(longer.end(), {13, 14});
  EXPECT_EQ(blocks.match(longer, kBlock, 10), table);
  // A different second block ends the match there, even if the third block's tokens agree.
  std::vector<int32_t> other = tokens;
  other[5] = 99;
  EXPECT_EQ(blocks.match(other, kBlock, 3), (std::vector{table[0]}));
  // The same tokens after a different start match nothing: a block is its whole prefix.
  const std::vector<int32_t> shifted = {9, 10, 11, 12};
  EXPECT_TRUE(blocks.match(shifted, kBlock, 1).empty());
}

TEST(BlockManager, ReleasedCachedBlocksStayFindableUntilEvictedLeastRecentlyFreedFirst) {
  BlockManager blocks(3);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  auto table = register_all(blocks, a);
  const int32_t plain = blocks.allocate();
  blocks.release(table[1]);
  blocks.release(table[0]);  // freed after table[1]
  EXPECT_EQ(blocks.num_free(), 2) << "evictable blocks count as free";
  EXPECT_EQ(blocks.num_used(), 1);
  EXPECT_EQ(blocks.match(a, kBlock, 2), table);

  // A match takes them back without allocating.
  blocks.share(table[0]);
  EXPECT_EQ(blocks.ref_count(table[0]), 1);
  EXPECT_EQ(blocks.num_free(), 1);
  blocks.release(table[0]);  // now freed after table[1] again

  // New blocks come from the plain free list first, then from the least recently freed.
  blocks.release(plain);
  EXPECT_EQ(blocks.allocate(), plain);
  EXPECT_EQ(blocks.allocate(), table[1]);
  EXPECT_EQ(blocks.match(a, kBlock, 2), (std::vector{table[0]}))
      << "an evicted block is no longer found, and nothing after it";
  EXPECT_EQ(blocks.num_cached(), 1);
  EXPECT_EQ(blocks.allocate(), table[0]);
  EXPECT_EQ(blocks.num_cached(), 0);
  EXPECT_THROW(blocks.allocate(), std::runtime_error);
}

TEST(BlockManager, AReleasedChainIsEvictedFromItsEndSoItsStartStaysFindable) {
  BlockManager blocks(4);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  auto table = register_all(blocks, tokens);
  const auto kept = table;
  blocks.release_all(table);
  blocks.allocate();  // the one plain free block
  EXPECT_EQ(blocks.allocate(), kept[2]) << "the chain's last block goes first";
  EXPECT_EQ(blocks.match(tokens, kBlock, 3), (std::vector{kept[0], kept[1]}));
}

TEST(BlockManager, ABlockIsFoundOnlyAfterTheVeryBlockItWasComputedAfter) {
  BlockManager blocks(2);
  const std::vector<int32_t> first = {1, 2, 3, 4, 5, 6, 7, 8};
  auto table = register_all(blocks, first);
  const auto kept = table;
  blocks.share(kept[1]);  // another sequence holds the second block
  blocks.release_all(table);
  // The first block's id is reused for other tokens, registered as a first block.
  std::vector<int32_t> reused;
  ASSERT_TRUE(blocks.ensure_capacity(reused, 4, kBlock));
  ASSERT_EQ(reused[0], kept[0]);
  const std::vector<int32_t> other = {9, 9, 9, 9, 5, 6, 7, 8};
  blocks.register_block(reused[0], BlockManager::kNoParent, std::span(other).first(4));
  // The second block was computed after tokens 1 2 3 4, not 9 9 9 9: it is not found after them,
  // even though its parent's id and its own tokens are the same.
  EXPECT_EQ(blocks.match(other, kBlock, 2), (std::vector{kept[0]}));
  EXPECT_TRUE(blocks.match(first, kBlock, 2).empty());
}

TEST(BlockManager, ABlockAfterAnUnregisteredOneIsNotRegistered) {
  BlockManager blocks(2);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> table;
  ASSERT_TRUE(blocks.ensure_capacity(table, 8, kBlock));
  blocks.register_block(table[1], table[0], std::span(tokens).subspan(4, 4));
  EXPECT_EQ(blocks.num_cached(), 0) << "nothing could ever find it";
  EXPECT_THROW(blocks.register_block(table[1], 99, tokens), std::out_of_range);
}

TEST(BlockManager, ContentCachedOnceStaysWithItsFirstBlock) {
  BlockManager blocks(4);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const auto first = register_all(blocks, tokens);
  const auto second = register_all(blocks, tokens);
  EXPECT_EQ(blocks.num_cached(), 1);
  EXPECT_EQ(blocks.register_block(second[0], BlockManager::kNoParent, tokens), first[0])
      << "the block that holds them already";
  EXPECT_EQ(blocks.match(tokens, kBlock, 1), first);
  auto table = second;
  blocks.release_all(table);
  EXPECT_EQ(blocks.num_free(), 3);
  EXPECT_THROW(blocks.share(second[0]), std::logic_error) << "it holds no cached prefix";
  EXPECT_THROW(blocks.register_block(second[0], BlockManager::kNoParent, tokens), std::logic_error)
      << "a free block has no computed contents";
}

}  // namespace
}  // namespace pipeline
