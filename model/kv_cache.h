// The paged KV cache's bookkeeping: fixed-size blocks of `block_size` token slots, handed out
// by a BlockManager. Each sequence owns a block table (block ids in position order); token at
// position p lives in block table[p / block_size], slot p % block_size. The storage itself
// belongs to the ModelRunner (host memory for the CPU, device memory for CUDA).
#pragma once

#include <cstdint>
#include <vector>

namespace pipeline {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int num_blocks = 0;

  // Floats of K (or of V) one block holds in one layer.
  int64_t block_elems() const { return int64_t(block_size) * num_kv_heads * head_dim; }
  int blocks_for(int tokens) const { return int((int64_t(tokens) + block_size - 1) / block_size); }
};

// Free list of block ids with reference counts (a block may be shared by sequences that share
// a prefix). Not thread-safe: one scheduler owns it.
class BlockManager {
 public:
  explicit BlockManager(int num_blocks);

  int num_total() const { return int(ref_counts_.size()); }
  int num_free() const { return int(free_.size()); }
  int num_used() const { return num_total() - num_free(); }
  bool can_allocate(int n) const { return n <= num_free(); }

  // Returns a block id with reference count 1; throws std::runtime_error when none is free.
  int32_t allocate();
  void retain(int32_t block);
  // Drops one reference; the block returns to the free list at zero.
  void release(int32_t block);
  void release_all(std::vector<int32_t>& table);
  // Grows `table` until it covers `tokens` positions; false (and unchanged) when blocks run out.
  bool ensure_capacity(std::vector<int32_t>& table, int tokens, int block_size);

 private:
  std::vector<int32_t> free_;
  std::vector<int32_t> ref_counts_;
};

}  // namespace pipeline
