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

#include "io/dtype.h"

namespace pipeline {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int num_blocks = 0;
  DType dtype = DType::F32;  // of K and V: F32 or BF16

  // Elements of K (or of V) one block holds in one layer.
  int64_t block_elems() const { return int64_t(block_size) * num_kv_heads * head_dim; }
  int blocks_for(int tokens) const { return int((int64_t(tokens) + block_size - 1) / block_size); }
};

// Free list of block ids with reference counts (a block may be shared by sequences that share
// a prefix), and the prefix cache. Not thread-safe: one scheduler owns it.
//
// Prefix caching, as vLLM's: a full block whose keys and values are computed is registered as
// holding its tokens after its parent, the registered block before it in its sequence (none for
// a first block). A later sequence that starts with the same tokens shares the registered blocks
// instead of computing them again. A match compares the tokens and the parent block itself (its
// id and how often that id was reused), never a hash alone, so a crafted collision cannot hand
// one request keys and values computed over another's context. A registered block whose last
// reference goes keeps its contents, evictable: it is reused by a match, or handed out by
// allocate() once no block without contents is left (the least recently freed first).
class BlockManager {
 public:
  // The parent of a sequence's first block; no block.
  static constexpr int32_t kNoParent = -1;
  static constexpr int32_t kNoBlock = -1;

  explicit BlockManager(int num_blocks);

  int num_total() const { return int(ref_counts_.size()); }
  // Blocks allocate() can hand out: those never used or released without contents, and the
  // evictable cached ones.
  int num_free() const { return int(free_.size() + evictable_.size()); }
  int num_used() const { return num_total() - num_free(); }
  int num_cached() const { return int(cached_.size()); }  // registered, in use or evictable
  int ref_count(int32_t block) const { return ref_counts_.at(size_t(block)); }

  // Returns a block id with reference count 1; throws std::runtime_error when none is free.
  int32_t allocate();
  // Drops one reference; the block returns to the free list at zero (a registered one as
  // evictable).
  void release(int32_t block);
  // Releases a sequence's table, last block first: a chain's tail is evicted before its start,
  // which its other blocks are found through.
  void release_all(std::vector<int32_t>& table);
  // Grows `table` until it covers `tokens` positions; false (and unchanged) when blocks run out.
  bool ensure_capacity(std::vector<int32_t>& table, int tokens, int block_size);

  // Registers `block` (in use, its keys and values computed) as holding `tokens` after `parent`
  // (the block before it in the same sequence, which the caller holds, or kNoParent), and
  // returns the registered block that holds them: `block`, or another that already held the same
  // tokens after the same parent (the caller should use that one instead, and give `block` up),
  // or kNoBlock when the parent is not registered (nothing could find the block).
  int32_t register_block(int32_t block, int32_t parent, std::span<const int32_t> tokens);
  // The registered blocks that hold the first blocks of `tokens` (block_size tokens each), up to
  // `max_blocks`: the longest prefix found. Takes no reference.
  std::vector<int32_t> match(std::span<const int32_t> tokens, int block_size, int max_blocks) const;
  // Takes a reference on a registered block, in use or evictable.
  void share(int32_t block);

 private:
  // A registered block's parent, as it was when the block was registered.
  struct Parent {
    int32_t block = kNoParent;
    uint64_t reuse = 0;  // the parent id's reuses_ then
    bool operator==(const Parent&) const = default;
  };
  struct Content {
    bool registered = false;
    Parent parent;
    std::vector<int32_t> tokens;
    uint64_t key = 0;
    std::list<int32_t>::iterator evictable_at;  // while evictable
  };

  Parent parent_of(int32_t block) const;
  static uint64_t key_of(const Parent& parent, std::span<const int32_t> tokens);
  int32_t holder(uint64_t key, const Parent& parent, std::span<const int32_t> tokens) const;
  void evict(int32_t block);

  std::vector<int32_t> free_;  // without contents
  std::vector<int32_t> ref_counts_;
  std::vector<Content> contents_;
  std::vector<uint64_t> reuses_;                  // per id: how often its contents were given up
  std::unordered_map<uint64_t, int32_t> cached_;  // key_of(parent, tokens) -> registered block
  std::list<int32_t> evictable_;                  // registered, unused; least recently freed first
};

}  // namespace pipeline
