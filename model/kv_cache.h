// The paged KV cache's bookkeeping: fixed-size blocks of `block_size` token slots, handed out
// by a BlockManager. Each sequence owns a block table (block ids in position order); token at
// position p lives in block table[p / block_size], slot p % block_size. The storage itself
// belongs to the ModelRunner (host memory for the CPU, device memory for CUDA).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
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

// The blocks a prefix-cache lookup found: the first blocks of a sequence's tokens, in order,
// and the hash chain's value after the last of them.
struct PrefixMatch {
  std::vector<int32_t> blocks;
  uint64_t hash = 0;
};

// Free list of block ids with reference counts (a block may be shared by sequences that share
// a prefix), and the prefix cache. Not thread-safe: one scheduler owns it.
//
// Prefix caching, as vLLM's: a full block whose keys and values are computed is registered
// under its tokens and the hash of every block before it. A later sequence that starts with the
// same tokens shares the registered blocks instead of computing them again. A registered block
// whose last reference goes keeps its contents, evictable: it is reused by a match, or handed
// out by allocate() once no block without contents is left (the least recently freed first).
class BlockManager {
 public:
  // The hash chain's value before a sequence's first block.
  static constexpr uint64_t kRootHash = 0x6a09e667f3bcc908ull;

  explicit BlockManager(int num_blocks);

  int num_total() const { return int(ref_counts_.size()); }
  // Blocks allocate() can hand out: those never used or released without contents, and the
  // evictable cached ones.
  int num_free() const { return int(free_.size() + evictable_.size()); }
  int num_used() const { return num_total() - num_free(); }
  int num_cached() const { return int(cached_.size()); }  // registered, in use or evictable
  bool can_allocate(int n) const { return n <= num_free(); }
  bool in_use(int32_t block) const { return ref_counts_.at(size_t(block)) > 0; }

  // Returns a block id with reference count 1; throws std::runtime_error when none is free.
  int32_t allocate();
  void retain(int32_t block);
  // Drops one reference; the block returns to the free list at zero (a registered one as
  // evictable).
  void release(int32_t block);
  void release_all(std::vector<int32_t>& table);
  // Grows `table` until it covers `tokens` positions; false (and unchanged) when blocks run out.
  bool ensure_capacity(std::vector<int32_t>& table, int tokens, int block_size);

  // The hash of a block of `tokens` after blocks whose chain ended at `parent`.
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);
  // Registers `block` (in use, its keys and values computed) as holding `tokens` after the chain
  // `parent`; returns the block's hash. Content already registered in another block leaves this
  // one unregistered (it is freed as usual), and a block registered before stays as it was.
  uint64_t register_block(int32_t block, uint64_t parent, std::span<const int32_t> tokens);
  // The registered blocks that hold the first blocks of `tokens` (block_size tokens each), up to
  // `max_blocks`: the longest prefix found. Takes no reference.
  PrefixMatch match(std::span<const int32_t> tokens, int block_size, int max_blocks) const;
  // Takes a reference on a registered block, in use or evictable.
  void share(int32_t block);

 private:
  struct Content {
    bool registered = false;
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator evictable_at;  // while evictable
  };

  void evict(int32_t block);

  std::vector<int32_t> free_;  // without contents
  std::vector<int32_t> ref_counts_;
  std::vector<Content> contents_;
  std::unordered_map<uint64_t, int32_t> cached_;  // hash -> registered block
  std::list<int32_t> evictable_;                  // registered, unused; least recently freed first
};

}  // namespace pipeline
