// A randomized, seeded, model-based stress test of the Engine on the real tiny model stories260K,
// exercising its features together rather than one scenario at a time (tests/test_engine.cpp).
// Each seed draws a valid config (a KV pool small enough to preempt, block sizes, chunked
// prefill, batch windows, prefix caching on or off, fcfs or priority, a small queue limit) and a
// schedule of greedy requests submitted from several threads at random times: prompts sharing
// prefixes, the n choices of one call, priorities, logprobs, prompts to score, prompts echoed
// alone (which may fill the pool), stop strings, cancellations at random moments, and for some
// seeds a shutdown while requests still come. It checks that
//  - every accepted request ends exactly once, within a deadline (a hang fails, it never waits);
//  - every finished answer is its prompt's solo run (model/generation.h's Generator): text,
//    token ids, finish reason and usage;
//  - a cancelled request ends with 499 (a shut down one with 503) after a prefix of that answer,
//    or finished first;
//  - QueueFull comes only when the accepted requests that have not ended could fill the queue;
//  - every forward pass keeps the paged KV cache's rules (CheckingRunner);
//  - once all have ended, no sequence runs or waits, every KV block is free (or cached-free), and
//    the counters agree with what the sinks received.
// A failure names its seed and config; STRESS_SEED=<n> runs that seed alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "graph/engine.h"
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
using Clock = std::chrono::steady_clock;

const std::vector<std::string> kSentences = {
    "Once upon a time",       "Lily had a red ball", "Tom went to the park", "The cat was hungry",
    "One day, a little bird", "Sam and his dog",     "There was a big tree", "Mom said",
    "The sun was hot",        "A girl named Sue",    "The boy saw a frog",   "It was a rainy day",
    "Ben liked to run",       "The old man",         "Anna found a box",     "The fish swam"};

// Seeds whose configs between them draw every block size (1, 3, 4, 8, 16, 32), bf16 and f32
// caches, both policies, prefix caching off, a queue of 3, and early shutdowns with and without
// grace.
constexpr uint64_t kSeeds[] = {1, 3, 4, 6, 13, 18, 20, 27, 28, 52};
// How long a seed's requests may take to end before the test calls it a hang.
constexpr auto kHangDeadline = 30s;
// How long a call the queue refuses is tried again, every millisecond.
constexpr auto kRetryFor = 2s;

std::filesystem::path model_dir() {
  return testing::shared_path("models/stories260K");
}

int uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
bool chance(std::mt19937_64& rng, double p) {
  return std::bernoulli_distribution(p)(rng);
}
template <typename T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& choices) {
  return choices[size_t(uniform(rng, 0, int(choices.size()) - 1))];
}

// A valid engine config drawn from a seed, kept small so that the features meet: the pool holds
// a few sequences at most (preemption), budgets cut prompts into chunks.
struct StressConfig {
  uint64_t seed = 0;
  int block_size = 16;
  int num_blocks = 0;
  int window_ms = 0;
  int max_batch = 1;
  int max_num_seqs = 1;
  int max_prefill_tokens = 1;
  bool prefix_caching = true;
  bool priority_policy = false;
  bool bf16_kv = false;
  int max_queue = 1;
  int submit_threads = 1;
  int pass_jitter_us = 0;  // each forward pass first waits up to this long (CheckingRunner)
  // The engine shuts down this long after the first submission, with this grace, while requests
  // are still coming; -1: only once all have ended.
  int shutdown_after_ms = -1;
  int shutdown_grace_ms = 0;

  std::string scheduler_yaml() const {
    std::ostringstream out;
    out << "{window_ms: " << window_ms << ", max_batch: " << max_batch
        << ", max_num_seqs: " << max_num_seqs << ", max_prefill_tokens: " << max_prefill_tokens
        << ", kv_block_size: " << block_size << ", kv_cache_blocks: " << num_blocks
        << ", enable_prefix_caching: " << (prefix_caching ? "true" : "false")
        << ", policy: " << (priority_policy ? "priority" : "fcfs")
        << ", kv_cache_dtype: " << (bf16_kv ? "bf16" : "f32") << ", log_passes: false}";
    return out.str();
  }
  // What a failure message names, to reproduce it.
  std::string describe() const {
    return "seed " + std::to_string(seed) + " (STRESS_SEED=" + std::to_string(seed) +
           "): scheduler " + scheduler_yaml() + ", server.max_queue " + std::to_string(max_queue) +
           ", " + std::to_string(submit_threads) + " submitting threads, passes delayed up to " +
           std::to_string(pass_jitter_us) + " us" +
           (shutdown_after_ms < 0
                ? std::string()
                : ", shut down after " + std::to_string(shutdown_after_ms) + " ms with " +
                      std::to_string(shutdown_grace_ms) + " ms of grace");
  }
};

StressConfig random_config(uint64_t seed, std::mt19937_64& rng) {
  StressConfig c;
  c.seed = seed;
  c.block_size = pick(rng, std::vector{1, 3, 4, 8, 16, 16, 32});
  c.num_blocks = uniform(rng, 130, 320) / c.block_size;  // 130 to 320 tokens
  c.window_ms = pick(rng, std::vector{0, 0, 2, 10});
  c.max_batch = uniform(rng, 1, 8);
  c.max_num_seqs = pick(rng, std::vector{1, 2, 3, 5, 8, 32});
  c.max_prefill_tokens = pick(rng, std::vector{1, 3, 7, 16, 64, 512});
  c.prefix_caching = chance(rng, 0.75);
  c.priority_policy = chance(rng, 0.5);
  c.bf16_kv = chance(rng, 0.3);
  c.max_queue = pick(rng, std::vector{3, 6, 12, 256});
  c.submit_threads = uniform(rng, 1, 3);
  c.pass_jitter_us = pick(rng, std::vector{0, 0, 300, 1000});
  if (chance(rng, 0.2)) {
    c.shutdown_after_ms = uniform(rng, 0, 60);
    c.shutdown_grace_ms = pick(rng, std::vector{0, 5, 50});
  }
  return c;
}

