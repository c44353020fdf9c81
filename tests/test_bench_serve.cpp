// `pipeline bench-serve`: against the real `pipeline run` on stories260K (CPU) its counts must
// add up (every request generates exactly --max-tokens tokens); against a dead port, an error
// answer, a broken stream or a silent server it must fail with a message, never hang. And the
// SSE parser it reads streams with.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/sse_client.h"
#include "tests/support/command.h"
#include "tests/support/server_process.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::ServerProcess;
using testing::stories_config;

// ---- Running `pipeline bench-serve`

CommandResult bench_serve(std::vector<std::string> args) {
  args.insert(args.begin(), "bench-serve");
  return testing::run_pipeline(args);
}

// ---- Against the real server

TEST(BenchServe, FourStreamsOfSixteenTokensAddUp) {
  ServerProcess server(stories_config("scheduler:\n  window_ms: 50\n"));
  const CommandResult run =
      bench_serve({"--url", server.base_url(), "--requests", "4", "--max-tokens", "16", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json report = json::parse(run.out);
  EXPECT_EQ(report["model"], "stories260K");  // asked of GET /v1/models
  EXPECT_EQ(report["endpoint"], "/v1/completions");
  EXPECT_EQ(report["requests"], 4);
  EXPECT_EQ(report["concurrency"], 4);
  EXPECT_EQ(report["completion_tokens"], 64);
  // --prompt-tokens 32 (the default): 32 tokens "▁a" and BOS.
  EXPECT_EQ(report["prompt_tokens"], 4 * 33);
  EXPECT_GT(report["duration_s"].get<double>(), 0.0);
  EXPECT_NEAR(report["output_tokens_per_s"].get<double>(), 64 / report["duration_s"].get<double>(),
              1e-6);
  EXPECT_NEAR(report["requests_per_s"].get<double>(), 4 / report["duration_s"].get<double>(), 1e-6);
  EXPECT_GT(report["request_tokens_per_s"]["median"].get<double>(), 0.0);
  EXPECT_GT(report["ttft_ms"]["median"].get<double>(), 0.0);
  EXPECT_GE(report["ttft_ms"]["p99"], report["ttft_ms"]["median"]);
  EXPECT_GE(report["itl_ms"]["p99"], report["itl_ms"]["median"]);
  EXPECT_GE(report["itl_ms"]["max"], report["itl_ms"]["p99"]);
  ASSERT_EQ(report["per_request"].size(), 4u);
  for (const json& request : report["per_request"]) {
    EXPECT_EQ(request["completion_tokens"], 16);
    EXPECT_GT(request["ttft_ms"].get<double>(), 0.0);
    EXPECT_LE(request["ttft_ms"].get<double>(), request["total_ms"].get<double>());
    EXPECT_LE(request["total_ms"].get<double>(), report["duration_s"].get<double>() * 1e3);
  }

  // n choices a request: each generates --max-tokens; the prompt counts once.
  const CommandResult choices = bench_serve(
      {"--url", server.base_url(), "--requests", "2", "--max-tokens", "8", "--n", "3", "--json"});
  ASSERT_EQ(choices.exit_code, 0) << choices.err;
  EXPECT_EQ(choices.err.find("warning"), std::string::npos) << choices.err;
  const json by_choices = json::parse(choices.out);
  EXPECT_EQ(by_choices["n"], 3);
  EXPECT_EQ(by_choices["completion_tokens"], 2 * 3 * 8);
  EXPECT_EQ(by_choices["prompt_tokens"], 2 * 33);
  for (const json& request : by_choices["per_request"]) EXPECT_EQ(request["completion_tokens"], 24);

  // Chat, one request at a time, a prompt of our own, the table.
  const CommandResult chat =
      bench_serve({"--url", server.base_url(), "--chat", "--requests", "2", "--concurrency", "1",
                   "--max-tokens", "8", "--prompt", "Tell me a story."});
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.out.find("/v1/chat/completions"), std::string::npos) << chat.out;
  EXPECT_NE(chat.out.find("requests / concurrency       2 / 1"), std::string::npos) << chat.out;
  EXPECT_NE(chat.out.find("completion tokens (all)      16"), std::string::npos) << chat.out;
}

// ---- Failures

// A port nothing listens on: bound, then closed.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0)
    throw std::runtime_error("cannot bind a socket");
  close(fd);
  return ntohs(address.sin_port);
}

