#include "model/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pipeline {

namespace {

void check_block(int32_t block, int num_total, const char* operation) {
  if (block < 0 || block >= num_total)
    throw std::out_of_range(std::string("BlockManager::") + operation + ": block " +
                            std::to_string(block) + " is outside the pool of " +
                            std::to_string(num_total));
}

}  // namespace

BlockManager::BlockManager(int num_blocks) {
  if (num_blocks < 0)
    throw std::invalid_argument("BlockManager: num_blocks must be at least 0, got " +
                                std::to_string(num_blocks));
  ref_counts_.assign(size_t(num_blocks), 0);
  contents_.resize(size_t(num_blocks));
  reuses_.assign(size_t(num_blocks), 0);
  // Highest id at the bottom of the stack, so blocks are handed out 0, 1, 2, ... at first.
  free_.reserve(size_t(num_blocks));
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_.push_back(block);
}

int32_t BlockManager::allocate() {
  if (free_.empty() && evictable_.empty())
    throw std::runtime_error("KV cache full: all " + std::to_string(num_total()) +
                             " blocks are in use");
  if (free_.empty()) evict(evictable_.front());
  const int32_t block = free_.back();
  free_.pop_back();
  ref_counts_[block] = 1;
  return block;
}

// An evictable block gives up its contents and joins the plain free list.
void BlockManager::evict(int32_t block) {
  Content& content = contents_[size_t(block)];
  evictable_.erase(content.evictable_at);
  cached_.erase(content.key);
  content = Content{};
  ++reuses_[size_t(block)];  // its children, if still registered, can no longer be reached
  free_.push_back(block);
}

void BlockManager::release(int32_t block) {
  check_block(block, num_total(), "release");
  if (ref_counts_[block] == 0)
    throw std::logic_error("BlockManager::release: block " + std::to_string(block) +
                           " is already free (double free)");
  if (--ref_counts_[block] > 0) return;
  Content& content = contents_[size_t(block)];
  if (content.registered)
    content.evictable_at = evictable_.insert(evictable_.end(), block);
  else
    free_.push_back(block);
}

void BlockManager::release_all(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) release(*it);
  table.clear();
}

bool BlockManager::ensure_capacity(std::vector<int32_t>& table, int tokens, int block_size) {
  if (block_size <= 0)
    throw std::invalid_argument("BlockManager::ensure_capacity: block_size must be positive, got " +
                                std::to_string(block_size));
  const size_t needed = size_t((std::max(tokens, 0) + block_size - 1) / block_size);
  if (needed <= table.size()) return true;
  if (int(needed - table.size()) > num_free()) return false;
  while (table.size() < needed) table.push_back(allocate());
  return true;
}

BlockManager::Parent BlockManager::parent_of(int32_t block) const {
  if (block == kNoParent) return {};
  return {block, reuses_[size_t(block)]};
}

// Where a block of `tokens` after `parent` is looked up: splitmix64's finaliser over the parent
// and each token in turn. Collisions only cost a miss: a match compares what the key stands for.
uint64_t BlockManager::key_of(const Parent& parent, std::span<const int32_t> tokens) {
  uint64_t h = 0;
  const auto mix = [&h](uint64_t value) {
    h += 0x9e3779b97f4a7c15ull + value;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  };
  mix(uint32_t(parent.block));
  mix(parent.reuse);
  for (int32_t token : tokens) mix(uint32_t(token));
  return h;
}

int32_t BlockManager::register_block(int32_t block, int32_t parent,
                                     std::span<const int32_t> tokens) {
  check_block(block, num_total(), "register_block");
  if (ref_counts_[block] == 0)
    throw std::logic_error("BlockManager::register_block: block " + std::to_string(block) +
                           " is free");
  if (parent != kNoParent) {
    check_block(parent, num_total(), "register_block");
    if (!contents_[size_t(parent)].registered) return kNoBlock;
  }
  Content& content = contents_[size_t(block)];
  if (content.registered) return block;
  const Parent after = parent_of(parent);
  const uint64_t key = key_of(after, tokens);
  if (cached_.contains(key)) return holder(key, after, tokens);  // kNoBlock on a key collision
  content.registered = true;
  content.parent = after;
  content.tokens.assign(tokens.begin(), tokens.end());
  content.key = key;
  cached_.emplace(key, block);
  return block;
}

std::vector<int32_t> BlockManager::match(std::span<const int32_t> tokens, int block_size,
                                         int max_blocks) const {
  std::vector<int32_t> found;
  int32_t parent = kNoParent;
  const int blocks = std::min(max_blocks, int(tokens.size()) / block_size);
  for (int i = 0; i < blocks; ++i) {
    const auto block_tokens = tokens.subspan(size_t(i) * size_t(block_size), size_t(block_size));
    const Parent after = parent_of(parent);
    parent = holder(key_of(after, block_tokens), after, block_tokens);
    if (parent == kNoBlock) break;
    found.push_back(parent);
  }
  return found;
}

// The registered block under `key` when it holds `tokens` after `parent`, compared, not only
// hashed; kNoBlock otherwise.
int32_t BlockManager::holder(uint64_t key, const Parent& parent,
                             std::span<const int32_t> tokens) const {
  const auto it = cached_.find(key);
  if (it == cached_.end()) return kNoBlock;
  const Content& content = contents_[size_t(it->second)];
  const bool same =
      content.parent == parent &&
      std::equal(tokens.begin(), tokens.end(), content.tokens.begin(), content.tokens.end());
  return same ? it->second : kNoBlock;
}

void BlockManager::share(int32_t block) {
  check_block(block, num_total(), "share");
  Content& content = contents_[size_t(block)];
  if (!content.registered)
    throw std::logic_error("BlockManager::share: block " + std::to_string(block) +
                           " holds no cached prefix");
  if (ref_counts_[block]++ == 0) evictable_.erase(content.evictable_at);
}

}  // namespace pipeline