ServeConfig make_serve_config(const StressConfig& stress) {
  return testing::stories_engine_config("server: {max_queue: " + std::to_string(stress.max_queue) +
                                        ", shutdown_grace_s: 5, log_requests: false}\n" +
                                        "scheduler: " + stress.scheduler_yaml() + "\n");
}

// stories260K's CPU runner, checking every pass the scheduler sends it against what a paged KV
// cache must be:
//  - the pass fits what the runner was told to expect (RunnerOptions::max_pass_tokens and
//    max_pass_logit_rows), and holds at most max_num_seqs sequences;
//  - every block id is in the pool, and the table covers the chunk's positions;
//  - no block a chunk writes is in another chunk's table in the same pass;
//  - every position a chunk reads holds what a chain of tokens from position 0 left there: a
//    shadow of the cache keeps, per slot, the token written and a hash of the tokens up to it,
//    so a block handed to another sequence and overwritten while still in use, or read before
//    anything wrote it, breaks the chain.
// Each pass is also held back a random while first (seeded), so that submissions and
// cancellations land at more points of a pass, asking the pass's watch meanwhile, as the CPU
// runner does before each layer, so that a pass every client has left is abandoned here too.
class CheckingRunner final : public WrappingRunner {
 public:
  CheckingRunner(std::unique_ptr<ModelRunner> runner, const RunnerOptions& options,
                 int max_num_seqs, int jitter_us, uint64_t seed)
      : WrappingRunner(std::move(runner)),
        options_(options),
        max_num_seqs_(max_num_seqs),
        jitter_us_(jitter_us),
        rng_(seed),
        slots_(size_t(kv_shape().num_blocks) * size_t(kv_shape().block_size)) {}
  void forward(const Batch& batch, Logits& logits) override {
    hold();
    check(batch);
    WrappingRunner::forward(batch, logits);
    write(batch);  // only once the pass ran: an abandoned pass leaves its writes unfinished
  }
  void watch_pass(std::function<bool()> wanted) override {
    wanted_ = wanted;
    WrappingRunner::watch_pass(std::move(wanted));
  }

  // What the passes broke, the first few; read once the engine has shut down.
  const std::vector<std::string>& violations() const { return violations_; }

 private:
  struct Slot {
    int32_t token = -1;  // -1: never written
    uint64_t chain = 0;  // hash of the tokens at positions 0 .. this one
  };

  static uint64_t chained(uint64_t before, int32_t token) {
    uint64_t h = before + 0x9e3779b97f4a7c15ull + uint32_t(token);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  }

  void hold() {
    const auto until = Clock::now() + std::chrono::microseconds(uniform(rng_, 0, jitter_us_));
    while (Clock::now() < until) {
      if (wanted_ && !wanted_()) throw PassAbandoned("every sequence of the held pass has ended");
      std::this_thread::sleep_for(100us);
    }
  }

  Slot& slot(const SequenceChunk& chunk, int position) {
    const int block_size = kv_shape().block_size;
    return slots_[size_t(chunk.block_table[size_t(position / block_size)]) * size_t(block_size) +
                  size_t(position % block_size)];
  }

  void violation(const std::string& what) {
    if (violations_.size() < 5)
      violations_.push_back("pass " + std::to_string(passes_) + ": " + what);
  }

  void check(const Batch& batch) {
    ++passes_;
    check_size(batch);
    if (!check_tables(batch)) return;
    check_writers(batch);
    for (size_t i = 0; i < batch.seqs.size(); ++i) check_reads(batch.seqs[i], i);
  }

  void check_size(const Batch& batch) {
    if (batch.total_tokens() > options_.max_pass_tokens)
      violation(std::to_string(batch.total_tokens()) + " tokens, more than max_pass_tokens " +
                std::to_string(options_.max_pass_tokens));
    if (batch.logit_rows() > options_.max_pass_logit_rows)
      violation(std::to_string(batch.logit_rows()) + " logits rows, more than " +
                std::to_string(options_.max_pass_logit_rows));
    if (int(batch.seqs.size()) > max_num_seqs_)
      violation(std::to_string(batch.seqs.size()) + " sequences, more than max_num_seqs");
  }

