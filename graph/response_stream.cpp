#include "graph/response_stream.h"

namespace pipeline {

ResponseStream::ResponseStream(std::shared_ptr<RequestSink> sink, OnEnd on_end)
    : sink_(std::move(sink)), on_end_(std::move(on_end)) {}

void ResponseStream::deliver(uint64_t index, Payload payload) {
  std::lock_guard lock(mutex_);
  if (ended_) return;
  pending_.emplace(index, std::move(payload));
  while (!ended_ && !pending_.empty() && pending_.begin()->first == next_) {
    auto node = pending_.extract(pending_.begin());
    ++next_;
    send(node.mapped());
  }
}

bool ResponseStream::fail(const RequestError& error) {
  std::lock_guard lock(mutex_);
  if (ended_) return false;
  Payload payload = error;
  send(payload);
  return true;
}

bool ResponseStream::ended() const {
  std::lock_guard lock(mutex_);
  return ended_;
}

void ResponseStream::send(Payload& payload) {
  if (auto* delta = std::get_if<Delta>(&payload)) {
    sink_->on_delta(std::move(*delta));
    return;
  }
  ended_ = true;
  pending_.clear();
  // Bookkeeping first: once the sink has its ending, its owner may tear everything down.
  if (on_end_) on_end_(payload);
  if (auto* completion = std::get_if<Completion>(&payload))
    sink_->on_finish(*completion);
  else
    sink_->on_error(std::get<RequestError>(payload));
}

}  // namespace pipeline
