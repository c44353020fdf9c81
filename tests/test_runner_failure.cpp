// A model runner that fails for good (it throws RunnerFailure, as the CUDA runner does after a
// device error that leaves its context unusable): the engine fails every request in flight that
// still needs the model with a 503 and takes no more, while an answer the model had completed is
// still delivered; the HTTP server's completions and /health say so, and a batch run stops with
// an error, leaving the lines that failed unwritten for a rerun.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "graph/engine.h"
#include "graph/stage_registry.h"
#include "model/cpu_runner.h"
#include "server/batch_runner.h"
#include "server/http_server.h"
#include "stages/detokenize.h"
#include "stages/emit.h"
#include "tests/support/collecting_sink.h"
#include "tests/support/engine_config.h"
#include "tests/support/wrapping_runner.h"

namespace pipeline {
namespace {

using testing::CollectingSink;
using json = nlohmann::json;

// Holds an answer back on its way to its client until the engine has failed for good, so that
// the failure comes while the answer is being delivered, whatever the timing: the emit_held stage
// (an answer's ending) or the detokenize_held stage (the token `token_index` of an answer) waits
// at hold() (for at most 20 s, so that a failing test ends), the runner fails every forward
// pass from then on (failing_once_held), and the test's failure listener opens the gate.
class DeliveryGate {
 public:
  explicit DeliveryGate(int token_index = -1) : token_index_(token_index) {}
  int token_index() const { return token_index_; }
  void hold() {
    std::unique_lock lock(mutex_);
    held_ = true;
    changed_.notify_all();
    changed_.wait_for(lock, std::chrono::seconds(20), [&] { return open_; });
  }
  bool held() const {
    std::lock_guard lock(mutex_);
    return held_;
  }
  // False when no ending was held within 20 s.
  bool wait_held() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(20), [&] { return held_; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    changed_.notify_all();
  }

 private:
  const int token_index_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false;
  bool open_ = false;
};

// stories260K's CPU runner, except that a forward pass for which `fails` answers true (each
// maker's answer stays true from its first) throws RunnerFailure("device lost"). `gate`: the one
// a held stage holds answers at, where the test has one.
class FailingRunner final : public WrappingRunner {
 public:
  FailingRunner(std::unique_ptr<ModelRunner> runner, std::function<bool()> fails,
                DeliveryGate* gate = nullptr)
      : WrappingRunner(std::move(runner)), fails_(std::move(fails)), gate_(gate) {}
  std::string device_name() const override { return "failing"; }
  void forward(const Batch& batch, Logits& logits) override {
    if (fails_()) throw RunnerFailure("device lost");
    WrappingRunner::forward(batch, logits);
  }
  DeliveryGate& gate() const {
    if (!gate_) throw std::logic_error("a held stage needs a runner made by failing_once_held");
    return *gate_;
  }

 private:
  std::function<bool()> fails_;
  DeliveryGate* gate_;
};

// Fails forward pass number `pass` (from 1) and every later one.
RunnerMaker failing_at(int pass) {
  return [pass](std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options) {
    auto passes = std::make_shared<std::atomic<int>>(0);
    return std::make_unique<FailingRunner>(make_cpu_runner(std::move(weights), options),
                                           [pass, passes] { return ++*passes >= pass; });
  };
}

// Fails every forward pass once `gate` holds an answer.
RunnerMaker failing_once_held(DeliveryGate& gate) {
  return [&gate](std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options) {
    return std::make_unique<FailingRunner>(
        make_cpu_runner(std::move(weights), options), [&gate] { return gate.held(); }, &gate);
  };
}

bool ends_an_answer(const Message& message) {
  const auto& events = std::get<StreamEvents>(message).events;
  return std::any_of(events.begin(), events.end(), [](const StreamEvent& event) {
    return std::holds_alternative<Completion>(event.payload);
  });
}

// The stage `Inner`, except that it holds the first message `holds` picks at `gate`.
template <typename Inner>
class HeldStage final : public Stage {
 public:
  HeldStage(Inner inner, DeliveryGate& gate, std::function<bool(const Message&)> holds)
      : inner_(std::move(inner)), gate_(gate), holds_(std::move(holds)) {}
  void operator()(Message message, const Emit& emit) override {
    if (holds_(message) && !held_once_.exchange(true)) gate_.hold();
    inner_(std::move(message), emit);
  }