  // Whether every table is in the pool and covers its chunk, so the other checks can follow it.
  bool check_tables(const Batch& batch) {
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SequenceChunk& chunk = batch.seqs[i];
      const int end = chunk.start_pos + int(chunk.tokens.size());
      if (int64_t(chunk.block_table.size()) * kv_shape().block_size < end) {
        violation("chunk " + std::to_string(i) + "'s table does not cover its positions");
        return false;
      }
      for (int32_t block : chunk.block_table)
        if (block < 0 || block >= kv_shape().num_blocks) {
          violation("block " + std::to_string(block) + " is outside the pool");
          return false;
        }
    }
    return true;
  }

  void check_writers(const Batch& batch) {
    const int block_size = kv_shape().block_size;
    std::map<int32_t, size_t> writer;  // block -> the chunk that writes it
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SequenceChunk& chunk = batch.seqs[i];
      const int end = chunk.start_pos + int(chunk.tokens.size());
      for (int b = chunk.start_pos / block_size; b * block_size < end; ++b)
        writer.emplace(chunk.block_table[size_t(b)], i);
    }
    for (size_t i = 0; i < batch.seqs.size(); ++i)
      for (int32_t block : batch.seqs[i].block_table)
        if (const auto it = writer.find(block); it != writer.end() && it->second != i)
          violation("chunk " + std::to_string(it->second) + " writes block " +
                    std::to_string(block) + ", which chunk " + std::to_string(i) + " holds too");
  }

  void check_reads(const SequenceChunk& chunk, size_t index) {
    uint64_t chain = 0;
    for (int p = 0; p < chunk.start_pos; ++p) {
      const Slot& s = slot(chunk, p);
      if (s.token < 0 || s.chain != chained(chain, s.token))
        return violation("chunk " + std::to_string(index) + " reads position " + std::to_string(p) +
                         " of its context, which holds " +
                         (s.token < 0 ? "nothing" : "another context's key and value"));
      chain = s.chain;
    }
  }

  void write(const Batch& batch) {
    for (const SequenceChunk& chunk : batch.seqs) {
      uint64_t chain = chunk.start_pos == 0 ? 0 : slot(chunk, chunk.start_pos - 1).chain;
      for (size_t t = 0; t < chunk.tokens.size(); ++t) {
        chain = chained(chain, chunk.tokens[t]);
        slot(chunk, chunk.start_pos + int(t)) = {chunk.tokens[t], chain};
      }
    }
  }

  RunnerOptions options_;
  int max_num_seqs_;
  int jitter_us_;
  // Passes are serial, one thread at a time; the test reads violations_ after shutdown.
  std::mt19937_64 rng_;
  std::vector<Slot> slots_;  // [block][slot]
  std::vector<std::string> violations_;
  int passes_ = 0;
  std::function<bool()> wanted_;  // set and asked on the model step's thread
};

// An engine whose runner is a CheckingRunner, reachable through runner().
class CheckedEngine {
 public:
  explicit CheckedEngine(const StressConfig& config)
      : engine_(make_serve_config(config),
                [this, config](std::shared_ptr<const LlamaWeights> weights,
                               const RunnerOptions& options) {
                  auto runner = std::make_unique<CheckingRunner>(
                      make_cpu_runner(std::move(weights), options), options, config.max_num_seqs,
                      config.pass_jitter_us, config.seed);
                  runner_ = runner.get();
                  return runner;
                }) {}
  Engine& engine() { return engine_; }
  const CheckingRunner& runner() const { return *runner_; }

 private:
  CheckingRunner* runner_ = nullptr;  // owned by engine_, declared first: set while it is made
  Engine engine_;
};

enum class CancelAt { Never, Submit, Micros, Tokens };

// One API call: its n choices share the prompt and parameters.
struct CallPlan {
  int thread = 0;
  int delay_us = 0;  // the thread's pause before submitting it
  std::vector<int32_t> prompt;
  int n = 1;
  int max_tokens = 0;  // 0: up to the end of the context or the pool
  bool ignore_eos = false;
  int priority = 0;
  bool logprobs = false;
  bool score_prompt = false;  // echo with logprobs: Request::prompt_logprobs
  // Echo with max_tokens 0 (Request::prompt_only): the answer is the prompt, which may fill the
  // whole pool; the one token drawn after it is dropped, and its text is not the answer's.
  bool prompt_only = false;
  std::string stop;  // none when empty
  CancelAt cancel = CancelAt::Never;
  int cancel_choice = 0;
  int cancel_after = 0;  // microseconds after submission, or new tokens received
};

// A solo greedy run of a prompt (model/generation.h), and what a request for it should answer.
struct SoloRun {
  std::vector<int32_t> tokens;  // the ending end-of-sequence id included
  bool ended_by_eos = false;
};

struct Expected {
  std::vector<int32_t> tokens;  // as usage counts them: the ending end-of-sequence id included
  std::string text;
  FinishReason reason = FinishReason::Length;
  bool stopped_by_string = false;
};

// The engine's KV cache layout, which the solo runs use too: the sums attention makes depend on
// how the keys are laid out and stored.
struct KvLayout {
  int block_size = 16;
  bool bf16 = false;
  auto operator<=>(const KvLayout&) const = default;
};

KvLayout kv_layout(const StressConfig& config) {
  return {config.block_size, config.bf16_kv};
}

// Solo greedy runs on stories260K's CPU runner with the engine's KV layout, cached per prompt.
class SoloRuns {
 public:
  SoloRuns()
      : weights_(std::make_shared<const LlamaWeights>(LlamaWeights::load(model_dir()))),
        tokenizer_(model_dir() / "tokenizer.model") {}

  const Tokenizer& tokenizer() const { return tokenizer_; }

