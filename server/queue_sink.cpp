#include "server/queue_sink.h"

namespace pipeline {

void QueueSink::on_delta(Delta delta) {
  push(std::move(delta));
}
void QueueSink::on_finish(const Completion& completion) {
  push(completion);
}
void QueueSink::on_error(const RequestError& error) {
  push(error);
}

void QueueSink::push(SinkEvent event) {
  queue_.enqueue(Numbered{pushed_.fetch_add(1, std::memory_order_relaxed), std::move(event)});
}

std::optional<SinkEvent> QueueSink::next(std::chrono::microseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto it = arrived_early_.find(expected_); it != arrived_early_.end()) {
      SinkEvent event = std::move(it->second);
      arrived_early_.erase(it);
      ++expected_;
      return event;
    }
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    Numbered item;
    if (left.count() <= 0 || !queue_.wait_dequeue_timed(item, left)) return std::nullopt;
    if (item.index == expected_) {
      ++expected_;
      return std::move(item.event);
    }
    arrived_early_.emplace(item.index, std::move(item.event));
  }
}

}  // namespace pipeline
