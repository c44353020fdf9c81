// The client side of OpenAI-style streaming: POST a JSON body, read the answer as
// server-sent events (SSE) and hand over each event's data the moment it arrives. Used by
// `pipeline bench-serve`, which needs the arrival time of every chunk.
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

// The server could not be reached, answered with an error, or sent a stream that is not SSE.
class SseClientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Splits a server-sent-event byte stream into the data of its events: an event is the lines up
// to a blank line, its data the values of its "data:" lines joined by '\n'. Comment lines
// (":...") and the id, event and retry fields are skipped; any other line is malformed.
class SseParser {
 public:
  // Takes the next bytes, in any pieces; returns the data of every event they complete.
  // Throws SseClientError on a malformed line.
  std::vector<std::string> push(std::string_view bytes);

  // True when the bytes so far end inside an event (a stream cut off mid-event).
  bool inside_event() const { return !line_.empty() || in_event_; }

 private:
  void take_line(std::string_view line, std::vector<std::string>& events);

  std::string line_;  // the unfinished line
  std::string data_;  // the data lines of the current event
  bool has_data_ = false;
  bool in_event_ = false;  // a line of the current event was read
};

struct SseClientOptions {
  std::chrono::seconds connect_timeout{10};
  std::chrono::seconds read_timeout{300};  // longest wait for the next bytes
  std::string api_key;                     // sent as "Authorization: Bearer KEY" when set
};

class SseClient {
 public:
  // `url` is the server's root, "http://HOST:PORT" (a trailing '/' allowed); throws
  // std::invalid_argument naming the URL when it is anything else.
  SseClient(const std::string& url, SseClientOptions options);

  const std::string& url() const { return url_; }

  // GET `path`; the body of a 200 answer. Throws SseClientError otherwise.
  std::string get(const std::string& path) const;

  // POSTs `json_body` to `path` and calls `on_event` with the data of each event as it
  // arrives. Throws SseClientError when the server cannot be reached or times out, answers
  // other than 200 with text/event-stream, or the stream is malformed or breaks off inside an
  // event; an exception thrown by `on_event` ends the request and is rethrown.
  void post_stream(const std::string& path, const std::string& json_body,
                   const std::function<void(std::string_view data)>& on_event) const;

 private:
  std::string url_;
  std::string host_;
  int port_ = 0;
  SseClientOptions options_;
};

}  // namespace pipeline
