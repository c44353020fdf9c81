// HTTP calls to a `pipeline run` under test (tests/support/server_process.h), for the end-to-end
// tests: whole and streamed answers parsed (every SSE event, when it came, the text it adds up
// to), request bodies, /metrics samples, and the ServerE2E fixture's one shared server.
#pragma once

#include <chrono>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/support/server_process.h"

namespace pipeline::testing {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

inline constexpr const char* kModel = "stories260K";

// cpp-httplib is an uninstrumented shared library whose client builds function-local static
// regexes on first use. ThreadSanitizer cannot see the guard that publishes them, so when a
// process's first request runs on a background thread while the main thread sends another,
// the main thread's reads of the regex are reported as a race. One request on the main thread
// before any test starts builds them first (a test run alone, such as the shutdown tests,
// otherwise starts with a background stream beside a metrics poll).
class HttpClientStatics : public ::testing::Environment {
 public:
  void SetUp() override {
    httplib::Server server;
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    const int port = server.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port, 0);
    std::thread listener([&] { server.listen_after_bind(); });
    httplib::Client client("127.0.0.1", port);
    const httplib::Result result = client.Get("/");
    server.stop();
    listener.join();
    ASSERT_TRUE(result && result->status == 200) << "the warm-up request to an in-process server";
  }
};
inline const ::testing::Environment* const kHttpClientStatics =
    ::testing::AddGlobalTestEnvironment(new HttpClientStatics);

struct Reply {
  int status = 0;
  json body;
  std::string raw;
  httplib::Headers headers;
};

inline Reply send(int port, const std::string& method, const std::string& path,
                  const std::string& body, const httplib::Headers& headers = {}) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  httplib::Result result = method == "POST"
                               ? client.Post(path.c_str(), headers, body, "application/json")
                               : client.Get(path.c_str(), headers);
  if (!result)
    throw std::runtime_error(method + " " + path + ": " + httplib::to_string(result.error()));
  Reply reply{result->status, json(), result->body, result->headers};
  reply.body = json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  return reply;
}

// (Bodies keep their objects' order, as a client writes them: a JSON schema's properties.)
inline Reply post(int port, const std::string& path, const nlohmann::ordered_json& body) {
  return send(port, "POST", path, body.dump());
}

// A streamed answer: its events in order, when each arrived, and the text they add up to.
struct Stream {
  int status = 0;
  std::string content_type;
  std::string raw;
  std::vector<json> events;  // every `data:` payload but [DONE]
  std::vector<Clock::time_point> event_times;
  bool done = false;  // ended with data: [DONE]
  std::string text;
  std::string finish_reason;
  json stop_reason;                         // the finishing chunk's (vLLM's stop_reason)
  std::map<int, std::string> choice_texts;  // by choice index
  std::map<int, std::string> choice_finish_reasons;
  Clock::time_point first_content_time{};
};

inline void parse_events(Stream& stream, std::string& pending, Clock::time_point now) {
  for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
    const std::string event = pending.substr(0, end);
    pending.erase(0, end + 2);
    if (event == ": keep-alive") continue;  // a comment, which says only that the stream lives
    ASSERT_EQ(event.rfind("data: ", 0), 0u) << "not an SSE data event: " << event;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      stream.done = true;
      continue;
    }
    json payload = json::parse(data);
    for (const json& choice : payload.value("choices", json::array())) {
      std::string piece = choice.contains("delta") ? choice["delta"].value("content", "")
                                                   : choice.value("text", "");
      if (!piece.empty() && stream.first_content_time == Clock::time_point{})
        stream.first_content_time = now;
      stream.text += piece;
      stream.choice_texts[choice["index"].get<int>()] += piece;
      if (!choice["finish_reason"].is_null()) {
        stream.finish_reason = choice["finish_reason"];
        stream.stop_reason = choice.at("stop_reason");
        stream.choice_finish_reasons[choice["index"].get<int>()] = choice["finish_reason"];
      }
    }
    stream.events.push_back(std::move(payload));
    stream.event_times.push_back(now);
  }
}

// Posts a streaming request and parses its events as the bytes come in, keeping each event's
// arrival time; an error answer keeps its raw JSON body.
inline Stream post_stream(int port, const std::string& path, nlohmann::ordered_json body) {
  body["stream"] = true;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  Stream stream;
  std::string pending;
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  request.response_handler = [&](const httplib::Response& response) {
    stream.status = response.status;
    stream.content_type = response.get_header_value("Content-Type");
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    stream.raw.append(data, size);
    if (stream.status == 200) {
      pending.append(data, size);
      parse_events(stream, pending, Clock::now());
    }
    return true;
  };
  httplib::Result result = client.send(request);
  if (!result) throw std::runtime_error("POST " + path + ": " + httplib::to_string(result.error()));
  return stream;
}

inline json chat_body(const std::string& user, int max_tokens) {
  return {{"model", kModel},
          {"messages", {{{"role", "user"}, {"content", user}}}},
          {"temperature", 0},
          {"max_tokens", max_tokens}};
}

inline json with(json body, const std::string& key, json value) {
  body[key] = std::move(value);
  return body;
}

inline json completion_body(const std::string& prompt, int max_tokens) {
  return {{"model", kModel}, {"prompt", prompt}, {"temperature", 0}, {"max_tokens", max_tokens}};
}

// The value of one unlabelled Prometheus sample.
inline double metric(int port, const std::string& name) {
  const std::string text = send(port, "GET", "/metrics", "").raw;
  const std::regex line("(^|\n)" + name + " ([-+0-9.eE]+|NaN|[+-]Inf)");
  std::smatch match;
  if (!std::regex_search(text, match, line))
    throw std::runtime_error("metric " + name + " not in /metrics:\n" + text);
  return std::stod(match[2].str());
}

// The KV blocks in use, once every sequence's are released (or 10 s have passed). A sequence's
// blocks go back at the scheduler's next step after its ending, which its client may see first.
inline double kv_blocks_used_when_settled(int port) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (metric(port, "pipeline_kv_blocks_used") != 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return metric(port, "pipeline_kv_blocks_used");
}

// A story opening per index, so concurrent requests differ.
inline std::string story_prompt(int i) {
  static const char* kStarts[] = {"Once upon a time", "The little dog",  "Lily wanted to",
                                  "One day, a bird",  "Tom and his mom", "The sun was",
                                  "A big red ball",   "In the park,"};
  return std::string(kStarts[i % 8]) + (i >= 8 ? " and then" : "");
}

// ---- One shared server per test program, for most of its tests (batch window 200 ms, the
// default)

class ServerE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess(stories_config("scheduler:\n  window_ms: 200\n  max_batch: 16\n"));
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }

  inline static ServerProcess* server_ = nullptr;
};

}  // namespace pipeline::testing
