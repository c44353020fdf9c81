// The Engine in process (no HTTP) on the real tiny model stories260K: answers equal a plain
// solo run of the model (model/generation.h's Generator), however requests are batched,
// interleaved or preempted; cancellation frees KV blocks; the queue limit and shutdown answer
// every request explicitly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "graph/engine.h"
#include "graph/scheduler.h"
#include "io/tokenizer.h"
#include "model/cpu_runner.h"
#include "model/generation.h"
#include "model/llama_weights.h"
#include "tests/support/collecting_sink.h"
#include "tests/support/engine_config.h"
#include "tests/support/eventually.h"
#include "tests/support/shared_data.h"
#include "tests/support/wrapping_runner.h"

namespace pipeline {
namespace {

using testing::CollectingSink;
using testing::eventually;
using namespace std::chrono_literals;

const std::vector<std::string> kPrompts = {
    "Once upon a time",       "Lily had a red ball", "Tom went to the park", "The cat was hungry",
    "One day, a little bird", "Sam and his dog",     "There was a big tree", "Mom said",
    "The sun was hot",        "A girl named Sue",    "The boy saw a frog",   "It was a rainy day",
    "Ben liked to run",       "The old man",         "Anna found a box",     "The fish swam"};

std::filesystem::path model_dir() {
  return testing::shared_path("models/stories260K");
}

// A config for stories260K on the CPU with `scheduler` as its scheduler section.
ServeConfig make_config(const std::string& scheduler, int max_queue = 256) {
  return testing::stories_engine_config("server: {max_queue: " + std::to_string(max_queue) +
                                        ", shutdown_grace_s: 5}\nscheduler: " + scheduler + "\n");
}

std::shared_ptr<Request> make_request(const std::string& prompt, int max_tokens,
                                      bool ignore_eos = false) {
  auto request = std::make_shared<Request>();
  static std::atomic<int> counter{0};
  request->id = "cmpl-test-" + std::to_string(counter++);
  request->chat = false;
  request->prompt = prompt;
  request->sampling.temperature = 0.0f;  // greedy: the solo run is the reference
  request->max_tokens = max_tokens;
  request->ignore_eos = ignore_eos;
  request->sink = std::make_shared<CollectingSink>();
  return request;
}

CollectingSink& sink_of(const std::shared_ptr<Request>& r) {
  return static_cast<CollectingSink&>(*r->sink);
}

// The plain solo run: the prompt alone through the model with greedy sampling.
class SoloReference {
 public:
  SoloReference()
      : weights_(std::make_shared<const LlamaWeights>(LlamaWeights::load(model_dir()))),
        tokenizer_(model_dir() / "tokenizer.model") {
    RunnerOptions options;
    options.max_num_seqs = 1;
    runner_ = make_cpu_runner(weights_, options);
  }

  std::string text(const std::string& prompt, int max_tokens, bool ignore_eos = false) {
    GenerationRequest request;
    request.prompt = tokenizer_.encode(prompt, true);
    request.sampling.temperature = 0.0f;
    request.max_tokens = max_tokens;
    request.ignore_eos = ignore_eos;
    Generator generator(*runner_, 1);
    auto result = generator.run(std::span(&request, 1)).front();
    if (result.finish == FinishReason::Stop) result.tokens.pop_back();  // the end-of-sequence id
    // What the tokens add to the prompt's text (the first one's space included).
    std::vector<int32_t> all = request.prompt;
    all.insert(all.end(), result.tokens.begin(), result.tokens.end());
    return tokenizer_.decode(all).substr(tokenizer_.decode(request.prompt).size());
  }

 private:
  std::shared_ptr<const LlamaWeights> weights_;
  Tokenizer tokenizer_;
  std::unique_ptr<ModelRunner> runner_;
};

SoloReference& solo() {
  static SoloReference reference;
  return reference;
}

void expect_finished_with(const std::shared_ptr<Request>& r, const std::string& expected) {
  auto& sink = sink_of(r);
  ASSERT_TRUE(sink.wait()) << r->id << " did not end";
  ASSERT_TRUE(sink.completion().has_value())
      << r->id << " failed: " << (sink.error() ? sink.error()->message : "");
  EXPECT_EQ(sink.text(), expected) << r->id << " (" << r->prompt << ")";
  EXPECT_FALSE(sink.out_of_order());
}

TEST(Engine, GreedyAnswerEqualsASoloRun) {
  Engine engine(make_config("{window_ms: 0}"));
  auto request = make_request(kPrompts[0], 0);  // up to an end-of-sequence id or the context
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  expect_finished_with(request, solo().text(kPrompts[0], 0));
  const auto completion = *sink_of(request).completion();
  EXPECT_EQ(completion.prompt_tokens,
            int(Tokenizer(model_dir() / "tokenizer.model").encode(kPrompts[0], true).size()));
  EXPECT_GT(completion.completion_tokens, 0);
  EXPECT_EQ(engine.model_name(), "stories260K");
}

TEST(Engine, SixteenConcurrentRequestsArePrefilledAsOneBatch) {
  Engine engine(make_config("{window_ms: 200, max_batch: 16}"));
  std::vector<std::shared_ptr<Request>> requests;
  for (const auto& prompt : kPrompts) requests.push_back(make_request(prompt, 48));
  for (const auto& r : requests) ASSERT_EQ(engine.submit(r), SubmitStatus::Accepted);
  for (size_t i = 0; i < requests.size(); ++i)
    expect_finished_with(requests[i], solo().text(kPrompts[i], 48));
  const auto& m = engine.metrics();
  EXPECT_EQ(m.prefill_batches.value(), 1u) << "16 prompts should share one prefill";
  EXPECT_EQ(m.prefill_batch_size.sum(), 16.0);
  EXPECT_NE(engine.metrics_text().find("pipeline_prefill_batches_total 1\n"), std::string::npos);
}

TEST(Engine, ALateRequestJoinsTheRunningBatch) {
  Engine engine(make_config("{window_ms: 0}"));
  auto a = make_request(kPrompts[1], 400, /*ignore_eos=*/true);
  auto b = make_request(kPrompts[2], 400, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(a), SubmitStatus::Accepted);
  ASSERT_EQ(engine.submit(b), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(a).wait_for_delta());
  auto late = make_request(kPrompts[3], 16);
  ASSERT_EQ(engine.submit(late), SubmitStatus::Accepted);
  expect_finished_with(late, solo().text(kPrompts[3], 16));
  expect_finished_with(a, solo().text(kPrompts[1], 400, true));
  expect_finished_with(b, solo().text(kPrompts[2], 400, true));
  // Continuous batching: the late request's first token came while the others still decoded.
  EXPECT_LT(*sink_of(late).first_delta_at(), *sink_of(a).ended_at());
  EXPECT_LT(*sink_of(late).ended_at(), *sink_of(b).ended_at());
  EXPECT_GE(engine.metrics().prefill_batches.value(), 2u);
}

// The first four prompts submitted together, each to exactly `max_tokens` tokens: every answer
// equals the prompt's solo run.
void expect_four_answer_as_alone(Engine& engine, int max_tokens) {
  std::vector<std::shared_ptr<Request>> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(make_request(kPrompts[i], max_tokens, true));
  for (const auto& r : requests) ASSERT_EQ(engine.submit(r), SubmitStatus::Accepted);
  for (int i = 0; i < 4; ++i)
    expect_finished_with(requests[i], solo().text(kPrompts[i], max_tokens, true));
}

TEST(Engine, ASmallKvPoolPreemptsAndStillAnswersIdentically) {
  // 4 sequences of up to ~125 tokens need 32 blocks of 16; the pool has 12.
  Engine engine(make_config("{window_ms: 100, max_batch: 4, kv_cache_blocks: 12}"));
  expect_four_answer_as_alone(engine, 120);
  const auto& m = engine.metrics();
  EXPECT_GT(m.preemptions.value(), 0u);
  EXPECT_EQ(m.kv_blocks_total.value(), 12);
  // The prefix cache is asked once per prompt, at its first admission: a preempted sequence
  // resuming from its own blocks (its answer's among them) is no hit. These short prompts
  // share no full block.
  EXPECT_EQ(m.prefix_cache_queried_tokens.value(), m.prompt_tokens.value());
  EXPECT_EQ(m.prefix_cache_hit_tokens.value(), 0u);
  EXPECT_EQ(m.prompt_tokens_prefilled.value(), m.prompt_tokens.value());
}

// A prompt of about 200 tokens: the test prompts one after another.
std::string long_prompt() {
  std::string text;
  for (int round = 0; round < 2; ++round)
    for (const auto& prompt : kPrompts) text += prompt + ". ";
  return text;
}

// Holds an engine's decode passes back, so that a test can hand the scheduler requests while a
// sequence is between two tokens, whatever the timing: held() is ready once a decode pass
// waits, and the passes go on from open() (or after 10 s, so that a failing test ends).
class DecodeGate {
 public:
  // A maker of stories260K's CPU runner whose decode passes wait at this gate, which must
  // outlive the engine.
  RunnerMaker runner_maker();
  void wait_held() { ASSERT_EQ(held_future_.wait_for(10s), std::future_status::ready); }
  void open() { open_.set_value(); }

