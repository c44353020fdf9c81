// A stage that throws (out of memory, say) ends the sequences its message carries with a 500
// naming the node, instead of leaving them unanswered: their places in the queue are free again,
// a forward pass that threw still reports its step so the scheduler goes on, and the engine
// keeps serving. The scheduler's own thread throwing fails the engine for good. The stages that
// throw here wrap the real ones, in graphs of the usual shape.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "graph/engine.h"
#include "graph/stage_registry.h"
#include "tests/support/collecting_sink.h"
#include "tests/support/engine_config.h"

namespace pipeline {
namespace {

using testing::CollectingSink;

// The stage `inner` is, except that it throws std::runtime_error("boom") on the messages
// `throws` picks.
class ThrowingStage final : public Stage {
 public:
  using Picker = std::function<bool(const Message&, int call)>;
  ThrowingStage(std::unique_ptr<Stage> inner, Picker throws)
      : inner_(std::move(inner)), throws_(std::move(throws)) {}
  void operator()(Message message, const Emit& emit) override {
    if (throws_(message, calls_++)) throw std::runtime_error("boom");
    (*inner_)(std::move(message), emit);
  }

 private:
  std::unique_ptr<Stage> inner_;
  Picker throws_;
  std::atomic<int> calls_{0};
};

// Registers `name`: the stage `inner` as `wrap` wraps it.
using Wrap = std::function<std::unique_ptr<Stage>(std::unique_ptr<Stage> inner)>;
void add_wrapping_stage(const std::string& name, const std::string& inner, Wrap wrap) {
  StageInfo info = *StageRegistry::global().find(inner);
  info.name = name;
  info.make = [inner, wrap](const GraphNodeSpec& spec, EngineContext& ctx) {
    return wrap(StageRegistry::global().find(inner)->make(spec, ctx));
  };
  StageRegistry::global().add(std::move(info));
}

// Registers `name`: the stage `inner` with ThrowingStage's picker.
void add_throwing_stage(const std::string& name, const std::string& inner,
                        ThrowingStage::Picker throws) {
  add_wrapping_stage(name, inner, [throws](std::unique_ptr<Stage> stage) {
    return std::make_unique<ThrowingStage>(std::move(stage), throws);
  });
}

// decode_step, except that before its first pass it hands the scheduler a step result that
// releases a block outside the KV pool: a broken invariant on the scheduler's own thread.
class SchedulerBreakingStage final : public Stage {
 public:
  explicit SchedulerBreakingStage(std::unique_ptr<Stage> inner) : inner_(std::move(inner)) {}
  void operator()(Message message, const Emit& emit) override {
    if (!broke_.exchange(true)) {
      auto request = std::make_shared<Request>();
      request->sink = std::make_shared<CollectingSink>();
      auto stray = std::make_shared<Sequence>(request, 1u << 30,
                                              [](Sequence&, const ResponseStream::Payload&) {});
      stray->block_table = {1 << 30};
      StepResult result;
      result.failed = {stray};
      emit(std::move(result));
    }
    (*inner_)(std::move(message), emit);
  }