  // The prompt's run to `max_tokens` (or a run at least as long made before).
  const SoloRun& run(const KvLayout& layout, const std::vector<int32_t>& prompt, bool ignore_eos,
                     int max_tokens) {
    SoloRun& run = runs_[{layout, prompt, ignore_eos}];
    const bool long_enough =
        run.ended_by_eos || (!run.tokens.empty() && int(run.tokens.size()) >= max_tokens);
    if (long_enough) return run;
    GenerationRequest request;
    request.prompt = prompt;
    request.sampling.temperature = 0.0f;
    request.max_tokens = max_tokens;
    request.ignore_eos = ignore_eos;
    Generator generator(runner(layout), 1);
    auto result = generator.run(std::span(&request, 1)).front();
    run.tokens = std::move(result.tokens);
    run.ended_by_eos = result.finish == FinishReason::Stop;
    return run;
  }

  // What the engine should answer for `plan` whose answer may hold `max_tokens` tokens at most.
  Expected expected(const KvLayout& layout, const CallPlan& plan, int max_tokens) {
    if (plan.prompt_only) return {};  // nothing of the answer is generated
    const SoloRun& solo = run(layout, plan.prompt, plan.ignore_eos, max_tokens);
    Expected e;
    const size_t kept = std::min(solo.tokens.size(), size_t(max_tokens));
    e.tokens.assign(solo.tokens.begin(), solo.tokens.begin() + long(kept));
    const bool eos = solo.ended_by_eos && kept == solo.tokens.size();
    e.reason = eos ? FinishReason::Stop : FinishReason::Length;
    std::vector<int32_t> all = plan.prompt;
    all.insert(all.end(), e.tokens.begin(), e.tokens.end() - (eos ? 1 : 0));
    e.text = tokenizer_.decode(all).substr(tokenizer_.decode(plan.prompt).size());
    if (const size_t at = plan.stop.empty() ? std::string::npos : e.text.find(plan.stop);
        at != std::string::npos) {
      e.text.resize(at);
      e.reason = FinishReason::Stop;
      e.stopped_by_string = true;
    }
    return e;
  }

 private:
  ModelRunner& runner(const KvLayout& layout) {
    auto& runner = runners_[layout];
    if (!runner) {
      RunnerOptions options;
      options.kv_block_size = layout.block_size;
      options.kv_cache_dtype = layout.bf16 ? DType::BF16 : DType::F32;
      options.max_num_seqs = 1;
      runner = make_cpu_runner(weights_, options);
    }
    return *runner;
  }

  std::shared_ptr<const LlamaWeights> weights_;
  Tokenizer tokenizer_;
  std::map<KvLayout, std::unique_ptr<ModelRunner>> runners_;
  std::map<std::tuple<KvLayout, std::vector<int32_t>, bool>, SoloRun> runs_;
};

SoloRuns& solo_runs() {
  static SoloRuns runs;
  return runs;
}

// Texts whose tokens the prompts are cut from: the sentences in three orders, so that prompts
// cut from one text share its first tokens, and those from different texts only BOS.
std::vector<std::vector<int32_t>> source_texts(const Tokenizer& tokenizer) {
  std::vector<std::vector<int32_t>> texts;
  std::vector<std::string> sentences = kSentences;
  std::mt19937_64 order(7);
  for (int i = 0; i < 3; ++i) {
    std::string text;
    for (const auto& sentence : sentences) text += sentence + ". ";
    texts.push_back(tokenizer.encode(text, /*add_bos=*/true));
    std::shuffle(sentences.begin(), sentences.end(), order);
  }
  return texts;
}

// A prompt of BOS and 1 to 119 tokens, fewer than `most`: the start of a source text, sometimes
// with another's piece after it, or a prompt drawn before (equal prompts).
std::vector<int32_t> random_prompt(std::mt19937_64& rng,
                                   const std::vector<std::vector<int32_t>>& texts,
                                   std::span<const CallPlan> earlier, size_t most) {
  if (!earlier.empty() && chance(rng, 0.2)) {
    std::vector<int32_t> prompt = earlier[size_t(uniform(rng, 0, int(earlier.size()) - 1))].prompt;
    prompt.resize(std::min(prompt.size(), most));  // a prompt-only one may fill the pool
    return prompt;
  }
  const auto& text = pick(rng, texts);
  std::vector<int32_t> prompt(text.begin(), text.begin() + uniform(rng, 2, 100));
  if (chance(rng, 0.3)) {
    const auto& other = pick(rng, texts);
    const int from = uniform(rng, 1, int(other.size()) - 21);
    prompt.insert(prompt.end(), other.begin() + from, other.begin() + from + uniform(rng, 1, 20));
  }
  prompt.resize(std::min(prompt.size(), most));
  return prompt;
}

// A prompt for a prompt-only answer: as long as the pool half the time, else of 2 tokens or more.
std::vector<int32_t> prompt_to_echo(std::mt19937_64& rng,
                                    const std::vector<std::vector<int32_t>>& texts,
                                    int max_model_len) {
  std::vector<int32_t> prompt;
  while (int(prompt.size()) < max_model_len)
    for (const auto& text : texts) prompt.insert(prompt.end(), text.begin(), text.end());
  prompt.resize(size_t(chance(rng, 0.5) ? max_model_len : uniform(rng, 2, max_model_len)));
  return prompt;
}

// The answer's length limit: the client's max_tokens, capped as tokenize caps it.
int answer_limit(const CallPlan& plan, int max_model_len) {
  const int room = max_model_len - int(plan.prompt.size());
  return plan.max_tokens > 0 ? std::min(plan.max_tokens, room) : room;
}

