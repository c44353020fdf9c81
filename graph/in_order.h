// Puts items numbered 0, 1, 2, ... back in order when concurrent graph nodes hand them over
// out of order (moodycamel-style queues and unlimited-concurrency nodes keep no order across
// producers): each item is handled once every earlier one has been, under one lock.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

namespace pipeline {

template <typename T>
class InOrder {
 public:
  // Stores item `index`, then calls handle(item) for every item that is next in line.
  template <typename Handle>
  void push(uint64_t index, T item, Handle&& handle) {
    std::lock_guard lock(mutex_);
    pending_.emplace(index, std::move(item));
    while (!pending_.empty() && pending_.begin()->first == next_) {
      auto node = pending_.extract(pending_.begin());
      ++next_;
      handle(node.mapped());
    }
  }

  // Calls f(handled), `handled` being how many items were handled, with the lock held: none is
  // handled meanwhile.
  template <typename F>
  void locked(F&& f) {
    std::lock_guard lock(mutex_);
    f(next_);
  }

 private:
  std::mutex mutex_;
  uint64_t next_ = 0;
  std::map<uint64_t, T> pending_;
};

}  // namespace pipeline