TEST(BenchServe, AnUnreachableServerIsAnErrorThatNamesIt) {
  const std::string url = "http://127.0.0.1:" + std::to_string(free_port());
  for (bool named_model : {false, true}) {
    SCOPED_TRACE(named_model ? "--model given" : "model asked of the server");
    std::vector<std::string> args = {"--url", url, "--requests", "2"};
    if (named_model) args.insert(args.end(), {"--model", "m"});
    const CommandResult run = bench_serve(args);
    EXPECT_EQ(run.exit_code, 1);
    EXPECT_TRUE(run.out.empty()) << run.out;
    EXPECT_NE(run.err.find("no answer from " + url + ": cannot connect"), std::string::npos)
        << run.err;
  }
}

TEST(BenchServe, ABadUrlIsAUsageError) {
  const CommandResult run = bench_serve({"--url", "localhost:8000"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--url: expected a server's root URL, http://HOST:PORT"),
            std::string::npos)
      << run.err;
}

// A stand-in server whose /v1/completions answers as `answer` says.
class FakeServer {
 public:
  explicit FakeServer(httplib::Server::Handler answer) {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake"}]})", "application/json");
    });
    server_.Post("/v1/completions", std::move(answer));
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

void expect_failure(const httplib::Server::Handler& answer, const std::string& message,
                    std::vector<std::string> extra_args = {}) {
  FakeServer server(answer);
  std::vector<std::string> args = {"--url", server.url(), "--requests", "2", "--max-tokens", "4"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const auto started = std::chrono::steady_clock::now();
  const CommandResult run = bench_serve(args);
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.err.find(message), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("all 2 requests failed"), std::string::npos) << run.err;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
}

void answer_stream(httplib::Response& res, const std::string& body) {
  res.set_content(body, "text/event-stream");
}

const std::string kChunk =
    R"(data: {"object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}]})"
    "\n\n";
const std::string kUsage =
    R"(data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}})"
    "\n\n";

TEST(BenchServe, ErrorAnswersAndBrokenStreamsFailWithAMessage) {
  {
    SCOPED_TRACE("HTTP 400");
    expect_failure(
        [](const httplib::Request&, httplib::Response& res) {
          res.status = 400;
          res.set_content(R"({"error":{"message":"max_tokens is too large"}})", "application/json");
        },
        "/v1/completions: HTTP 400: {\"error\":{\"message\":\"max_tokens is too large\"}}");
  }
  {
    SCOPED_TRACE("not JSON");
    expect_failure([](const httplib::Request&,
                      httplib::Response& res) { answer_stream(res, "data: {oops\n\n"); },
                   "an event's data is not a JSON object: {oops");
  }
  {
    SCOPED_TRACE("not SSE");
    expect_failure(
        [](const httplib::Request&, httplib::Response& res) { answer_stream(res, "hello\n\n"); },
        "malformed server-sent event: the line 'hello'");
  }
  {
    SCOPED_TRACE("not a stream");
    expect_failure(
        [](const httplib::Request&, httplib::Response& res) {
          res.set_content(R"({"choices":[]})", "application/json");
        },
        "the answer is not a text/event-stream");
  }
  {
    SCOPED_TRACE("no [DONE]");
    expect_failure([](const httplib::Request&,
                      httplib::Response& res) { answer_stream(res, kChunk + kUsage); },
                   "the stream closed without data: [DONE]");
  }
  {
    SCOPED_TRACE("no usage");
    expect_failure([](const httplib::Request&,
                      httplib::Response& res) { answer_stream(res, kChunk + "data: [DONE]\n\n"); },
                   "the stream has no usage chunk");
  }
  {
    SCOPED_TRACE("an error event");
    expect_failure(
        [](const httplib::Request&, httplib::Response& res) {
          answer_stream(res, kChunk + R"(data: {"error":{"message":"out of memory"}})" + "\n\n");
        },
        "the server ended the stream with an error: {\"message\":\"out of memory\"}");
  }
}