std::vector<CallPlan> random_calls(std::mt19937_64& rng, const StressConfig& config,
                                   int max_model_len) {
  const auto texts = source_texts(solo_runs().tokenizer());
  std::vector<CallPlan> calls(size_t(uniform(rng, 24, 36)));
  for (size_t i = 0; i < calls.size(); ++i) {
    CallPlan& c = calls[i];
    c.thread = uniform(rng, 0, config.submit_threads - 1);
    c.delay_us = chance(rng, 0.4) ? 0 : uniform(rng, 0, 3000);  // bursts, and gaps
    // Room for 8 tokens of answer, in the smallest pools too.
    c.prompt = random_prompt(rng, texts, std::span(calls).first(i), size_t(max_model_len - 8));
    c.n = chance(rng, 0.75) ? 1 : uniform(rng, 2, 3);
    c.max_tokens = chance(rng, 0.08) ? 0 : uniform(rng, 1, 100);
    c.ignore_eos = chance(rng, 0.5);
    if (config.priority_policy) c.priority = uniform(rng, -2, 2);
    c.prompt_only = chance(rng, 0.06);
    if (c.prompt_only) {
      c.prompt = prompt_to_echo(rng, texts, max_model_len);
      c.max_tokens = 1;  // as the protocol sets it: one token is drawn, and dropped
    }
    c.score_prompt = chance(rng, c.prompt_only ? 0.5 : 0.08);
    c.logprobs = c.score_prompt || chance(rng, 0.25);
    const double cancel = std::uniform_real_distribution<double>(0, 1)(rng);
    c.cancel = cancel < 0.75  ? CancelAt::Never
               : cancel < 0.8 ? CancelAt::Submit
               : cancel < 0.9 ? CancelAt::Micros
                              : CancelAt::Tokens;
    c.cancel_choice = uniform(rng, 0, c.n - 1);
    c.cancel_after = c.cancel == CancelAt::Micros ? uniform(rng, 0, 5000)
                                                  : uniform(rng, 1, std::max(1, c.max_tokens));
    // A stop string from the answer itself, so that it is met (unless max_tokens ends it first).
    if (!c.prompt_only && chance(rng, 0.1)) {
      const std::string text =
          solo_runs().expected(kv_layout(config), c, answer_limit(c, max_model_len)).text;
      if (text.size() > 8) {
        const int at = uniform(rng, 0, int(text.size()) - 4);
        c.stop = text.substr(size_t(at), size_t(uniform(rng, 2, 4)));
      }
    }
  }
  return calls;
}

// The count of requests accepted and not ended, which the sinks share with the schedule: a
// request may end after the schedule that submitted it has gone (its engine failing it at
// shutdown).
using Count = std::shared_ptr<std::atomic<int>>;

// Collects a request's results, counts its endings and generated tokens, and keeps the count of
// requests accepted and not ended up to date.
class StressSink final : public CollectingSink {
 public:
  explicit StressSink(Count not_ended) : not_ended_(std::move(not_ended)) {}
  void on_delta(Delta delta) override {
    if (delta.new_token) ++new_tokens_;
    CollectingSink::on_delta(std::move(delta));
  }
  void on_finish(const Completion& completion) override {
    ended();
    CollectingSink::on_finish(completion);
  }
  void on_error(const RequestError& error) override {
    ended();
    CollectingSink::on_error(error);
  }
  int new_tokens() const { return new_tokens_; }
  int endings() const { return endings_; }

 private:
  void ended() {
    ++endings_;
    --*not_ended_;
  }

  Count not_ended_;
  std::atomic<int> new_tokens_{0};
  std::atomic<int> endings_{0};
};

StressSink& sink_of(const std::shared_ptr<Request>& r) {
  return static_cast<StressSink&>(*r->sink);
}

std::vector<std::shared_ptr<Request>> make_choices(const CallPlan& plan, size_t call,
                                                   const Count& not_ended) {
  std::vector<std::shared_ptr<Request>> choices;
  for (int i = 0; i < plan.n; ++i) {
    auto request = std::make_shared<Request>();
    request->id = "cmpl-stress-" + std::to_string(call) + "-" + std::to_string(i);
    request->chat = false;
    request->prompt_ids = plan.prompt;
    request->sampling.temperature = 0.0f;  // greedy: the solo run is the reference
    request->sampling.logprobs = plan.logprobs;
    request->prompt_logprobs = plan.score_prompt;
    request->prompt_only = plan.prompt_only;
    request->max_tokens = plan.max_tokens;
    request->ignore_eos = plan.ignore_eos;
    request->priority = plan.priority;
    if (!plan.stop.empty()) request->stop = {plan.stop};
    request->sink = std::make_shared<StressSink>(not_ended);
    choices.push_back(std::move(request));
  }
  return choices;
}

// A cancellation waiting for its moment.
struct PendingCancel {
  size_t call = 0;
  std::shared_ptr<Request> request;
  CancelAt at = CancelAt::Never;
  int after = 0;
  Clock::time_point submitted;

  bool due() const {
    if (at == CancelAt::Micros) return Clock::now() >= submitted + std::chrono::microseconds(after);
    return sink_of(request).new_tokens() >= after;
  }
};

// The outcome of one seed's run.
struct CallResult {
  std::optional<SubmitStatus> status;  // none: never submitted (the engine shut down first)
  std::vector<std::shared_ptr<Request>> choices;
  int refusals = 0;  // QueueFull answers
  bool cancel_sent = false;

  bool accepted() const { return status == SubmitStatus::Accepted; }
};

