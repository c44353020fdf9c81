// A model runner that fails for good (it throws RunnerFailure, as the CUDA runner does after a
// device error that leaves its context unusable): the engine fails every request in flight with
// a 503 and takes no more, the HTTP server's completions and /health say so, and a batch run
// stops with an error, leaving the lines that failed unwritten for a rerun.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "graph/engine.h"
#include "model/cpu_runner.h"
#include "server/batch_runner.h"
#include "server/http_server.h"
#include "tests/support/collecting_sink.h"
#include "tests/support/engine_config.h"

namespace pipeline {
namespace {

using testing::CollectingSink;
using json = nlohmann::json;

// stories260K's CPU runner, except that its forward pass number `fail_at` (from 1) and every
// later one throw RunnerFailure("device lost"), after waiting `settle`: the engine's failure
// fails every request whose answer has not reached its client yet, so a test that counts the
// answers delivered gives those already drawn the time to get there.
class RunnerFailingAt final : public ModelRunner {
 public:
  RunnerFailingAt(std::unique_ptr<ModelRunner> runner, int fail_at,
                  std::chrono::milliseconds settle)
      : runner_(std::move(runner)), fail_at_(fail_at), settle_(settle) {}
  const LlamaConfig& config() const override { return runner_->config(); }
  const KvCacheShape& kv_shape() const override { return runner_->kv_shape(); }
  std::string device_name() const override { return "failing"; }
  void forward(const Batch& batch, Logits& logits) override {
    if (++passes_ >= fail_at_) {
      std::this_thread::sleep_for(settle_);
      throw RunnerFailure("device lost");
    }
    runner_->forward(batch, logits);
  }

 private:
  std::unique_ptr<ModelRunner> runner_;
  int fail_at_;
  std::chrono::milliseconds settle_;
  std::atomic<int> passes_{0};
};

RunnerMaker failing_at(int pass, std::chrono::milliseconds settle = std::chrono::milliseconds(0)) {
  return [pass, settle](std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options) {
    return std::make_unique<RunnerFailingAt>(make_cpu_runner(std::move(weights), options), pass,
                                             settle);
  };
}

// stories260K on the CPU, one sequence running at a time, so that the forward passes come in
// the order requests were submitted.
ServeConfig make_config() {
  return testing::stories_engine_config(
      "server: {shutdown_grace_s: 5}\n"
      "scheduler: {window_ms: 0, max_batch: 1, max_num_seqs: 1}\n");
}

std::shared_ptr<Request> make_request(int max_tokens) {
  static std::atomic<int> counter{0};
  auto request = std::make_shared<Request>();
  request->id = "cmpl-failure-" + std::to_string(counter++);
  request->chat = false;
  request->prompt = "Once upon a time";
  request->sampling.temperature = 0.0f;
  request->max_tokens = max_tokens;
  request->ignore_eos = true;
  request->sink = std::make_shared<CollectingSink>();
  return request;
}

CollectingSink& sink_of(const std::shared_ptr<Request>& request) {
  return static_cast<CollectingSink&>(*request->sink);
}

// What an Engine::on_failure listener heard. The engine calls it after failing the
// requests, so a test that saw them fail waits for it.
class FailureListener {
 public:
  void operator()(const std::string& why) {
    std::lock_guard lock(mutex_);
    heard_.push_back(why);
    changed_.notify_all();
  }
  std::vector<std::string> wait() {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(20), [&] { return !heard_.empty(); });
    return heard_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> heard_;
};

TEST(RunnerFailure, FailsEveryRequestInFlightAndRefusesNewOnes) {
  Engine engine(make_config(), failing_at(4));
  FailureListener listener;
  engine.on_failure([&](const std::string& why) { listener(why); });
  // The one admitted first (tokenize may pass them on in either order) decodes through passes
  // 2 and 3 and fails in pass 4; the other waits its turn.
  const auto a = make_request(100), b = make_request(100);
  ASSERT_EQ(engine.submit(a), SubmitStatus::Accepted);
  ASSERT_EQ(engine.submit(b), SubmitStatus::Accepted);
  for (const auto& request : {a, b}) {
    ASSERT_TRUE(sink_of(request).wait()) << request->id << " did not end";
    const auto& error = sink_of(request).error();
    ASSERT_TRUE(error.has_value()) << request->id << " finished";
    EXPECT_EQ(error->http_status, 503);
    EXPECT_EQ(error->code, "engine_failed");
    EXPECT_EQ(error->message, "the model runner failed: device lost");
  }
  EXPECT_EQ(listener.wait(), std::vector<std::string>{"the model runner failed: device lost"});
  EXPECT_EQ(engine.failure(), "the model runner failed: device lost");
  EXPECT_EQ(engine.submit(make_request(4)), SubmitStatus::EngineFailed);
  // A listener that comes late hears of it at once.
  bool late = false;
  engine.on_failure([&](const std::string&) { late = true; });
  EXPECT_TRUE(late);
  engine.shutdown(std::chrono::seconds(5));
}

TEST(RunnerFailure, TheHttpServerAnswers503AndHealthSaysWhy) {
  Engine engine(make_config(), failing_at(1));
  HttpServer server(engine);
  const int port = server.bind("127.0.0.1", 0);
  std::thread serving([&] { server.serve(); });
  httplib::Client client("127.0.0.1", port);
  const auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  const std::string body =
      R"({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 4})";
  for (const char* when : {"in flight", "after"}) {
    const auto answer = client.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(answer) << when;
    EXPECT_EQ(answer->status, 503) << when;
    const json error = json::parse(answer->body).at("error");
    EXPECT_EQ(error.at("code"), "engine_failed") << when;
    EXPECT_EQ(error.at("message"), "the model runner failed: device lost") << when;
  }
  const auto failed_health = client.Get("/health");
  ASSERT_TRUE(failed_health);
  EXPECT_EQ(failed_health->status, 503);
  EXPECT_EQ(json::parse(failed_health->body),
            json({{"status", "engine_failed"}, {"error", "the model runner failed: device lost"}}));
  server.shutdown(std::chrono::seconds(0));
  serving.join();
}

// Three lines, one sequence running at a time: the first line's two passes answer it, and the
// next line's prefill, the third pass, fails (after 200 ms, time for the first answer to reach
// the batch runner).
TEST(RunnerFailure, ABatchStopsAndWritesOnlyTheLinesThatFinished) {
  Engine engine(make_config(), failing_at(3, std::chrono::milliseconds(200)));
  std::vector<BatchInput> inputs;
  for (const char* id : {"a", "b", "c"}) {
    BatchInput input;
    input.line = int(inputs.size()) + 1;
    input.custom_id = id;
    input.endpoint = Endpoint::Completions;
    input.body =
        JsonBody::parse(R"({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 2,
                                     "temperature": 0, "ignore_eos": true})");
    inputs.push_back(std::move(input));
  }
  std::FILE* output = std::tmpfile();
  ASSERT_NE(output, nullptr);
  BatchRunner runner(engine, "input.jsonl", output);
  const std::atomic<bool> stop{false};
  try {
    runner.run(inputs, stop, std::chrono::seconds(60), [](const BatchProgress&) {});
    ADD_FAILURE() << "the run did not fail";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "the model runner failed: device lost; run the same command again for the lines "
              "left without results");
  }
  std::rewind(output);
  std::vector<json> lines;
  char line[65536];
  while (std::fgets(line, sizeof line, output)) lines.push_back(json::parse(line));
  std::fclose(output);
  // The line the first sequence answered: tokenize may pass the lines on in any order.
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].at("response").at("status_code"), 200);
}

}  // namespace
}  // namespace pipeline