 private:
  std::unique_ptr<Stage> inner_;
  std::atomic<bool> broke_{false};
};

// tokenize_boom throws on a request whose prompt is "boom"; decode_boom on its first call;
// decode_breaks_scheduler is SchedulerBreakingStage.
void add_stages_once() {
  static const bool added = [] {
    add_throwing_stage("tokenize_boom", "tokenize", [](const Message& message, int) {
      return std::get<Submitted>(message).seq->request->prompt == "boom";
    });
    add_throwing_stage("decode_boom", "decode_step",
                       [](const Message&, int call) { return call == 0; });
    add_wrapping_stage("decode_breaks_scheduler", "decode_step", [](std::unique_ptr<Stage> stage) {
      return std::make_unique<SchedulerBreakingStage>(std::move(stage));
    });
    return true;
  }();
  (void)added;
}

// stories260K on the CPU through the default graph's shape, with `tokenize` and `decode` as
// the stages named.
ServeConfig make_config(const std::string& tokenize, const std::string& decode) {
  add_stages_once();
  return testing::stories_engine_config(
      "server: {max_queue: 1, shutdown_grace_s: 30}\n"
      "scheduler: {window_ms: 0}\n"
      "graph:\n  nodes:\n"
      "    - {name: tokenize, stage: " +
      tokenize +
      "}\n"
      "    - {name: batch, stage: batch_window}\n"
      "    - {name: prefill, stage: prefill}\n"
      "    - {name: decode, stage: " +
      decode +
      "}\n"
      "    - {name: detok, stage: detokenize}\n"
      "    - {name: emit, stage: emit}\n"
      "  edges: [tokenize->batch, tokenize->emit, batch->prefill, batch->decode, "
      "prefill->batch, decode->batch, prefill->detok, decode->detok, detok->emit]\n");
}

std::shared_ptr<Request> make_request(const std::string& prompt) {
  static std::atomic<int> counter{0};
  auto request = std::make_shared<Request>();
  request->id = "cmpl-stage-" + std::to_string(counter++);
  request->chat = false;
  request->prompt = prompt;
  request->sampling.temperature = 0.0f;
  request->max_tokens = 8;
  request->ignore_eos = true;
  request->sink = std::make_shared<CollectingSink>();
  return request;
}

CollectingSink& sink_of(const std::shared_ptr<Request>& request) {
  return static_cast<CollectingSink&>(*request->sink);
}

void expect_internal_error(const std::shared_ptr<Request>& request, const std::string& node) {
  ASSERT_TRUE(sink_of(request).wait()) << request->id << " was left unanswered";
  const auto& error = sink_of(request).error();
  ASSERT_TRUE(error.has_value()) << request->id << " finished";
  EXPECT_EQ(error->http_status, 500);
  EXPECT_EQ(error->type, "server_error");
  EXPECT_EQ(error->message, "internal error in graph node " + node + ": boom");
}

void expect_completes(const std::shared_ptr<Request>& request) {
  ASSERT_TRUE(sink_of(request).wait()) << request->id << " did not end";
  ASSERT_TRUE(sink_of(request).completion().has_value())
      << request->id << " failed: " << sink_of(request).error()->message;
  EXPECT_EQ(sink_of(request).completion()->completion_tokens, 8);
}

TEST(StageFailure, ARequestWhoseTokenizeThrewFailsAndFreesItsQueuePlace) {
  Engine engine(make_config("tokenize_boom", "decode_step"));
  const auto boom = make_request("boom");
  ASSERT_EQ(engine.submit(boom), SubmitStatus::Accepted);
  expect_internal_error(boom, "tokenize");
  EXPECT_EQ(engine.metrics().waiting_sequences.value(), 0);
  // The queue holds one: the failed request's place is free for the next.
  const auto next = make_request("Once upon a time");
  ASSERT_EQ(engine.submit(next), SubmitStatus::Accepted);
  expect_completes(next);
  const auto before = std::chrono::steady_clock::now();
  engine.shutdown(std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(5))
      << "shutdown waited for a request that had ended";
}

TEST(StageFailure, ADecodeStepThatThrewFailsItsSequencesAndTheSchedulerGoesOn) {
  Engine engine(make_config("tokenize", "decode_boom"));
  const auto first = make_request("Once upon a time");
  ASSERT_EQ(engine.submit(first), SubmitStatus::Accepted);
  expect_internal_error(first, "decode");
  const auto next = make_request("Lily had a red ball");
  ASSERT_EQ(engine.submit(next), SubmitStatus::Accepted);
  expect_completes(next);
}

// An exception on the scheduler's thread leaves its queue and KV pool in no state to go on
// from: the engine fails for good, as when the runner does, instead of the process ending.
TEST(StageFailure, ASchedulerThatThrewFailsTheEngineForGood) {
  Engine engine(make_config("tokenize", "decode_breaks_scheduler"));
  std::atomic<int> heard{0};
  engine.on_failure([&](const std::string&) { ++heard; });
  const auto request = make_request("Once upon a time");
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(request).wait()) << "the request was left unanswered";
  const auto& error = sink_of(request).error();
  ASSERT_TRUE(error.has_value()) << "the request finished";
  EXPECT_EQ(error->http_status, 503);
  EXPECT_EQ(error->code, "engine_failed");
  const std::string why =
      "the scheduler failed: BlockManager::release: block 1073741824 is outside the pool";
  EXPECT_EQ(error->message.rfind(why, 0), 0u) << error->message;
  ASSERT_TRUE(engine.failure().has_value());
  EXPECT_EQ(engine.failure()->rfind(why, 0), 0u) << *engine.failure();
  // The engine tells its listener after failing the requests.
  for (int wait = 0; wait < 5000 && heard.load() == 0; ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(heard.load(), 1);
  EXPECT_EQ(engine.submit(make_request("Lily")), SubmitStatus::EngineFailed);
  const auto before = std::chrono::steady_clock::now();
  engine.shutdown(std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(5));
}

}  // namespace
}  // namespace pipeline