 private:
  Inner inner_;
  DeliveryGate& gate_;
  std::function<bool(const Message&)> holds_;
  std::atomic<bool> held_once_{false};
};

// stories260K on the CPU, one sequence running at a time, so that the forward passes come in
// the order requests were submitted; `graph`: the config's graph section, or none for the
// default graph.
ServeConfig make_config(const std::string& graph = "") {
  return testing::stories_engine_config(
      "server: {shutdown_grace_s: 5}\n"
      "scheduler: {window_ms: 0, max_batch: 1, max_num_seqs: 1}\n" +
      graph);
}

// Whether a step result carries token `index` of an answer.
bool carries_token(const Message& message, int index) {
  const auto& outputs = std::get<StepResult>(message).outputs;
  return std::any_of(outputs.begin(), outputs.end(),
                     [&](const SampledOutput& out) { return out.index == index; });
}

// Where make_held_config holds an answer: its ending at emit, or a token at detokenize.
enum class Held { ending, token };

// make_config's, except that one stage holds an answer at the gate of the engine's runner, which
// must come from failing_once_held.
ServeConfig make_held_config(Held held) {
  static const bool added = [] {
    StageInfo emit = EmitStage::info();
    emit.name = "emit_held";
    emit.make = [](const GraphNodeSpec&, EngineContext& ctx) {
      return std::make_unique<HeldStage<EmitStage>>(
          EmitStage(), dynamic_cast<FailingRunner&>(ctx.runner).gate(), ends_an_answer);
    };
    StageRegistry::global().add(std::move(emit));
    StageInfo detokenize = DetokenizeStage::info();
    detokenize.name = "detokenize_held";
    detokenize.make = [](const GraphNodeSpec&, EngineContext& ctx) {
      DeliveryGate& gate = dynamic_cast<FailingRunner&>(ctx.runner).gate();
      return std::make_unique<HeldStage<DetokenizeStage>>(
          DetokenizeStage(ctx), gate,
          [&gate](const Message& m) { return carries_token(m, gate.token_index()); });
    };
    StageRegistry::global().add(std::move(detokenize));
    return true;
  }();
  (void)added;
  const std::string detokenize = held == Held::token ? "detokenize_held" : "detokenize";
  const std::string emit = held == Held::ending ? "emit_held" : "emit";
  return make_config(
      "graph:\n  nodes:\n"
      "    - {name: tokenize, stage: tokenize}\n"
      "    - {name: batch, stage: batch_window}\n"
      "    - {name: prefill, stage: prefill}\n"
      "    - {name: decode, stage: decode_step}\n"
      "    - {name: detok, stage: " +
      detokenize +
      ", concurrency: unlimited}\n"
      "    - {name: emit, stage: " +
      emit +
      "}\n"
      "  edges: [tokenize->batch, tokenize->emit, batch->prefill, batch->decode, "
      "prefill->batch, decode->batch, prefill->detok, decode->detok, detok->emit]\n");
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

// The text make_request(max_tokens) is answered with by an engine that does not fail.
std::string answer_text(int max_tokens) {
  Engine engine(make_config());
  const auto request = make_request(max_tokens);
  EXPECT_EQ(engine.submit(request), SubmitStatus::Accepted);
  EXPECT_TRUE(sink_of(request).wait() && sink_of(request).completion().has_value());
  return sink_of(request).text();
}

// Tokens of the answer make_request(max_tokens) gets with the stop string `stop`, from an engine
// that does not fail: the last is the one whose text completes the stop string.
int stopped_answer_tokens(int max_tokens, const std::string& stop) {
  Engine engine(make_config());
  const auto request = make_request(max_tokens);
  request->stop = {stop};
  EXPECT_EQ(engine.submit(request), SubmitStatus::Accepted);
  EXPECT_TRUE(sink_of(request).wait() && sink_of(request).completion().has_value());
  return sink_of(request).completion()->completion_tokens;
}

void expect_delivered(const std::shared_ptr<Request>& request, const std::string& text,
                      FinishReason reason) {
  ASSERT_TRUE(sink_of(request).wait()) << request->id << " did not end";
  const auto error = sink_of(request).error();
  ASSERT_FALSE(error.has_value()) << "the complete answer was lost to a " << error->http_status
                                  << ": " << error->message;
  EXPECT_EQ(sink_of(request).completion()->reason, reason);
  EXPECT_EQ(sink_of(request).text(), text);
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

// An answer's last token is drawn, and its ending is on its way to the client when the engine
// fails for good (in the next request's prefill): the answer is delivered whole, and only the
// request that needed the model fails.
TEST(RunnerFailure, AnAnswerTheModelFinishedIsDeliveredThoughTheEngineFailsBeforeItArrives) {
  const std::string text = answer_text(4);
  DeliveryGate gate;
  Engine engine(make_held_config(Held::ending), failing_once_held(gate));
  engine.on_failure([&](const std::string&) { gate.open(); });
  const auto finished = make_request(4);
  ASSERT_EQ(engine.submit(finished), SubmitStatus::Accepted);
  ASSERT_TRUE(gate.wait_held()) << "the answer's ending never reached emit";
  const auto next = make_request(4);
  ASSERT_EQ(engine.submit(next), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(next).wait()) << "the request that needed the model did not end";
  ASSERT_TRUE(sink_of(next).error().has_value()) << "the request that needed the model finished";
  EXPECT_EQ(sink_of(next).error()->code, "engine_failed");
  expect_delivered(finished, text, FinishReason::Length);
  EXPECT_EQ(engine.failure(), "the model runner failed: device lost");
}

// The same for an answer a stop string ended, which detokenize finds: the scheduler may not
// have seen the stop yet, and then the pass that fails may be the sequence's own next one.
TEST(RunnerFailure, AnAnswerAStopStringEndedIsDeliveredThoughTheEngineFailsBeforeItArrives) {
  const std::string full = answer_text(32);
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(10, 5);
  DeliveryGate gate;
  Engine engine(make_held_config(Held::ending), failing_once_held(gate));
  engine.on_failure([&](const std::string&) { gate.open(); });
  const auto stopped = make_request(32);
  stopped->stop = {stop};
  ASSERT_EQ(engine.submit(stopped), SubmitStatus::Accepted);
  ASSERT_TRUE(gate.wait_held()) << "the answer's ending never reached emit";
  // Its prefill fails the engine, unless the stopped sequence's next pass did so first.
  const SubmitStatus next = engine.submit(make_request(4));
  EXPECT_TRUE(next == SubmitStatus::Accepted || next == SubmitStatus::EngineFailed);
  expect_delivered(stopped, full.substr(0, full.find(stop)), FinishReason::Stop);
  EXPECT_EQ(engine.failure(), "the model runner failed: device lost");
}

// The same for a stop string detokenize has yet to find when the engine fails: the token that
// completes it is held on its way into detokenize, so the scheduler keeps the sequence, whose
// next pass fails. Its failure waits for detokenize, which finds the stop.
TEST(RunnerFailure,
     AnAnswerAStopStringEndsInATokenNotYetDetokenizedIsDeliveredThoughTheEngineFails) {
  const std::string full = answer_text(32);
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(10, 5);
  constexpr int kMaxTokens = 200;  // far past the stop: the sequence decodes on meanwhile
  DeliveryGate gate(stopped_answer_tokens(kMaxTokens, stop) - 1);
  Engine engine(make_held_config(Held::token), failing_once_held(gate));
  engine.on_failure([&](const std::string&) { gate.open(); });
  const auto stopped = make_request(kMaxTokens);
  stopped->stop = {stop};
  ASSERT_EQ(engine.submit(stopped), SubmitStatus::Accepted);
  ASSERT_TRUE(gate.wait_held()) << "the stop string's last token never reached detokenize";
  expect_delivered(stopped, full.substr(0, full.find(stop)), FinishReason::Stop);
  EXPECT_EQ(engine.failure(), "the model runner failed: device lost");
}

// Where the tokens on their way to detokenize do not end the answer, the request fails once
// detokenize has had them, as every request that needs the model does, after their text.
TEST(RunnerFailure, ARequestWhoseTokensOnTheirWayToDetokenizeDoNotEndItFailsOnceTheyArrive) {
  constexpr int kMaxTokens = 200;
  const std::string full = answer_text(kMaxTokens);
  DeliveryGate gate(4);
  Engine engine(make_held_config(Held::token), failing_once_held(gate));
  engine.on_failure([&](const std::string&) { gate.open(); });
  const auto request = make_request(kMaxTokens);
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(gate.wait_held()) << "token 4 never reached detokenize";
  ASSERT_TRUE(sink_of(request).wait()) << "the request did not end";
  const auto error = sink_of(request).error();
  ASSERT_TRUE(error.has_value()) << "the request finished";
  EXPECT_EQ(error->http_status, 503);
  EXPECT_EQ(error->code, "engine_failed");
  const std::string text = sink_of(request).text();
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(full.starts_with(text)) << text;
  EXPECT_EQ(engine.failure(), "the model runner failed: device lost");
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
// next line's prefill, the third pass, fails, perhaps before the first answer reached the batch
// runner: it still arrives, within the shutdown's grace, and is written.
TEST(RunnerFailure, ABatchStopsAndWritesOnlyTheLinesThatFinished) {
  Engine engine(make_config(), failing_at(3));
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
