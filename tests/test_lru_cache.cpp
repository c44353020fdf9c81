// LruCache (kernels/cuda/lru_cache.h), the bound on the CUDA runner's captured decode graphs:
// host code, checked here whether or not a GPU is present.
#include "kernels/cuda/lru_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <utility>

namespace pipeline::cuda {
namespace {

using Key = std::pair<int, int>;  // as the runner's (batch size, partitions)

TEST(LruCache, FindsWhatWasInserted) {
  LruCache<Key, int> cache(4);
  EXPECT_EQ(cache.find({1, 1}), nullptr);
  cache.insert({1, 1}, 10);
  cache.insert({2, 1}, 20);
  ASSERT_NE(cache.find({1, 1}), nullptr);
  EXPECT_EQ(*cache.find({1, 1}), 10);
  EXPECT_EQ(*cache.find({2, 1}), 20);
  EXPECT_EQ(cache.find({1, 2}), nullptr);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(LruCache, DropsTheLeastRecentlyUsedWhenFull) {
  LruCache<Key, int> cache(3);
  cache.insert({1, 1}, 1);
  cache.insert({2, 1}, 2);
  cache.insert({3, 1}, 3);
  ASSERT_NE(cache.find({1, 1}), nullptr);  // {2, 1} is now the least recently used
  cache.insert({4, 1}, 4);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.find({2, 1}), nullptr);
  EXPECT_NE(cache.find({1, 1}), nullptr);
  EXPECT_NE(cache.find({3, 1}), nullptr);
  EXPECT_NE(cache.find({4, 1}), nullptr);
  cache.insert({5, 1}, 5);  // {1, 1} was found first among the three: it goes now
  EXPECT_EQ(cache.find({1, 1}), nullptr);
  EXPECT_EQ(*cache.find({5, 1}), 5);
}

TEST(LruCache, InsertingAPresentKeyReplacesItsValueWithoutDroppingAnother) {
  LruCache<Key, int> cache(2);
  cache.insert({1, 1}, 1);
  cache.insert({2, 1}, 2);
  EXPECT_EQ(cache.insert({1, 1}, 7), 7);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(*cache.find({1, 1}), 7);
  EXPECT_EQ(*cache.find({2, 1}), 2);
}

// The runner stores unique_ptr<GraphExec>, null where a capture failed: a dropped entry's value
// is destroyed then, and a null value is kept like any other.
TEST(LruCache, DestroysWhatItDropsAndKeepsNullValues) {
  LruCache<Key, std::shared_ptr<int>> cache(1);
  auto value = std::make_shared<int>(1);
  const std::weak_ptr<int> watched = value;
  cache.insert({1, 1}, std::move(value));
  EXPECT_FALSE(watched.expired());
  cache.insert({2, 1}, nullptr);  // drops {1, 1}
  EXPECT_TRUE(watched.expired());
  ASSERT_NE(cache.find({2, 1}), nullptr);
  EXPECT_EQ(*cache.find({2, 1}), nullptr);
}

TEST(LruCache, HoldsMoveOnlyValues) {
  LruCache<Key, std::unique_ptr<int>> cache(2);
  cache.insert({1, 1}, std::make_unique<int>(3));
  ASSERT_NE(cache.find({1, 1}), nullptr);
  EXPECT_EQ(**cache.find({1, 1}), 3);
}

TEST(LruCache, ClearEmptiesIt) {
  LruCache<Key, int> cache(2);
  cache.insert({1, 1}, 1);
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.find({1, 1}), nullptr);
}

TEST(LruCache, RefusesACapacityOfZero) {
  EXPECT_THROW((LruCache<Key, int>(0)), std::invalid_argument);
}

}  // namespace
}  // namespace pipeline::cuda