// Submits the calls from their threads at their times, and cancels as planned from one more.
class Schedule {
 public:
  Schedule(Engine& engine, const StressConfig& config, const std::vector<CallPlan>& calls)
      : engine_(engine), config_(config), calls_(calls), results_(calls.size()) {}

  std::vector<CallResult> run() {
    std::vector<std::thread> submitters;
    for (int t = 0; t < config_.submit_threads; ++t)
      submitters.emplace_back([this, t] { submit_from(t); });
    std::thread canceller([this] { cancel_when_due(); });
    std::thread stopper([this] { shut_down_early(); });
    for (auto& thread : submitters) thread.join();
    stopper.join();
    submitting_done_ = true;
    canceller.join();
    return std::move(results_);
  }

 private:
  // A refused call is tried again a little later, as the offline batch runner waits for room.
  void submit_from(int thread) {
    for (size_t i = 0; i < calls_.size(); ++i) {
      if (calls_[i].thread != thread) continue;
      std::this_thread::sleep_for(std::chrono::microseconds(calls_[i].delay_us));
      results_[i].choices = make_choices(calls_[i], i, not_ended_);
      // More choices than the queue holds are refused whatever the load: no use trying again.
      const bool may_fit = calls_[i].n <= config_.max_queue;
      SubmitStatus status;
      for (const auto until = Clock::now() + kRetryFor;
           (status = submit(i)) == SubmitStatus::QueueFull && may_fit && Clock::now() < until;)
        std::this_thread::sleep_for(1ms);
      if (status == SubmitStatus::ShuttingDown) return;
    }
  }

  // Shuts the engine down in the middle of the schedule, if the config says so: once shutdown()
  // returns, every request it accepted has ended (finished within the grace, or failed).
  void shut_down_early() {
    if (config_.shutdown_after_ms < 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(config_.shutdown_after_ms));
    shutting_down_ = true;
    engine_.shutdown(std::chrono::milliseconds(config_.shutdown_grace_ms));
    std::lock_guard lock(submit_mutex_);  // no call is being accepted meanwhile
    for (const auto& result : results_) {
      if (!result.accepted()) continue;
      for (const auto& request : result.choices)
        EXPECT_TRUE(sink_of(request).ended_at().has_value())
            << request->id << " had not ended when shutdown returned: " << config_.describe();
    }
  }

  // One call at a time, so that the queue limit's check knows every request in the queue: the
  // gauge the engine holds the limit to counts only accepted requests that have not ended, and
  // the call's own.
  SubmitStatus submit(size_t i) {
    const CallPlan& plan = calls_[i];
    CallResult& result = results_[i];
    std::lock_guard lock(submit_mutex_);
    const int before = not_ended_->fetch_add(plan.n);
    const SubmitStatus status = engine_.submit(result.choices);
    result.status = status;
    if (status == SubmitStatus::Accepted) {
      EXPECT_LE(plan.n, config_.max_queue)
          << "call " << i << ": more choices accepted than the queue holds: " << config_.describe();
      schedule_cancel(i);
      return status;
    }
    *not_ended_ -= plan.n;
    if (status == SubmitStatus::QueueFull) {
      ++result.refusals;
      EXPECT_GT(before + plan.n, config_.max_queue)
          << "call " << i << " of " << plan.n << " refused with " << before
          << " accepted requests not ended: " << config_.describe();
    } else if (status != SubmitStatus::ShuttingDown || !shutting_down_) {
      ADD_FAILURE() << "call " << i << " refused: the engine "
                    << (engine_.failure() ? "failed: " + *engine_.failure() : "shuts down") << ": "
                    << config_.describe();
    }
    return status;
  }

  void schedule_cancel(size_t i) {
    const CallPlan& plan = calls_[i];
    if (plan.cancel == CancelAt::Never) return;
    std::lock_guard lock(pending_mutex_);
    pending_.push_back({i, results_[i].choices[size_t(plan.cancel_choice)], plan.cancel,
                        plan.cancel_after, Clock::now()});
  }

