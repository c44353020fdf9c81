// One API call's answer as its connection thread writes it: the call's choices and how each
// ended (CallChoices), the watch on its client while the thread waits for events (ClientWatch),
// and the server-sent events of a streamed answer (EventStream).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include "graph/engine.h"
#include "server/http_counters.h"
#include "server/openai_response.h"
#include "server/peer_connection.h"
#include "server/response_queue.h"

namespace pipeline {

// How long a connection thread waits for its request's next event before it looks again
// whether the client is still there.
inline constexpr std::chrono::milliseconds kEventPoll{100};

// The requests of one API call, one per choice, and how each ended.
class CallChoices {
 public:
  CallChoices(Engine& engine, std::vector<std::shared_ptr<Request>> requests)
      : engine_(engine), requests_(std::move(requests)), completions_(requests_.size()) {}

  const std::vector<std::shared_ptr<Request>>& requests() const { return requests_; }
  // Records that `choice` finished; true once every choice has.
  bool finish(int choice, const Completion& completion) {
    completions_.at(size_t(choice)) = completion;
    return ++finished_ == requests_.size();
  }
  const std::vector<Completion>& completions() const { return completions_; }
  // The client left: every choice still running ends now.
  void cancel_all() {
    for (const auto& request : requests_) engine_.cancel(*request);
  }
  // A choice failed, and the call answers with its error: every other choice still running
  // ends now with it.
  void end_all(const RequestError& error) {
    for (const auto& request : requests_) engine_.end(*request, error);
  }

 private:
  Engine& engine_;
  std::vector<std::shared_ptr<Request>> requests_;
  std::vector<Completion> completions_;
  size_t finished_ = 0;
};

// Whether a call's client has left while its connection thread waits for events (before a
// stream's first chunk, and for a whole answer): the socket, asked at most once per kEventPoll
// whether events come or not. Asked only when none came, a whole answer whose tokens came a few
// milliseconds apart ran to its end for a client long gone.
class ClientWatch {
 public:
  explicit ClientWatch(const PeerConnection& peer) : peer_(peer) {}
  bool left() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check_) return false;
    next_check_ = now + kEventPoll;
    return peer_.closed();
  }

 private:
  const PeerConnection& peer_;
  std::chrono::steady_clock::time_point next_check_ = std::chrono::steady_clock::now() + kEventPoll;
};

// A streaming response: the connection thread pulls the call's events and writes each as a
// server-sent event until every choice has ended, or until the client goes away. It may start
// before the first event (`first` empty: the 200 went out while the request still waited), and
// writes an SSE comment whenever it has been silent for `keepalive` (zero: never).
class EventStream {
 public:
  EventStream(std::shared_ptr<CallChoices> choices, std::shared_ptr<ResponseQueue> queue,
              ResponseBuilder builder, bool include_usage, std::optional<ChoiceEvent> first,
              std::chrono::seconds keepalive, std::unique_ptr<ActiveResponse> active);

  // httplib's chunked content provider: writes what is ready, false when the client is gone.
  bool write_next(httplib::DataSink& out);

  // httplib's resource releaser: `success` is false when the stream broke off.
  void released(bool success);

 private:
  // An SSE comment line, which clients skip: it only shows the connection is alive.
  static constexpr const char* kKeepAliveComment = ": keep-alive\n\n";

  // A chat stream opens with every choice's role, before their tokens: with continuous usage,
  // counting the prompt they share as the first event found it.
  std::string opening(const ChoiceEvent& first);

  std::string render(ChoiceEvent& event);

  bool client_gone();

  std::shared_ptr<CallChoices> choices_;
  std::shared_ptr<ResponseQueue> queue_;
  ResponseBuilder builder_;
  bool include_usage_;
  std::optional<ChoiceEvent> pending_;
  std::chrono::seconds keepalive_;
  std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
  std::unique_ptr<ActiveResponse> active_;
  bool opened_ = false;
  bool ended_ = false;
};

}  // namespace pipeline
