// The one way results reach a request's sink: events in their numbered order, then exactly
// one ending (on_finish or on_error), whichever thread gets there first. The emit stage
// delivers the normal stream; others end a stream early: the engine (cancel, shutdown), the
// model stages (a failed forward pass), the graph (a node that throws) and the scheduler (no
// KV blocks left).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <variant>

#include "graph/request.h"

namespace pipeline {

class ResponseStream {
 public:
  using Payload = std::variant<Delta, Completion, RequestError>;
  // Runs once, right before the sink receives its ending (Completion or RequestError).
  using OnEnd = std::function<void(const Payload& ending)>;

  ResponseStream(std::shared_ptr<RequestSink> sink, OnEnd on_end);

  // Delivers event `index` once events 0..index-1 are delivered; drops it after the end.
  void deliver(uint64_t index, Payload payload);
  // Ends the stream now with `error`, dropping what is still pending. False when already ended.
  bool fail(const RequestError& error);
  bool ended() const;

 private:
  void send(Payload& payload);  // under mutex_
  void end(const Payload& ending);

  std::shared_ptr<RequestSink> sink_;
  OnEnd on_end_;
  mutable std::mutex mutex_;
  uint64_t next_ = 0;
  std::map<uint64_t, Payload> pending_;
  bool ended_ = false;
};

}  // namespace pipeline
