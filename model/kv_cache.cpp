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
  // Highest id at the bottom of the stack, so blocks are handed out 0, 1, 2, ... at first.
  free_.reserve(size_t(num_blocks));
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_.push_back(block);
}

int32_t BlockManager::allocate() {
  if (free_.empty())
    throw std::runtime_error("KV cache full: all " + std::to_string(num_total()) +
                             " blocks are in use");
  const int32_t block = free_.back();
  free_.pop_back();
  ref_counts_[block] = 1;
  return block;
}

void BlockManager::retain(int32_t block) {
  check_block(block, num_total(), "retain");
  if (ref_counts_[block] == 0)
    throw std::logic_error("BlockManager::retain: block " + std::to_string(block) + " is free");
  ++ref_counts_[block];
}

void BlockManager::release(int32_t block) {
  check_block(block, num_total(), "release");
  if (ref_counts_[block] == 0)
    throw std::logic_error("BlockManager::release: block " + std::to_string(block) +
                           " is already free (double free)");
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

void BlockManager::release_all(std::vector<int32_t>& table) {
  for (int32_t block : table) release(block);
  table.clear();
}

bool BlockManager::ensure_capacity(std::vector<int32_t>& table, int tokens, int block_size) {
  if (block_size <= 0)
    throw std::invalid_argument("BlockManager::ensure_capacity: block_size must be positive, got " +
                                std::to_string(block_size));
  const size_t needed = size_t((std::max(tokens, 0) + block_size - 1) / block_size);
  if (needed <= table.size()) return true;
  if (!can_allocate(int(needed - table.size()))) return false;
  while (table.size() < needed) table.push_back(allocate());
  return true;
}

}  // namespace pipeline