 private:
  friend class DecodeHeldRunner;
  void hold() {
    std::call_once(held_once_, [&] { held_.set_value(); });
    open_future_.wait_for(10s);
  }

  std::promise<void> open_;
  std::shared_future<void> open_future_ = open_.get_future().share();
  std::promise<void> held_;
  std::future<void> held_future_ = held_.get_future();
  std::once_flag held_once_;
};

class DecodeHeldRunner final : public WrappingRunner {
 public:
  DecodeHeldRunner(std::unique_ptr<ModelRunner> runner, DecodeGate& gate)
      : WrappingRunner(std::move(runner)), gate_(gate) {}
  void forward(const Batch& batch, Logits& logits) override {
    if (batch.is_decode()) gate_.hold();
    WrappingRunner::forward(batch, logits);
  }

 private:
  DecodeGate& gate_;
};

RunnerMaker DecodeGate::runner_maker() {
  return [this](std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options) {
    return std::make_unique<DecodeHeldRunner>(make_cpu_runner(std::move(weights), options), *this);
  };
}

// Waits until the batch node has handed the scheduler `calls` messages (new sequences and step
// results): the node counts a call once its body has posted the message.
void wait_for_batch_calls(const Engine& engine, int calls) {
  const std::string line = "pipeline_stage_calls_total{stage=\"batch\"} " + std::to_string(calls);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (engine.metrics_text().find(line + "\n") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "never saw " << line;
    std::this_thread::sleep_for(1ms);
  }
}

TEST(Engine, ALongPromptIsPrefilledInChunksWhileTheRunningSequenceDecodesAlongside) {
  constexpr int kBudget = 8, kLateTokens = 8;
  const std::string prompt = long_prompt();
  const int prompt_tokens =
      int(Tokenizer(model_dir() / "tokenizer.model").encode(prompt, true).size());
  const int passes = (prompt_tokens + kBudget - 1) / kBudget;
  ASSERT_GE(passes, 30) << "the prompt should need many chunks";
  // The running sequence has fewer tokens left than the long prompt has chunks: it ends during
  // that prefill if it decodes alongside each chunk, and only after it if it waits.
  const int running_tokens = passes * 2 / 3;
  DecodeGate gate;
  Engine engine(make_config("{window_ms: 0, max_prefill_tokens: " + std::to_string(kBudget) + "}"),
                gate.runner_maker());
  auto running = make_request(kPrompts[1], running_tokens, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(running), SubmitStatus::Accepted);
  gate.wait_held();  // its first token came from its prefill; its first decode step waits
  const auto prefills_before = engine.metrics().prefill_batches.value();
  auto late = make_request(prompt, kLateTokens);
  ASSERT_EQ(engine.submit(late), SubmitStatus::Accepted);
  // The running sequence, its prefill's result and the late prompt: the scheduler holds the
  // late prompt before the running sequence's first decode step comes back.
  wait_for_batch_calls(engine, 3);
  gate.open();
  expect_finished_with(late, solo().text(prompt, kLateTokens));
  expect_finished_with(running, solo().text(kPrompts[1], running_tokens, true));
  const Metrics& m = engine.metrics();
  EXPECT_EQ(m.prefill_batches.value() - prefills_before, uint64_t(passes));
  // Each sequence's first token comes from its prompt's pass; the running one's next tokens
  // from its one decode step before the long prompt or beside the long prompt's chunks, and
  // the late one's from decode steps. The two never decoding in the same step (the running one
  // ended during the long prefill, not after it) is what makes the counts add up exactly.
  EXPECT_EQ(m.decode_steps.value() + m.prefill_decode_tokens.value(),
            uint64_t((running_tokens - 1) + (kLateTokens - 1)))
      << "the running sequence stalled while the long prompt was prefilled";
  EXPECT_EQ(m.prefill_decode_tokens.value(), uint64_t(running_tokens - 2));
}

// scheduler.policy priority: of two requests waiting for the one place, the one of the lower
// priority value goes first, though it came second.
TEST(Engine, WithThePriorityPolicyTheLowerPriorityValueIsServedFirst) {
  DecodeGate gate;
  Engine engine(make_config("{window_ms: 0, max_num_seqs: 1, policy: priority}"),
                gate.runner_maker());
  auto running = make_request(kPrompts[0], 8, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(running), SubmitStatus::Accepted);
  gate.wait_held();
  auto second = make_request(kPrompts[1], 4, true);
  auto third = make_request(kPrompts[2], 4, true);
  third->priority = -1;
  ASSERT_EQ(engine.submit(second), SubmitStatus::Accepted);
  ASSERT_EQ(engine.submit(third), SubmitStatus::Accepted);
  wait_for_batch_calls(engine, 4);  // both wait in the scheduler's queue
  gate.open();
  expect_finished_with(second, solo().text(kPrompts[1], 4, true));
  expect_finished_with(third, solo().text(kPrompts[2], 4, true));
  EXPECT_LT(*sink_of(running).ended_at(), *sink_of(third).ended_at());
  EXPECT_LT(*sink_of(third).ended_at(), *sink_of(second).ended_at());
}

TEST(Engine, APromptSeenBeforeComputesOnlyWhatTheCacheLacksAndAnswersAlike) {
  std::string prompt = long_prompt();
  prompt.pop_back();  // no trailing space: the prompt and its answer retokenize as generated
  const Tokenizer tokenizer(model_dir() / "tokenizer.model");
  const int prompt_tokens = int(tokenizer.encode(prompt, true).size());
  const std::string answer = solo().text(prompt, 24, true);
  Engine engine(make_config("{window_ms: 0}"));
  auto first = make_request(prompt, 24, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(first), SubmitStatus::Accepted);
  expect_finished_with(first, answer);
  EXPECT_EQ(engine.metrics().prefix_cache_hit_tokens.value(), 0u);
  // Its blocks stay cached, and count as free.
  const auto deadline = std::chrono::steady_clock::now() + 1s;
  while (engine.metrics().kv_blocks_used.value() != 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(engine.metrics().kv_blocks_used.value(), 0);

  // Every whole block but the one with the prompt's last token comes from the cache.
  auto again = make_request(prompt, 24, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(again), SubmitStatus::Accepted);
  expect_finished_with(again, answer);
  EXPECT_EQ(engine.metrics().prefix_cache_hit_tokens.value(),
            uint64_t((prompt_tokens - 1) / 16 * 16));

  // The next turn of a conversation, the first answer in its prompt, finds that answer's
  // blocks too: all of the first request's computed positions (its last token never was).
  const std::string next_turn = prompt + answer + " The end";
  ASSERT_EQ(tokenizer.encode(prompt + answer, true).size(), size_t(prompt_tokens + 24))
      << "the answer retokenizes differently: the test proves nothing";
  auto longer = make_request(next_turn, 8, /*ignore_eos=*/true);
  const auto hits_before = engine.metrics().prefix_cache_hit_tokens.value();
  ASSERT_EQ(engine.submit(longer), SubmitStatus::Accepted);
  expect_finished_with(longer, solo().text(next_turn, 8, true));
  EXPECT_EQ(engine.metrics().prefix_cache_hit_tokens.value() - hits_before,
            uint64_t((prompt_tokens + 23) / 16 * 16));
}

TEST(Engine, RequestsAFullBatchBroughtDoNotWaitAnotherWindowForTheirTurnInTheBudget) {
  // Four requests fill max_batch and close the minute-long window at once; the 3-token budget
  // admits one prompt's chunk at a time, and the others follow as the budget frees, not a
  // minute later.
  Engine engine(make_config("{window_ms: 60000, max_batch: 4, max_prefill_tokens: 3}"));
  expect_four_answer_as_alone(engine, 16);
}

TEST(Engine, ChunkedPrefillUnderPreemptionAnswersIdentically) {
  // As ASmallKvPoolPreemptsAndStillAnswersIdentically, with every prompt cut into 3-token chunks.
  Engine engine(
      make_config("{window_ms: 100, max_batch: 4, kv_cache_blocks: 12, max_prefill_tokens: 3}"));
  expect_four_answer_as_alone(engine, 120);
  EXPECT_GT(engine.metrics().preemptions.value(), 0u);
}

// A greedy request that reports each token's logprob and two alternatives.
std::shared_ptr<Request> request_with_logprobs(const std::string& prompt, int max_tokens) {
  auto request = make_request(prompt, max_tokens, /*ignore_eos=*/true);
  request->sampling.logprobs = true;
  request->sampling.top_logprobs = 2;
  return request;
}

// A request whose prompt, given as ids, is scored (echo with logprobs).
std::shared_ptr<Request> scoring_request(std::vector<int32_t> prompt_ids) {
  auto request = request_with_logprobs("", 1);
  request->prompt_ids = std::move(prompt_ids);
  request->prompt_logprobs = true;
  return request;
}

// Each prompt token's score is what the model gave it after the tokens before it: the scores of
// a generated answer's tokens, scored again as part of a prompt, are their logprobs when they
// were generated. The prompt is prefilled in chunks of 4 and its blocks are in the prefix cache
// (the answer's request computed them), which scoring must not use.
TEST(Engine, AScoredPromptGivesEachTokenTheLogprobItWasGeneratedWith) {
  constexpr int kAnswerTokens = 12;
  Engine engine(make_config("{window_ms: 0, max_prefill_tokens: 4}"));
  auto answer = request_with_logprobs(long_prompt(), kAnswerTokens);
  ASSERT_EQ(engine.submit(answer), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(answer).wait());
  const std::vector<TokenOutput> generated = sink_of(answer).tokens();
  ASSERT_EQ(generated.size(), size_t(kAnswerTokens));

  std::vector<int32_t> ids = Tokenizer(model_dir() / "tokenizer.model").encode(long_prompt(), true);
  const size_t prompt_tokens = ids.size();
  for (const TokenOutput& token : generated) ids.push_back(token.token);
  const auto hits_before = engine.metrics().prefix_cache_hit_tokens.value();
  auto scored = scoring_request(ids);
  ASSERT_EQ(engine.submit(scored), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(scored).wait());
  ASSERT_TRUE(sink_of(scored).completion().has_value());
  EXPECT_EQ(engine.metrics().prefix_cache_hit_tokens.value(), hits_before);

  const std::vector<TokenOutput> prompt = sink_of(scored).prompt();
  ASSERT_EQ(prompt.size(), ids.size());
  EXPECT_FALSE(prompt[0].logprob.has_value());
  for (size_t i = 0; i < prompt.size(); ++i) {
    SCOPED_TRACE("prompt token " + std::to_string(i));
    EXPECT_EQ(prompt[i].token, ids[i]);
    if (i == 0) continue;
    ASSERT_TRUE(prompt[i].logprob.has_value());
    ASSERT_EQ(prompt[i].top.size(), 2u);
    EXPECT_LE(*prompt[i].logprob, prompt[i].top[0].logprob);
    if (i < prompt_tokens) continue;
    const TokenOutput& reference = generated[i - prompt_tokens];
    EXPECT_NEAR(*prompt[i].logprob, *reference.logprob, 1e-4);
    EXPECT_EQ(prompt[i].top[0].token, reference.top[0].token);
    EXPECT_EQ(prompt[i].top[1].token, reference.top[1].token);
  }
  // Scores came with the first delta, and only there.
  EXPECT_FALSE(sink_of(scored).out_of_order());
}

// Scored prompts that are preempted (a 12-block pool) and prefilled in 3-token chunks score as
// one prompt alone does.
TEST(Engine, ScoredPromptsUnderPreemptionScoreAsAlone) {
  std::vector<std::vector<TokenOutput>> alone;
  std::vector<std::shared_ptr<Request>> requests;
  const Tokenizer tokenizer(model_dir() / "tokenizer.model");
  {
    Engine engine(make_config("{window_ms: 0}"));
    for (int i = 0; i < 4; ++i) {
      auto request = scoring_request(tokenizer.encode(kPrompts[i], true));
      request->max_tokens = 120;
      ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
      ASSERT_TRUE(sink_of(request).wait());
      alone.push_back(sink_of(request).prompt());
    }
  }
  Engine engine(
      make_config("{window_ms: 100, max_batch: 4, kv_cache_blocks: 12, max_prefill_tokens: 3}"));
  for (int i = 0; i < 4; ++i) {
    requests.push_back(scoring_request(tokenizer.encode(kPrompts[i], true)));
    requests.back()->max_tokens = 120;
    ASSERT_EQ(engine.submit(requests.back()), SubmitStatus::Accepted);
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(sink_of(requests[i]).wait());
    const auto prompt = sink_of(requests[i]).prompt();
    ASSERT_EQ(prompt.size(), alone[i].size());
    for (size_t t = 1; t < prompt.size(); ++t)
      EXPECT_NEAR(*prompt[t].logprob, *alone[i][t].logprob, 1e-4) << kPrompts[i] << " token " << t;
  }
  EXPECT_GT(engine.metrics().preemptions.value(), 0u);
}

// Echo with max_tokens 0 (a prompt-only answer) draws one token and drops it, never computing it
// at a position of its own: its prompt may fill the whole KV pool (12 blocks of 16 here). It
// waited for a block for that token forever.
TEST(Engine, APromptOnlyAnswerMayFillTheWholeKvPool) {
  Engine engine(make_config("{window_ms: 0, kv_cache_blocks: 12}"));
  std::vector<int32_t> ids = Tokenizer(model_dir() / "tokenizer.model").encode(long_prompt(), true);
  ASSERT_GE(ids.size(), 192u);
  ids.resize(192);
  auto request = scoring_request(ids);
  request->prompt_only = true;
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(request).wait(5s)) << "the prompt-only answer was never admitted";
  ASSERT_TRUE(sink_of(request).completion().has_value()) << sink_of(request).error()->message;
  EXPECT_EQ(sink_of(request).prompt().size(), ids.size());
}

// stories260K's CPU runner, recording the RunnerOptions it was made with and the largest pass
// it was sent: the CUDA runner sizes its buffers for max_pass_tokens and max_pass_logit_rows
// before the KV cache takes the device's memory, so no pass may exceed them. Its passes can be
// held, to stand for long ones (a CPU's prefill of a large model): a held pass waits until
// released (10 s at most), asking the model step's watch every 5 ms as the CPU runner asks it
// before each layer.
class PassRecordingRunner final : public WrappingRunner {
 public:
  PassRecordingRunner(std::unique_ptr<ModelRunner> runner, const RunnerOptions& options)
      : WrappingRunner(std::move(runner)), options_(options) {}
  void forward(const Batch& batch, Logits& logits) override {
    most_tokens_ = std::max(most_tokens_.load(), batch.total_tokens());
    most_logit_rows_ = std::max(most_logit_rows_.load(), batch.logit_rows());
    ++passes_started_;
    for (const auto until = std::chrono::steady_clock::now() + 10s;
         holding_ && std::chrono::steady_clock::now() < until;) {
      if (wanted_ && !wanted_()) {
        ++abandoned_;
        throw PassAbandoned("a held pass stopped: every sequence in it has ended");
      }
      std::this_thread::sleep_for(5ms);
    }
    WrappingRunner::forward(batch, logits);
  }
  void watch_pass(std::function<bool()> wanted) override {
    wanted_ = wanted;
    WrappingRunner::watch_pass(std::move(wanted));
  }
  void hold_passes(bool hold) { holding_ = hold; }
  // Waits until `passes` passes have started (5 s at most); false if they did not.
  bool wait_for_passes(int passes) const {
    return eventually([&] { return passes_started_ >= passes; });
  }
  const RunnerOptions& options() const { return options_; }
  int passes_started() const { return passes_started_; }
  int abandoned() const { return abandoned_; }
  int most_tokens() const { return most_tokens_; }
  int most_logit_rows() const { return most_logit_rows_; }

