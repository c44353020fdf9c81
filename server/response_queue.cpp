#include "server/response_queue.h"

namespace pipeline {

class ResponseQueue::ChoiceSink final : public RequestSink {
 public:
  ChoiceSink(std::shared_ptr<ResponseQueue> queue, int choice)
      : queue_(std::move(queue)), choice_(choice) {}

  void on_delta(Delta delta) override { queue_->push(choice_, std::move(delta)); }
  void on_finish(const Completion& completion) override { queue_->push(choice_, completion); }
  void on_error(const RequestError& error) override { queue_->push(choice_, error); }

 private:
  std::shared_ptr<ResponseQueue> queue_;
  int choice_;
};

std::shared_ptr<RequestSink> ResponseQueue::sink_for(int choice) {
  return std::make_shared<ChoiceSink>(shared_from_this(), choice);
}

void ResponseQueue::push(int choice, SinkEvent event) {
  queue_.enqueue(Numbered{pushed_.fetch_add(1, std::memory_order_relaxed),
                          ChoiceEvent{choice, std::move(event)}});
}

std::optional<ChoiceEvent> ResponseQueue::next(std::chrono::microseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto it = arrived_early_.find(expected_); it != arrived_early_.end()) {
      ChoiceEvent event = std::move(it->second);
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
