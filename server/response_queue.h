// A connection thread's inbox for one API call: the pipeline delivers each choice's events
// through that choice's sink into one lock-free queue, and the thread that owns the HTTP
// connection pops them, in the order they were delivered, waiting as long as it likes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <variant>

#include <concurrentqueue/blockingconcurrentqueue.h>

#include "graph/request.h"

namespace pipeline {

using SinkEvent = std::variant<Delta, Completion, RequestError>;

// An event of the call's choice `choice` (its index in the response).
struct ChoiceEvent {
  int choice = 0;
  SinkEvent event;
};

class ResponseQueue : public std::enable_shared_from_this<ResponseQueue> {
 public:
  // The sink for the request of choice `choice`. It keeps the queue alive: the engine may end a
  // request after its connection thread has gone.
  std::shared_ptr<RequestSink> sink_for(int choice);

  // The next event in the order the pipeline delivered them, or nullopt when none arrives
  // within `timeout`. One consumer thread only.
  std::optional<ChoiceEvent> next(std::chrono::microseconds timeout);

 private:
  class ChoiceSink;
  struct Numbered {
    uint64_t index = 0;
    ChoiceEvent event;
  };

  void push(int choice, SinkEvent event);

  // The connection thread sleeps until an event arrives instead of spinning first (moodycamel's
  // default is 10,000 tries per wait): events come one decode step apart, milliseconds, so a
  // spin never catches one, and with a thread per open stream the spins took CPU from the
  // forward pass (6% of a CPU server's samples with 64 streams).
  struct QueueTraits : moodycamel::ConcurrentQueueDefaultTraits {
    static const int MAX_SEMA_SPINS = 0;
  };
  // The pipeline calls a sink from whichever worker thread runs its stage, and moodycamel keeps
  // FIFO order per producing thread only: events carry their index and the consumer reorders.
  moodycamel::BlockingConcurrentQueue<Numbered, QueueTraits> queue_;
  std::atomic<uint64_t> pushed_{0};
  uint64_t expected_ = 0;                          // consumer side
  std::map<uint64_t, ChoiceEvent> arrived_early_;  // consumer side
};

}  // namespace pipeline
