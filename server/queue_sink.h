// A RequestSink for a connection thread: the pipeline pushes events into a lock-free queue and
// the thread that owns the HTTP connection pops them, in order, waiting as long as it likes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <variant>

#include <concurrentqueue/blockingconcurrentqueue.h>

#include "graph/request.h"

namespace pipeline {

using SinkEvent = std::variant<Delta, Completion, RequestError>;

class QueueSink : public RequestSink {
 public:
  void on_delta(Delta delta) override;
  void on_finish(const Completion& completion) override;
  void on_error(const RequestError& error) override;

  // The next event in the order the pipeline produced them, or nullopt when none arrives
  // within `timeout`. One consumer thread only.
  std::optional<SinkEvent> next(std::chrono::microseconds timeout);

 private:
  struct Numbered {
    uint64_t index = 0;
    SinkEvent event;
  };

  void push(SinkEvent event);

  // The pipeline calls a sink from whichever worker thread runs its stage, and moodycamel keeps
  // FIFO order per producing thread only: events carry their index and the consumer reorders.
  moodycamel::BlockingConcurrentQueue<Numbered> queue_;
  std::atomic<uint64_t> pushed_{0};
  uint64_t expected_ = 0;                        // consumer side
  std::map<uint64_t, SinkEvent> arrived_early_;  // consumer side
};

}  // namespace pipeline
