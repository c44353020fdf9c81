// A map that holds at most `capacity` entries and, to make room, drops the one used least
// recently. The CUDA runner keeps its captured decode graphs in one: their keys (batch size,
// attention partitions) run to hundreds over a long serve, and each instantiated graph holds
// device memory. Host code only, so the CPU tests check it.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <stdexcept>
#include <utility>

namespace pipeline::cuda {

template <class Key, class Value>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {
    if (capacity == 0) throw std::invalid_argument("LruCache: a capacity of 0");
  }

  // The value stored under `key`, which becomes the most recently used; nullptr if none is.
  Value* find(const Key& key) {
    const auto at = index_.find(key);
    if (at == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, at->second);
    return &at->second->second;
  }

  // Stores `value` under `key` (replacing any value there) as the most recently used, first
  // dropping the least recently used entry if the cache is full.
  Value& insert(const Key& key, Value value) {
    if (const auto at = index_.find(key); at != index_.end()) {
      entries_.erase(at->second);
      index_.erase(at);
    }
    if (entries_.size() == capacity_) {
      index_.erase(entries_.back().first);
      entries_.pop_back();
    }
    entries_.emplace_front(key, std::move(value));
    index_[key] = entries_.begin();
    return entries_.front().second;
  }

  size_t size() const { return entries_.size(); }

  void clear() {
    index_.clear();
    entries_.clear();
  }

 private:
  using Entries = std::list<std::pair<Key, Value>>;  // most recently used first
  size_t capacity_;
  Entries entries_;
  std::map<Key, typename Entries::iterator> index_;
};

}  // namespace pipeline::cuda