 private:
  RunnerOptions options_;
  std::function<bool()> wanted_;  // set and asked on the model step's thread
  // Passes are serial, on the model step's thread; the test reads and sets these.
  std::atomic<int> most_tokens_{0}, most_logit_rows_{0}, passes_started_{0}, abandoned_{0};
  std::atomic<bool> holding_{false};
};

// An engine whose runner is a PassRecordingRunner, reachable through recorder().
class RecordedEngine {
 public:
  explicit RecordedEngine(const std::string& scheduler)
      : engine_(make_config(scheduler),
                [this](std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options) {
                  auto runner = std::make_unique<PassRecordingRunner>(
                      make_cpu_runner(std::move(weights), options), options);
                  recorder_ = runner.get();
                  return runner;
                }) {}
  Engine& engine() { return engine_; }
  PassRecordingRunner& recorder() { return *recorder_; }

 private:
  PassRecordingRunner* recorder_ =
      nullptr;  // owned by engine_, declared first: set while it is made
  Engine engine_;
};

TEST(Engine, NoPassHoldsMoreTokensThanTheRunnerWasToldToExpect) {
  RecordedEngine recorded("{window_ms: 50, max_num_seqs: 6, max_prefill_tokens: 16}");
  const RunnerOptions& options = recorded.recorder().options();
  EXPECT_EQ(options.max_pass_tokens, 16 + 6);  // the budget and a token per decoding sequence
  std::vector<std::shared_ptr<Request>> requests;
  for (int i = 0; i < 12; ++i) {
    // Short prompts decode while long ones are prefilled in chunks beside them.
    requests.push_back(make_request(i % 3 == 0 ? long_prompt() : kPrompts[i], 24, true));
    ASSERT_EQ(recorded.engine().submit(requests.back()), SubmitStatus::Accepted);
  }
  for (const auto& request : requests) ASSERT_TRUE(sink_of(request).wait());
  EXPECT_LE(recorded.recorder().most_tokens(), options.max_pass_tokens);
  EXPECT_GT(recorded.recorder().most_tokens(), 16) << "no pass had decoding sequences beside a "
                                                      "full chunk: the test shows nothing";
}

// Left out of the config, the prefill budget is the CPU's 512 tokens a pass (a GPU's is 2048):
// two prompts of 400 tokens admitted together take two passes.
TEST(Engine, OnTheCpuAPassPrefillsAt512PromptTokensByDefault) {
  RecordedEngine recorded("{window_ms: 100}");
  EXPECT_EQ(recorded.engine().config().scheduler.max_prefill_tokens, 512);
  const Tokenizer tokenizer(model_dir() / "tokenizer.model");
  std::vector<int32_t> ids = tokenizer.encode(long_prompt() + long_prompt(), true);
  ASSERT_GE(ids.size(), 400u);
  ids.resize(400);
  std::vector<std::shared_ptr<Request>> requests;
  for (int i = 0; i < 2; ++i) {
    requests.push_back(make_request("", 1));
    requests.back()->prompt_ids = ids;
    ASSERT_EQ(recorded.engine().submit(requests.back()), SubmitStatus::Accepted);
    std::reverse(ids.begin() + 1, ids.end());  // no prefix shared: both are computed whole
  }
  for (const auto& request : requests) ASSERT_TRUE(sink_of(request).wait());
  EXPECT_EQ(recorded.recorder().most_tokens(), 512);
}

TEST(Engine, NoPassHoldsMoreLogitsRowsThanTheRunnerWasToldToExpect) {
  RecordedEngine recorded("{window_ms: 100, max_num_seqs: 4, max_prefill_tokens: 2048}");
  const RunnerOptions& options = recorded.recorder().options();
  // The budget is capped by what max_num_seqs contexts of 512 positions can hold.
  EXPECT_EQ(options.max_pass_tokens, 4 * 512 + 4);
  EXPECT_EQ(options.max_pass_logit_rows, 4 + Scheduler::kMaxScoredRows);
  const Tokenizer tokenizer(model_dir() / "tokenizer.model");
  std::vector<int32_t> ids = tokenizer.encode(long_prompt() + long_prompt(), true);
  ASSERT_GE(ids.size(), 400u);
  ids.resize(400);
  std::vector<std::shared_ptr<Request>> requests;
  for (int i = 0; i < 3; ++i) {  // 1,200 rows to score, admitted together
    requests.push_back(scoring_request(ids));
    ASSERT_EQ(recorded.engine().submit(requests.back()), SubmitStatus::Accepted);
  }
  for (const auto& request : requests) ASSERT_TRUE(sink_of(request).wait());
  EXPECT_LE(recorded.recorder().most_logit_rows(), options.max_pass_logit_rows);
  EXPECT_GT(recorded.recorder().most_logit_rows(), 400) << "no pass scored two prompts";
}

TEST(Engine, ACancelledRequestFreesItsBlocks) {
  Engine engine(make_config("{window_ms: 0}"));
  // The request runs to the end of the context, which takes this model tens of milliseconds: on
  // a loaded machine it can finish before the cancel lands, and is then tried again.
  bool cancelled = false;
  for (int attempt = 0; attempt < 10 && !cancelled; ++attempt) {
    auto request = make_request(kPrompts[4], 0, /*ignore_eos=*/true);
    ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
    ASSERT_TRUE(sink_of(request).wait_for_delta());
    EXPECT_GT(engine.metrics().kv_blocks_used.value(), 0);
    engine.cancel(*request);
    ASSERT_TRUE(sink_of(request).wait(5s));
    cancelled = sink_of(request).error().has_value();
    if (cancelled) {
      EXPECT_EQ(sink_of(request).error()->http_status, 499);
    }
    const auto deadline = std::chrono::steady_clock::now() + 1s;
    while (engine.metrics().kv_blocks_used.value() != 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    EXPECT_EQ(engine.metrics().kv_blocks_used.value(), 0);
  }
  EXPECT_TRUE(cancelled) << "every attempt finished before its cancel landed";
}

TEST(Engine, ACancelledWaitingRequestGivesUpItsQueuePlaceAtOnce) {
  // The window holds the first request in the waiting queue, which the limit of 1 fills.
  Engine engine(make_config("{window_ms: 60000}", /*max_queue=*/1));
  auto waiting = make_request(kPrompts[0], 8);
  ASSERT_EQ(engine.submit(waiting), SubmitStatus::Accepted);
  EXPECT_EQ(engine.submit(make_request(kPrompts[1], 8)), SubmitStatus::QueueFull);
  // Until the scheduler holds it (the batch node handed it over; the scheduler's thread takes
  // it from its inbox within microseconds), so that nothing but the cancel can end it.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (engine.metrics_text().find("pipeline_stage_calls_total{stage=\"batch\"} 1\n") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms);
  engine.cancel(*waiting);
  ASSERT_TRUE(sink_of(waiting).wait(1s)) << "the cancel did not end it";
  ASSERT_TRUE(sink_of(waiting).error().has_value());
  EXPECT_EQ(sink_of(waiting).error()->http_status, 499);
  EXPECT_EQ(engine.metrics().waiting_sequences.value(), 0);
  EXPECT_EQ(engine.submit(make_request(kPrompts[2], 8)), SubmitStatus::Accepted)
      << "the place stayed taken until the window closed";
  engine.cancel(*waiting);  // already ended: nothing more happens
  EXPECT_EQ(engine.metrics().requests_failed.value(), 1u);
  EXPECT_EQ(engine.metrics().requests_cancelled.value(), 1u);
  EXPECT_NE(engine.metrics_text().find("vllm:request_success_total{finished_reason=\"abort\","),
            std::string::npos);
  // Its prompt was tokenized, never prefilled: vLLM's prompt token count leaves it out.
  EXPECT_GT(engine.metrics().prompt_tokens.value(), 0u);
  EXPECT_NE(engine.metrics_text().find("vllm:prompt_tokens_total{model_name=\"stories260K\"} 0\n"),
            std::string::npos);
  engine.shutdown(50ms);
}

TEST(Engine, APreemptedSequenceCountsAsWaitingUntilItResumes) {
  // As in ASmallKvPoolPreemptsAndStillAnswersIdentically: the four prompts are prefilled
  // together, so after that every waiting sequence is a preempted one.
  Engine engine(make_config("{window_ms: 100, max_batch: 4, kv_cache_blocks: 12}"));
  std::vector<std::shared_ptr<Request>> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(make_request(kPrompts[i], 120, true));
  for (const auto& r : requests) ASSERT_EQ(engine.submit(r), SubmitStatus::Accepted);
  const auto& m = engine.metrics();
  bool saw_preempted_waiting = false;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  auto all_ended = [&] {
    return std::all_of(requests.begin(), requests.end(),
                       [](const auto& r) { return sink_of(r).ended_at().has_value(); });
  };
  while (!all_ended() && std::chrono::steady_clock::now() < deadline) {
    if (m.preemptions.value() > 0 && m.waiting_sequences.value() > 0) saw_preempted_waiting = true;
    std::this_thread::sleep_for(50us);
  }
  for (const auto& r : requests) ASSERT_TRUE(sink_of(r).wait(30s));
  EXPECT_GT(m.preemptions.value(), 0u);
  EXPECT_TRUE(saw_preempted_waiting) << "a preempted sequence was counted nowhere";
  // The scheduler takes the last step's result after the last answer ended.
  const auto settled = std::chrono::steady_clock::now() + 5s;
  while (m.kv_blocks_used.value() != 0 && std::chrono::steady_clock::now() < settled)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(m.waiting_sequences.value(), 0);
  EXPECT_EQ(m.running_sequences.value(), 0);
}

TEST(Engine, AFullQueueRefusesAndShutdownFailsWhatIsLeft) {
  // A long window keeps the first two waiting; the third finds the queue full.
  Engine engine(make_config("{window_ms: 60000}", /*max_queue=*/2));
  // Long answers: the shutdown closes the window, and in the moment before it fails what is
  // left, short ones could finish.
  auto a = make_request(kPrompts[0], 400, /*ignore_eos=*/true);
  auto b = make_request(kPrompts[1], 400, /*ignore_eos=*/true);
  auto c = make_request(kPrompts[2], 8);
  EXPECT_EQ(engine.submit(a), SubmitStatus::Accepted);
  EXPECT_EQ(engine.submit(b), SubmitStatus::Accepted);
  EXPECT_EQ(engine.submit(c), SubmitStatus::QueueFull);
  engine.shutdown(0ms);  // no grace
  for (const auto& r : {a, b}) {
    ASSERT_TRUE(sink_of(r).wait(1s));
    ASSERT_TRUE(sink_of(r).error().has_value());
    EXPECT_EQ(sink_of(r).error()->http_status, 503);
    EXPECT_EQ(sink_of(r).error()->message, "server shutting down");
  }
  EXPECT_EQ(engine.submit(make_request(kPrompts[3], 8)), SubmitStatus::ShuttingDown);
}

TEST(Engine, TheChoicesOfOneCallAreAcceptedTogetherOrNotAtAll) {
  Engine engine(make_config("{window_ms: 60000}", /*max_queue=*/3));
  ASSERT_EQ(engine.submit(make_request(kPrompts[0], 8)), SubmitStatus::Accepted);
  const std::vector<std::shared_ptr<Request>> three = {
      make_request(kPrompts[1], 8), make_request(kPrompts[1], 8), make_request(kPrompts[1], 8)};
  EXPECT_EQ(engine.submit(three), SubmitStatus::QueueFull);
  for (const auto& r : three) EXPECT_FALSE(r->sequence_number.has_value());
  EXPECT_EQ(engine.metrics().waiting_sequences.value(), 1);
  const std::vector<std::shared_ptr<Request>> two = {make_request(kPrompts[2], 8),
                                                     make_request(kPrompts[2], 8)};
  EXPECT_EQ(engine.submit(two), SubmitStatus::Accepted);
  EXPECT_EQ(engine.metrics().waiting_sequences.value(), 3);
  engine.shutdown(0ms);
}

// Two requests submitted and the engine shut down with `grace`: both finish as alone.
void expect_shutdown_finishes_two(const std::string& scheduler, std::chrono::seconds grace) {
  Engine engine(make_config(scheduler));
  auto a = make_request(kPrompts[5], 32);
  auto b = make_request(kPrompts[6], 32);
  ASSERT_EQ(engine.submit(a), SubmitStatus::Accepted);
  ASSERT_EQ(engine.submit(b), SubmitStatus::Accepted);
  engine.shutdown(grace);
  expect_finished_with(a, solo().text(kPrompts[5], 32));
  expect_finished_with(b, solo().text(kPrompts[6], 32));
}

TEST(Engine, ShutdownLetsInFlightRequestsFinish) {
  expect_shutdown_finishes_two("{window_ms: 0}", 10s);
}

// Once the engine stops accepting, no newcomer can join a batch window, so requests waiting for
// one start at once: they waited out the window (here a minute, past the grace) and failed.
TEST(Engine, ShutdownClosesTheBatchWindow) {
  expect_shutdown_finishes_two("{window_ms: 60000}", 5s);
}

// A shutdown whose grace ends with a request in flight fails it, and the pass in progress,
// with no one left to compute for, stops part-way: a long one (a CPU's prefill of a large
// model) does not hold the exit.
TEST(Engine, ShutdownStopsThePassInProgressOnceEveryRequestHasEnded) {
  RecordedEngine recorded("{window_ms: 0}");
  recorded.recorder().hold_passes(true);
  auto request = make_request(kPrompts[5], 400, /*ignore_eos=*/true);
  ASSERT_EQ(recorded.engine().submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(recorded.recorder().wait_for_passes(1));
  const auto start = std::chrono::steady_clock::now();
  recorded.engine().shutdown(0s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "the held pass ran to its end";
  ASSERT_TRUE(sink_of(request).wait());
  ASSERT_TRUE(sink_of(request).error().has_value());
  EXPECT_EQ(sink_of(request).error()->http_status, 503);
  EXPECT_EQ(recorded.recorder().abandoned(), 1);
}

// A client that leaves while its prompt's pass runs frees the engine part-way through it; the
// next request is answered as if nothing had happened. A pass with a sequence still wanted
// runs whole.
TEST(Engine, APassEveryClientLeftStopsPartWayAndOneStillWantedRunsWhole) {
  RecordedEngine recorded("{window_ms: 100}");
  PassRecordingRunner& runner = recorded.recorder();
  runner.hold_passes(true);
  auto left = make_request(kPrompts[1], 400, /*ignore_eos=*/true);
  ASSERT_EQ(recorded.engine().submit(left), SubmitStatus::Accepted);
  ASSERT_TRUE(runner.wait_for_passes(1));
  recorded.engine().cancel(*left);
  ASSERT_TRUE(sink_of(left).wait());
  EXPECT_EQ(sink_of(left).error()->http_status, kClientGoneStatus);
  EXPECT_TRUE(eventually([&] { return runner.abandoned() > 0; }));
  EXPECT_EQ(runner.abandoned(), 1);
  runner.hold_passes(false);
  auto next = make_request(kPrompts[6], 32);
  ASSERT_EQ(recorded.engine().submit(next), SubmitStatus::Accepted);
  expect_finished_with(next, solo().text(kPrompts[6], 32));

  // Two prompts in one pass, one of whose clients leaves.
  runner.hold_passes(true);
  auto leaving = make_request(kPrompts[2], 400, /*ignore_eos=*/true);
  auto staying = make_request(kPrompts[3], 32);
  const int passes = runner.passes_started();
  ASSERT_EQ(recorded.engine().submit(std::vector{leaving, staying}), SubmitStatus::Accepted);
  ASSERT_TRUE(runner.wait_for_passes(passes + 1));
  recorded.engine().cancel(*leaving);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(runner.abandoned(), 1);
  runner.hold_passes(false);
  expect_finished_with(staying, solo().text(kPrompts[3], 32));
}

TEST(Engine, RefusesAPromptLongerThanTheContext) {
  Engine engine(make_config("{window_ms: 0}"));
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "the cat ";
  auto request = make_request(prompt, 8);
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(request).wait());
  ASSERT_TRUE(sink_of(request).error().has_value());
  EXPECT_EQ(sink_of(request).error()->http_status, 400);
  EXPECT_NE(sink_of(request).error()->message.find("context is 512 tokens"), std::string::npos)
      << sink_of(request).error()->message;
}

// vLLM's truncate_prompt_tokens: the model sees the prompt's last k tokens, as if they were the
// prompt given as ids; k beyond the context is refused.
TEST(Engine, TruncatePromptTokensKeepsThePromptsLastTokens) {
  Engine engine(make_config("{window_ms: 0}"));
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += i % 7 == 0 ? "a dog " : "the cat ";
  const std::vector<int32_t> ids =
      Tokenizer(model_dir() / "tokenizer.model").encode(prompt, /*add_bos=*/true);
  ASSERT_GT(ids.size(), 512u);
  auto truncated = make_request(prompt, 16, /*ignore_eos=*/true);
  truncated->truncate_prompt_tokens = 100;
  auto as_ids = make_request("", 16, /*ignore_eos=*/true);
  as_ids->prompt_ids.assign(ids.end() - 100, ids.end());
  auto too_many = make_request(prompt, 16);
  too_many->truncate_prompt_tokens = 513;
  for (const auto& request : {truncated, as_ids, too_many}) {
    ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
    ASSERT_TRUE(sink_of(request).wait());
  }
  ASSERT_TRUE(sink_of(truncated).completion().has_value()) << sink_of(truncated).error()->message;
  EXPECT_EQ(sink_of(truncated).completion()->prompt_tokens, 100);
  EXPECT_EQ(sink_of(truncated).text(), sink_of(as_ids).text());
  ASSERT_TRUE(sink_of(too_many).error().has_value());
  EXPECT_EQ(sink_of(too_many).error()->param, "truncate_prompt_tokens");
  EXPECT_NE(sink_of(too_many).error()->message.find("context is 512 tokens"), std::string::npos)
      << sink_of(too_many).error()->message;
}

// A 2 MiB prompt is refused from a bound on its length, unencoded (sentencepiece would take
// seconds), and answered from its end when truncated, as if its last tokens were given as ids.
TEST(Engine, AHugePromptIsMeasuredBeforeItIsEncoded) {
  Engine engine(make_config("{window_ms: 0}"));
  std::string prompt;
  while (prompt.size() < (size_t(2) << 20)) prompt += "the cat sat on a mat. ";
  prompt += "The end";
  const std::string tail = prompt.substr(prompt.size() - 2000);
  const std::vector<int32_t> tail_ids =
      Tokenizer(model_dir() / "tokenizer.model").encode(tail.substr(tail.find(' ') + 1), false);
  auto whole = make_request(prompt, 16);
  auto truncated = make_request(prompt, 16, /*ignore_eos=*/true);
  truncated->truncate_prompt_tokens = 100;
  auto as_ids = make_request("", 16, /*ignore_eos=*/true);
  as_ids->prompt_ids.assign(tail_ids.end() - 100, tail_ids.end());
  for (const auto& request : {whole, truncated, as_ids}) {
    ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
    ASSERT_TRUE(sink_of(request).wait());
  }
  ASSERT_TRUE(sink_of(whole).error().has_value());
  EXPECT_EQ(sink_of(whole).error()->param, "prompt");
  EXPECT_NE(sink_of(whole).error()->message.find("the prompt is at least"), std::string::npos)
      << sink_of(whole).error()->message;
  ASSERT_TRUE(sink_of(truncated).completion().has_value()) << sink_of(truncated).error()->message;
  EXPECT_EQ(sink_of(truncated).completion()->prompt_tokens, 100);
  EXPECT_EQ(sink_of(truncated).text(), sink_of(as_ids).text());
}

// A max_tokens the client gave must fit beside the prompt in the context (512 tokens).
TEST(Engine, RefusesAGivenMaxTokensThePromptLeavesNoRoomFor) {
  Engine engine(make_config("{window_ms: 0}"));
  const int prompt =
      int(Tokenizer(model_dir() / "tokenizer.model").encode(kPrompts[0], true).size());
  auto refusal = [&](int max_tokens) -> std::optional<RequestError> {
    auto request = make_request(kPrompts[0], max_tokens, /*ignore_eos=*/true);
    request->max_tokens_param = "max_tokens";
    EXPECT_EQ(engine.submit(request), SubmitStatus::Accepted);
    EXPECT_TRUE(sink_of(request).wait());
    return sink_of(request).error();
  };
  const auto too_long = refusal(512 - prompt + 1);
  ASSERT_TRUE(too_long.has_value());
  EXPECT_EQ(too_long->http_status, 400);
  EXPECT_EQ(too_long->param, "max_tokens");
  EXPECT_NE(too_long->message.find("maximum context length is 512 tokens. However, you requested " +
                                   std::to_string(513) + " tokens (" + std::to_string(prompt) +
                                   " in the prompt"),
            std::string::npos)
      << too_long->message;
  EXPECT_FALSE(refusal(512 - prompt).has_value()) << "it fits exactly";
}

// And in the KV pool (12 blocks of 16 here); a default max_tokens is capped to the room left.
TEST(Engine, RefusesAGivenMaxTokensBeyondTheKvPool) {
  Engine engine(make_config("{window_ms: 0, kv_cache_blocks: 12}"));
  EXPECT_EQ(engine.max_model_len(), 192) << "what /v1/models reports";
  EXPECT_EQ(Engine(make_config("{window_ms: 0}")).max_model_len(), 512);
  auto truncated = make_request(kPrompts[0], 4);
  truncated->truncate_prompt_tokens = 193;
  ASSERT_EQ(engine.submit(truncated), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(truncated).wait());
  ASSERT_TRUE(sink_of(truncated).error().has_value());
  EXPECT_EQ(sink_of(truncated).error()->param, "truncate_prompt_tokens");
  EXPECT_NE(sink_of(truncated).error()->message.find("KV cache holds only 192 tokens"),
            std::string::npos)
      << sink_of(truncated).error()->message;
  auto request = make_request(kPrompts[0], 12 * 16, /*ignore_eos=*/true);
  request->max_tokens_param = "max_completion_tokens";  // the refusal names the field given
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(request).wait());
  ASSERT_TRUE(sink_of(request).error().has_value());
  EXPECT_EQ(sink_of(request).error()->param, "max_completion_tokens");
  EXPECT_NE(sink_of(request).error()->message.find("KV cache holds only 192 tokens"),
            std::string::npos)
      << sink_of(request).error()->message;
  // The same max_tokens as a default: capped to what the pool holds, and answered.
  auto capped = make_request(kPrompts[0], 12 * 16, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(capped), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(capped).wait());
  ASSERT_TRUE(sink_of(capped).completion().has_value());
  EXPECT_EQ(sink_of(capped).completion()->reason, FinishReason::Length);
}

TEST(Engine, StopStringsEndTheTextBeforeThem) {
  Engine engine(make_config("{window_ms: 0}"));
  const std::string full = solo().text(kPrompts[0], 64);
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(10, 5);
  auto request = make_request(kPrompts[0], 64);
  request->stop = {stop};
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  expect_finished_with(request, full.substr(0, full.find(stop)));
  EXPECT_EQ(sink_of(request).completion()->reason, FinishReason::Stop);
}

TEST(Engine, RefusesInvalidSamplingParameters) {
  Engine engine(make_config("{window_ms: 0}"));
  auto request = make_request(kPrompts[0], 8);
  request->sampling.temperature = 5.0f;
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(request).wait());
  ASSERT_TRUE(sink_of(request).error().has_value());
  EXPECT_EQ(sink_of(request).error()->http_status, 400);
  EXPECT_NE(sink_of(request).error()->message.find("temperature"), std::string::npos);
}

TEST(Engine, LogitBiasSteersGreedyTokensAndRefusesIdsOutsideTheVocabulary) {
  Engine engine(make_config("{window_ms: 0}"));
  const Tokenizer& tokenizer = engine.tokenizer();
  const int32_t forced = tokenizer.encode(" cat", false).back();
  auto request = make_request(kPrompts[0], 6, /*ignore_eos=*/true);
  request->sampling.logit_bias = {{forced, 100.0f}};
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  std::vector<int32_t> ids = tokenizer.encode(kPrompts[0], true);
  const std::string prompt_text = tokenizer.decode(ids);
  ids.insert(ids.end(), 6, forced);
  expect_finished_with(request, tokenizer.decode(ids).substr(prompt_text.size()));

  auto outside = make_request(kPrompts[0], 6);
  outside->sampling.logit_bias = {{512, -100.0f}};
  ASSERT_EQ(engine.submit(outside), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(outside).wait());
  ASSERT_TRUE(sink_of(outside).error().has_value());
  EXPECT_EQ(sink_of(outside).error()->http_status, 400);
  EXPECT_EQ(sink_of(outside).error()->param, "logit_bias");
  EXPECT_NE(sink_of(outside).error()->message.find("vocabulary has 512 tokens"), std::string::npos)
      << sink_of(outside).error()->message;
}

// vLLM's phases end with the last token drawn, not with the answer's delivery: an answer of one
// token has no decode phase.
TEST(Engine, AOneTokenAnswerHasNoDecodePhase) {
  Engine engine(make_config("{window_ms: 0}"));
  auto request = make_request(kPrompts[3], 1, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  ASSERT_TRUE(sink_of(request).wait());
  engine.shutdown(1s);
  const auto& m = engine.metrics();
  ASSERT_EQ(m.request_decode_seconds.count(), 1u);
  EXPECT_EQ(m.request_decode_seconds.sum(), 0.0);
  EXPECT_EQ(m.request_time_per_output_token.sum(), 0.0);
  EXPECT_EQ(m.request_inference_seconds.sum(), m.request_prefill_seconds.sum());
  EXPECT_GT(m.request_prefill_seconds.sum(), 0.0);
}

TEST(Engine, MetricsCountStagesTokensAndBlocks) {
  Engine engine(make_config("{window_ms: 0}"));
  auto request = make_request(kPrompts[7], 20, /*ignore_eos=*/true);
  ASSERT_EQ(engine.submit(request), SubmitStatus::Accepted);
  expect_finished_with(request, solo().text(kPrompts[7], 20, true));
  const auto& m = engine.metrics();
  // The scheduler frees the blocks when the last step's result comes back to it.
  const auto deadline = std::chrono::steady_clock::now() + 1s;
  while (m.kv_blocks_used.value() != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  engine.shutdown(1s);  // drains the graph, so every counter is final
  EXPECT_EQ(m.generated_tokens.value(), 20u);
  EXPECT_EQ(m.requests_finished(), 1u);
  EXPECT_EQ(m.requests_cut.value(), 1u);  // ignore_eos: max_tokens ended it
  EXPECT_EQ(m.request_seconds.count(), 1u);
  EXPECT_EQ(m.request_generation_tokens.sum(), 20.0);
  EXPECT_EQ(m.request_prompt_tokens.sum(), double(m.prompt_tokens.value()));
  EXPECT_EQ(m.decode_steps.value(), 19u);  // the first token comes from the prefill
  EXPECT_EQ(m.kv_blocks_used.value(), 0);
  EXPECT_EQ(m.time_to_first_token.count(), 1u);
  EXPECT_EQ(m.inter_token_latency.count(), 19u);
  EXPECT_EQ(m.prefill_forward_seconds.count(), 1u);
  EXPECT_EQ(m.decode_forward_seconds.count(), 19u);
  EXPECT_GT(m.decode_forward_seconds.sum(), 0.0);
  // Each decode pass's turnaround runs from the token before it to its forward pass, which
  // draws the next: together they tile the decode phase.
  EXPECT_EQ(m.decode_turnaround_seconds.count(), 19u);
  EXPECT_NEAR(m.decode_turnaround_seconds.sum() + m.decode_forward_seconds.sum(),
              m.request_decode_seconds.sum(), 1e-6);
  EXPECT_EQ(m.prompt_tokens_prefilled.value(), m.prompt_tokens.value());
  // One pass computed the prompt, 19 one token each.
  EXPECT_EQ(m.pass_tokens.count(), 20u);
  EXPECT_EQ(m.pass_tokens.sum(), double(m.prompt_tokens.value() + 19));
  // vLLM's count: the prefill's pass drew the first token of a whole prompt.
  EXPECT_EQ(m.iteration_tokens.count(), 20u);
  EXPECT_EQ(m.iteration_tokens.sum(), double(m.prompt_tokens.value() + 20));
  // The request's phases, as vLLM splits them: queued, then prefill up to the first token, then
  // decode; inference is prefill and decode together, within the request's whole time.
  for (const Histogram* phase :
       {&m.request_queue_seconds, &m.request_prefill_seconds, &m.request_decode_seconds,
        &m.request_inference_seconds, &m.request_time_per_output_token})
    EXPECT_EQ(phase->count(), 1u);
  EXPECT_GT(m.request_prefill_seconds.sum(), 0.0);
  EXPECT_GT(m.request_decode_seconds.sum(), 0.0);
  EXPECT_NEAR(m.request_inference_seconds.sum(),
              m.request_prefill_seconds.sum() + m.request_decode_seconds.sum(), 1e-9);
  EXPECT_LE(m.request_queue_seconds.sum() + m.request_inference_seconds.sum(),
            m.request_seconds.sum());
  EXPECT_NEAR(m.request_time_per_output_token.sum(), m.request_decode_seconds.sum() / 19, 1e-9);
  const auto text = engine.metrics_text();
  EXPECT_NE(text.find("pipeline_stage_calls_total{stage=\"tokenize\"} 1\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("pipeline_stage_calls_total{stage=\"decode\"} 19\n"), std::string::npos);
  EXPECT_NE(text.find("pipeline_generation_tokens_total 20\n"), std::string::npos);
  EXPECT_NE(text.find("pipeline_kv_blocks_used 0\n"), std::string::npos);
  EXPECT_NE(text.find("pipeline_forward_seconds_count{phase=\"decode\"} 19\n"), std::string::npos)
      << text;
  // The same measures under vLLM's names, for dashboards written for a vLLM server.
  for (const char* line : {
           "vllm:generation_tokens_total{model_name=\"stories260K\"} 20\n",
           "vllm:request_success_total{finished_reason=\"length\",model_name=\"stories260K\"} 1\n",
           "vllm:request_success_total{finished_reason=\"stop\",model_name=\"stories260K\"} 0\n",
           "vllm:request_success_total{finished_reason=\"abort\",model_name=\"stories260K\"} 0\n",
           "vllm:kv_cache_usage_perc{model_name=\"stories260K\"} 0\n",
           "vllm:inter_token_latency_seconds_count{model_name=\"stories260K\"} 19\n",
           "vllm:request_generation_tokens_bucket{model_name=\"stories260K\",le=\"20\"} 1\n",
           "vllm:request_generation_tokens_bucket{model_name=\"stories260K\",le=\"10\"} 0\n",
           "vllm:request_queue_time_seconds_count{model_name=\"stories260K\"} 1\n",
           "vllm:request_prefill_time_seconds_count{model_name=\"stories260K\"} 1\n",
           "vllm:request_decode_time_seconds_count{model_name=\"stories260K\"} 1\n",
           "vllm:request_inference_time_seconds_count{model_name=\"stories260K\"} 1\n",
           "vllm:request_time_per_output_token_seconds_count{model_name=\"stories260K\"} 1\n",
       })
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
}

}  // namespace
}  // namespace pipeline