TEST(BenchServe, ASilentServerTimesOut) {
  expect_failure(
      [](const httplib::Request&, httplib::Response& res) {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        answer_stream(res, "data: [DONE]\n\n");
      },
      "no bytes came for 1 s", {"--timeout", "1"});
}

TEST(BenchServe, AWellFormedFakeStreamIsMeasured) {
  FakeServer server([](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body);
    // What bench-serve must ask for so that every request does the same work.
    if (body["ignore_eos"] != true || body["stream"] != true ||
        body["stream_options"]["include_usage"] != true || body["temperature"] != 0 ||
        body["model"] != "fake" || body["max_tokens"] != 4) {
      res.status = 400;
      res.set_content("unexpected request " + req.body, "text/plain");
      return;
    }
    answer_stream(res, kChunk + kChunk + kChunk + kChunk + kUsage + "data: [DONE]\n\n");
  });
  const CommandResult run =
      bench_serve({"--url", server.url() + "/", "--requests", "3", "--max-tokens", "4", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(run.err.empty()) << run.err;
  const json report = json::parse(run.out);
  EXPECT_EQ(report["completion_tokens"], 12);
  EXPECT_EQ(report["prompt_tokens"], 9);
  EXPECT_EQ(report["url"], server.url()) << "the root, without the trailing slash";
}

// With n > 1 the choices' chunks of one step arrive together: the inter-token latency is the
// gap between one choice's chunks (here the 50 ms between steps), not between two choices' (its
// median was about 0). TTFT is the first choice's first chunk.
TEST(BenchServe, InterTokenLatencyIsMeasuredWithinEachChoice) {
  FakeServer server([](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
      for (int step = 0; step < 4; ++step) {
        if (step > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (int choice : {1, 0}) {
          const std::string event = R"(data: {"choices":[{"index":)" + std::to_string(choice) +
                                    R"(,"text":"x","finish_reason":null}]})" + "\n\n";
          sink.write(event.data(), event.size());
        }
      }
      const std::string end =
          R"(data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":8}})"
          "\n\ndata: [DONE]\n\n";
      sink.write(end.data(), end.size());
      sink.done();
      return true;
    });
  });
  const CommandResult run = bench_serve(
      {"--url", server.url(), "--requests", "1", "--max-tokens", "4", "--n", "2", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json report = json::parse(run.out);
  EXPECT_GE(report["itl_ms"]["median"].get<double>(), 45.0) << run.out;
  EXPECT_GE(report["itl_ms"]["max"].get<double>(), report["itl_ms"]["median"].get<double>());
}

// Requests that fail are counted and left out of the figures, which the others still give; the
// command exits 1. (One failure discarded every figure.)
TEST(BenchServe, TheFiguresOfTheRequestsThatSucceededAreKept) {
  std::atomic<int> served{0};
  FakeServer server([&](const httplib::Request&, httplib::Response& res) {
    if (served++ % 2 == 1) {
      res.status = 503;
      res.set_content(R"({"error":{"message":"queue full"}})", "application/json");
      return;
    }
    answer_stream(res, kChunk + kChunk + kChunk + kChunk + kUsage + "data: [DONE]\n\n");
  });
  const CommandResult run = bench_serve({"--url", server.url(), "--requests", "4", "--concurrency",
                                         "1", "--max-tokens", "4", "--json"});
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("HTTP 503"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("2 of 4 requests failed; the figures are the other 2's"),
            std::string::npos)
      << run.err;
  const json report = json::parse(run.out);
  EXPECT_EQ(report["failed"], 2);
  EXPECT_EQ(report["completion_tokens"], 8);
  EXPECT_NEAR(report["requests_per_s"].get<double>(), 2 / report["duration_s"].get<double>(), 1e-6);
  ASSERT_EQ(report["per_request"].size(), 4u);
  EXPECT_NE(report["per_request"][1]["error"].get<std::string>().find("HTTP 503"),
            std::string::npos)
      << report["per_request"][1];

  const CommandResult table = bench_serve(
      {"--url", server.url(), "--requests", "2", "--concurrency", "1", "--max-tokens", "4"});
  EXPECT_EQ(table.exit_code, 1) << table.err;
  EXPECT_NE(table.out.find("failed (not in the figures)  1"), std::string::npos) << table.out;
}

// --request-rate R sends the requests as a Poisson process of R a second (vLLM's benchmark's
// arrivals), from a fixed seed: the same send times in every run, spread at about 1/R apart,
// whatever the concurrency allows.
TEST(BenchServe, ARequestRateSpreadsTheSendsAsAPoissonProcess) {
  FakeServer server([](const httplib::Request&, httplib::Response& res) {
    answer_stream(res, kChunk + kChunk + kChunk + kChunk + kUsage + "data: [DONE]\n\n");
  });
  const auto sent_ms = [&] {
    const CommandResult run = bench_serve({"--url", server.url(), "--requests", "12",
                                           "--request-rate", "20", "--max-tokens", "4", "--json"});
    EXPECT_EQ(run.exit_code, 0) << run.err;
    const json report = json::parse(run.out);
    EXPECT_EQ(report["request_rate"], 20.0);
    std::vector<double> sent;
    for (const json& request : report["per_request"]) sent.push_back(request["sent_ms"]);
    return sent;
  };
  const std::vector<double> first = sent_ms(), second = sent_ms();
  ASSERT_EQ(first.size(), 12u);
  EXPECT_EQ(first.front(), 0.0);
  for (size_t i = 1; i < first.size(); ++i) {
    // In order, but for the threads' wake-ups: two requests due a millisecond apart on a busy
    // host may go out the other way round.
    EXPECT_GE(first[i], first[i - 1] - 30.0) << "request " << i;
    EXPECT_NEAR(first[i], second[i], 30.0) << "request " << i << ": the same times every run";
  }
  // 11 gaps of 50 ms on average: the draws from seed 0 sum to between 0.2 and 2 s.
  EXPECT_GT(first.back(), 200.0);
  EXPECT_LT(first.back(), 2000.0);
  const CommandResult zero =
      bench_serve({"--url", server.url(), "--request-rate", "0", "--max-tokens", "4"});
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_NE(zero.err.find("--request-rate must be more than 0"), std::string::npos) << zero.err;
}

// A request in flight is a thread: at most 1024 of them.
TEST(BenchServe, ConcurrencyIsAtMostAThousandAndTwentyFour) {
  const CommandResult run =
      bench_serve({"--url", "http://127.0.0.1:1", "--requests", "5000", "--concurrency", "5000"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--concurrency"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("1024"), std::string::npos) << run.err;
}

// ---- SseParser

TEST(SseParser, SplitsEventsWhereverTheBytesBreak) {
  const std::string stream =
      ": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\nid: 7\ndata: one\ndata:two\n\ndata: "
      "[DONE]\n\n";
  for (size_t piece : {size_t(1), size_t(3), stream.size()}) {
    SCOPED_TRACE("pieces of " + std::to_string(piece));
    SseParser parser;
    std::vector<std::string> events;
    for (size_t at = 0; at < stream.size(); at += piece) {
      for (auto& event : parser.push(std::string_view(stream).substr(at, piece)))
        events.push_back(event);
    }
    EXPECT_EQ(events, (std::vector<std::string>{"{\"a\":1}", "one\ntwo", "[DONE]"}));
    EXPECT_FALSE(parser.inside_event());
  }
}

TEST(SseParser, KnowsAStreamCutInsideAnEvent) {
  SseParser parser;
  EXPECT_TRUE(parser.push("data: {\"a\"").empty());
  EXPECT_TRUE(parser.inside_event());
  EXPECT_TRUE(parser.push(":1}\n").empty());
  EXPECT_TRUE(parser.inside_event());
  EXPECT_EQ(parser.push("\n"), std::vector<std::string>{"{\"a\":1}"});
  EXPECT_FALSE(parser.inside_event());
}

TEST(SseParser, RejectsALineThatIsNoField) {
  SseParser parser;
  EXPECT_THROW(parser.push("<html>\n"), SseClientError);
}

}  // namespace
}  // namespace pipeline