  void cancel_when_due() {
    for (;;) {
      std::vector<PendingCancel> due;
      {
        std::lock_guard lock(pending_mutex_);
        if (submitting_done_ && pending_.empty()) return;
        for (auto it = pending_.begin(); it != pending_.end();) {
          // One that ended before its moment is cancelled all the same: nothing may change.
          if (sink_of(it->request).ended_at() || it->at == CancelAt::Submit || it->due()) {
            due.push_back(*it);
            it = pending_.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (const auto& cancel : due) {
        engine_.cancel(*cancel.request);
        results_[cancel.call].cancel_sent = true;  // no other thread writes it
      }
      std::this_thread::sleep_for(100us);
    }
  }

  Engine& engine_;
  const StressConfig& config_;
  const std::vector<CallPlan>& calls_;
  std::vector<CallResult> results_;
  Count not_ended_ = std::make_shared<std::atomic<int>>(0);
  std::mutex submit_mutex_;
  std::mutex pending_mutex_;
  std::vector<PendingCancel> pending_;
  std::atomic<bool> submitting_done_{false};
  std::atomic<bool> shutting_down_{false};
};

// What the sinks received, summed for the metrics' checks.
struct Tally {
  int accepted = 0, finished = 0, stopped = 0, failed = 0, cancelled = 0, shut_down = 0;
  int finished_though_cancelled = 0;
  uint64_t finished_tokens = 0;       // completion_tokens of the finished
  uint64_t cut_short_tokens_min = 0;  // tokens the cancelled or shut down ones received
  uint64_t cut_short_tokens_max = 0;  // tokens they would have had, had they finished
  uint64_t finished_prompt_tokens = 0, accepted_prompt_tokens = 0, finished_cached_tokens = 0;
};

// Checks one choice's ending against its solo run, and adds it to the tally.
void check_choice(const StressConfig& config, const CallPlan& plan, const CallResult& result,
                  const std::shared_ptr<Request>& request, const Expected& expected, Tally& tally) {
  SCOPED_TRACE(request->id + " (" + std::to_string(plan.prompt.size()) + "-token prompt, " +
               "max_tokens " + std::to_string(plan.max_tokens) + ", ignore_eos " +
               std::to_string(plan.ignore_eos) + ", priority " + std::to_string(plan.priority) +
               ", stop '" + plan.stop + "') of " + config.describe());
  StressSink& sink = sink_of(request);
  const bool cancel_sent =
      result.cancel_sent && request == result.choices[size_t(plan.cancel_choice)];
  EXPECT_EQ(sink.endings(), 1);
  EXPECT_FALSE(sink.out_of_order());
  tally.accepted_prompt_tokens += plan.prompt.size();
  const std::string text = sink.text();
  if (const auto error = sink.error()) {
    ++tally.failed;
    const bool shut_down = config.shutdown_after_ms >= 0 && error->http_status == 503 &&
                           error->message == "server shutting down";
    if (error->http_status != kClientGoneStatus && !shut_down) {
      ADD_FAILURE() << "failed with " << error->http_status << ": " << error->message;
      return;
    }
    EXPECT_TRUE(cancel_sent || shut_down) << "499 for a request nobody cancelled";
    EXPECT_TRUE(plan.prompt_only || expected.text.compare(0, text.size(), text) == 0)
        << "an answer cut short is no prefix of the solo run's: '" << text << "' vs '"
        << expected.text << "'";
    ++(shut_down ? tally.shut_down : tally.cancelled);
    // A prompt-only answer's dropped token counts nowhere.
    if (!plan.prompt_only) tally.cut_short_tokens_min += uint64_t(sink.new_tokens());
    tally.cut_short_tokens_max += expected.tokens.size();
    return;
  }
  const auto completion = sink.completion();
  ASSERT_TRUE(completion.has_value());
  ++tally.finished;
  tally.stopped += completion->reason == FinishReason::Stop;
  tally.finished_though_cancelled += cancel_sent;
  tally.finished_tokens += uint64_t(completion->completion_tokens);
  tally.finished_prompt_tokens += plan.prompt.size();
  tally.finished_cached_tokens += uint64_t(completion->cached_tokens);
  EXPECT_EQ(completion->prompt_tokens, int(plan.prompt.size()));
  EXPECT_EQ(completion->cached_tokens % config.block_size, 0);
  EXPECT_LT(completion->cached_tokens, int(plan.prompt.size()));
  EXPECT_TRUE(config.prefix_caching || completion->cached_tokens == 0);
  if (plan.score_prompt) {
    EXPECT_EQ(completion->cached_tokens, 0) << "a prompt to score is computed whole";
    EXPECT_EQ(sink.prompt().size(), plan.prompt.size()) << "every prompt token is scored";
  }
  if (plan.prompt_only) {
    EXPECT_EQ(completion->completion_tokens, 0) << "a prompt-only answer generates nothing";
    return;
  }
  EXPECT_EQ(text, expected.text);
  EXPECT_EQ(completion->reason, expected.reason);
  // A stop string ends the answer at a token the solo run does not say.
  if (expected.stopped_by_string) return;
  EXPECT_EQ(completion->completion_tokens, int(expected.tokens.size()));
  if (!plan.logprobs) return;
  std::vector<int32_t> ids;
  for (const TokenOutput& token : sink.tokens()) ids.push_back(token.token);
  EXPECT_EQ(ids, expected.tokens);
}

// Once every request has ended: nothing is left in the scheduler, and the counters agree with
// what the sinks received.
void check_metrics(Engine& engine, const StressConfig& config, const Tally& tally) {
  SCOPED_TRACE(config.describe());
  const Metrics& m = engine.metrics();
  // The scheduler frees an ended sequence's blocks at its next step (after an early shutdown
  // it has stopped, and counts what it held then).
  const bool scheduling = config.shutdown_after_ms < 0;
  EXPECT_TRUE(eventually([&] {
    return m.waiting_sequences.value() == 0 &&
           (!scheduling || (m.running_sequences.value() == 0 && m.kv_blocks_used.value() == 0));
  })) << "running "
      << m.running_sequences.value() << ", waiting " << m.waiting_sequences.value()
      << ", KV blocks used " << m.kv_blocks_used.value() << " of " << m.kv_blocks_total.value();
  engine.shutdown(1s);  // drains the graph, so every counter is final
  EXPECT_EQ(m.kv_blocks_total.value(), config.num_blocks);
  EXPECT_EQ(m.requests_added.value(), uint64_t(tally.accepted));
  EXPECT_EQ(m.requests_finished(), uint64_t(tally.finished));
  EXPECT_EQ(m.requests_stopped.value(), uint64_t(tally.stopped));
  EXPECT_EQ(m.requests_failed.value(), uint64_t(tally.failed));
  EXPECT_EQ(m.requests_cancelled.value(), uint64_t(tally.cancelled));
  EXPECT_EQ(m.request_seconds.count(), uint64_t(tally.finished));
  EXPECT_EQ(m.request_generation_tokens.sum(), double(tally.finished_tokens));
  // A cancelled sequence's tokens are counted until the scheduler drops it.
  EXPECT_GE(m.generated_tokens.value(), tally.finished_tokens + tally.cut_short_tokens_min);
  EXPECT_LE(m.generated_tokens.value(), tally.finished_tokens + tally.cut_short_tokens_max);
  // A request cancelled before tokenize counts no prompt tokens.
  EXPECT_GE(m.prompt_tokens.value(), tally.finished_prompt_tokens);
  EXPECT_LE(m.prompt_tokens.value(), tally.accepted_prompt_tokens);
  // Hits count the prompts of requests that did not finish too, at their first admission only.
  EXPECT_GE(m.prefix_cache_hit_tokens.value(), tally.finished_cached_tokens);
  EXPECT_LE(m.prefix_cache_hit_tokens.value(), m.prefix_cache_queried_tokens.value());
  EXPECT_LE(m.prefix_cache_queried_tokens.value(), m.prompt_tokens.value());
  // Every finished request was prefilled; a cancelled one perhaps not.
  EXPECT_GE(m.prompt_tokens_prefilled.value(), tally.finished_prompt_tokens);
  EXPECT_LE(m.prompt_tokens_prefilled.value(), m.prompt_tokens.value());
  EXPECT_EQ(m.request_inference_seconds.count(), uint64_t(tally.finished));
  EXPECT_TRUE(config.prefix_caching || m.prefix_cache_hit_tokens.value() == 0)
      << "cache hits with prefix caching off";
}

// What the seeds produced, summed: a schedule that never preempts, hits the cache or cancels
// tests less than it seems to.
struct Coverage {
  int requests = 0, refusals = 0, cancelled = 0, finished_though_cancelled = 0, shut_down = 0;
  uint64_t preemptions = 0, prefix_hit_tokens = 0, prefill_passes = 0, decode_steps = 0;

  void add(const Tally& tally, const std::vector<CallResult>& results, const Metrics& m) {
    requests += tally.accepted;
    for (const auto& result : results) refusals += result.refusals;
    cancelled += tally.cancelled;
    finished_though_cancelled += tally.finished_though_cancelled;
    shut_down += tally.shut_down;
    preemptions += m.preemptions.value();
    prefix_hit_tokens += m.prefix_cache_hit_tokens.value();
    prefill_passes += m.prefill_batches.value();
    decode_steps += m.decode_steps.value();
  }
  std::string describe() const {
    std::ostringstream out;
    out << requests << " requests accepted, " << refusals << " QueueFull answers, " << cancelled
        << " cancelled, " << finished_though_cancelled << " finished before their cancel, "
        << shut_down << " failed by an early shutdown, " << preemptions << " preemptions, "
        << prefix_hit_tokens << " prefix cache hit tokens, " << prefill_passes
        << " prefill passes, " << decode_steps << " decode steps";
    return out.str();
  }
};

void run_seed(uint64_t seed, Coverage& total) {
  std::mt19937_64 rng(seed);
  const StressConfig config = random_config(seed, rng);
  SCOPED_TRACE(config.describe());
  CheckedEngine checked(config);
  Engine& engine = checked.engine();
  const int max_model_len = engine.max_model_len();
  const std::vector<CallPlan> calls = random_calls(rng, config, max_model_len);
  std::vector<Expected> expected;  // per call, before the clock starts
  for (const CallPlan& plan : calls)
    expected.push_back(
        solo_runs().expected(kv_layout(config), plan, answer_limit(plan, max_model_len)));

  const auto started = Clock::now();
  const std::vector<CallResult> results = Schedule(engine, config, calls).run();
  Tally tally;
  for (const auto& result : results) {
    if (!result.accepted()) continue;
    for (const auto& request : result.choices) {
      ++tally.accepted;
      const auto left = kHangDeadline - (Clock::now() - started);
      ASSERT_TRUE(sink_of(request).wait(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max<Clock::duration>(left, 0s))))
          << request->id << " did not end within " << kHangDeadline.count()
          << " s: " << config.describe();
    }
  }
  for (size_t i = 0; i < calls.size(); ++i)
    for (const auto& request : results[i].choices)
      if (results[i].accepted())
        check_choice(config, calls[i], results[i], request, expected[i], tally);
  check_metrics(engine, config, tally);
  for (const std::string& violation : checked.runner().violations())
    ADD_FAILURE() << violation << ": " << config.describe();
  Coverage coverage;
  coverage.add(tally, results, engine.metrics());
  total.add(tally, results, engine.metrics());
  std::printf("%s\n  %s in %.2f s\n", config.describe().c_str(), coverage.describe().c_str(),
              std::chrono::duration<double>(Clock::now() - started).count());
}

std::vector<uint64_t> seeds() {
  if (const char* one = std::getenv("STRESS_SEED")) return {std::strtoull(one, nullptr, 10)};
  return {std::begin(kSeeds), std::end(kSeeds)};
}

TEST(EngineStress, RandomSchedulesAnswerAsSoloRunsAndLeaveNothingBehind) {
  Coverage total;
  for (uint64_t seed : seeds()) {
    run_seed(seed, total);
    if (HasFatalFailure()) return;
  }
  std::printf("all seeds: %s\n", total.describe().c_str());
}

}  // namespace
}  // namespace pipeline
