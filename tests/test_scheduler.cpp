// The scheduler without a model: sequences go in as the tokenize stage posts them, the
// test plays the model stages (appends sampled tokens, posts each pass's StepResult), and checks
// the batches the scheduler hands out.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "graph/scheduler.h"
#include "tests/support/collecting_sink.h"

namespace pipeline {
namespace {

using namespace std::chrono_literals;

class SchedulerTest : public ::testing::Test {
 protected:
  static constexpr int kBlocks = 64;
  static constexpr int kBlockSize = 16;

  // A scheduler with no batch window and a pool of kBlocks blocks.
  void start(int max_prefill_tokens = 2048, bool prefix_caching = true, int max_batch = 16,
             int window_ms = 0, Scheduler::FailureListener on_failure = {}) {
    SchedulerSection config;
    config.window_ms = window_ms;
    config.max_batch = max_batch;
    config.max_prefill_tokens = max_prefill_tokens;
    config.enable_prefix_caching = prefix_caching;
    scheduler_ =
        std::make_unique<Scheduler>(config, kBlocks, kBlockSize, metrics_, std::move(on_failure));
  }

  void TearDown() override { scheduler_.reset(); }  // its thread ends before the queue below

  // A sequence with a prompt of `prompt` tokens (first_token, first_token + 1, ...), posted as
  // tokenize posts it, with its sampler; `score_prompt`: one whose prompt is scored (echo with
  // logprobs).
  SequencePtr submit(int prompt, int32_t first_token = 10, bool score_prompt = false,
                     int priority = 0, const SamplingParams& sampling = {}) {
    auto request = std::make_shared<Request>();
    request->sampling = sampling;
    request->prompt_logprobs = score_prompt;
    request->priority = priority;
    request->id = "cmpl-sched-" + std::to_string(next_number_);
    request->sink = std::make_shared<testing::CollectingSink>();
    auto seq = std::make_shared<Sequence>(request, next_number_++,
                                          [](Sequence&, const ResponseStream::Payload&) {});
    for (int i = 0; i < prompt; ++i) seq->tokens.push_back(first_token + i);
    seq->prompt_len = prompt;
    seq->max_tokens = 100;
    seq->sampler = std::make_unique<Sampler>(sampling, 1);
    scheduler_->post(Tokenized{seq}, emit_);
    return seq;
  }

  // Whether a batch arrives within `wait`.
  bool batch_within(std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    return batch_ready_.wait_for(lock, wait, [&] { return !batches_.empty(); });
  }

  // The next batch the scheduler hands out; fails the test after 5 s without one.
  Message next_batch() {
    std::unique_lock lock(mutex_);
    if (!batch_ready_.wait_for(lock, 5s, [&] { return !batches_.empty(); })) {
      ADD_FAILURE() << "the scheduler handed out no batch within 5 s";
      return Message{};
    }
    Message m = std::move(batches_.front());
    batches_.pop_front();
    return m;
  }

  // What the model stages post once a pass sampled a token for each of `seqs`.
  static StepResult sampled(bool prefill, const std::vector<SequencePtr>& seqs) {
    StepResult result;
    result.prefill = prefill;
    for (const auto& seq : seqs) {
      seq->tokens.push_back(7);
      SampledOutput out;
      out.seq = seq;
      out.index = seq->generated() - 1;
      out.sampled.token = 7;
      result.outputs.push_back(std::move(out));
    }
    return result;
  }

  void post(StepResult result) { scheduler_->post(std::move(result), emit_); }

  // Like sampled(), for sequences whose token ends them.
  static StepResult finished(bool prefill, const std::vector<SequencePtr>& seqs) {
    StepResult result = sampled(prefill, seqs);
    for (auto& out : result.outputs) out.finish = FinishReason::Length;
    return result;
  }

  const Metrics& metrics() const { return metrics_; }
  // The thread that emitted the latest batch.
  std::thread::id emitting_thread() {
    std::lock_guard lock(mutex_);
    return emitting_thread_;
  }

 private:
  Metrics metrics_;
  std::mutex mutex_;
  std::condition_variable batch_ready_;
  std::deque<Message> batches_;
  uint64_t next_number_ = 0;
  std::thread::id emitting_thread_;
  Emit emit_ = [this](Message m) {
    std::lock_guard lock(mutex_);
    emitting_thread_ = std::this_thread::get_id();
    batches_.push_back(std::move(m));
    batch_ready_.notify_one();
  };
  std::unique_ptr<Scheduler> scheduler_;
};

// A newcomer and a step's result are each turned into the next batch on the thread that posts
// them, before post() returns: no thread wakes between two passes. (Without a window nothing
// else schedules: a post that found the scheduler's own thread in a pass would hand it the
// message instead.)
TEST_F(SchedulerTest, APostRunsThePassOnThePostingThread) {
  start();
  const SequencePtr seq = submit(5);
  ASSERT_TRUE(batch_within(0ms)) << "the prefill batch was not out when post() returned";
  EXPECT_TRUE(std::holds_alternative<PrefillBatch>(next_batch()));
  EXPECT_EQ(emitting_thread(), std::this_thread::get_id());
  post(sampled(true, {seq}));
  ASSERT_TRUE(batch_within(0ms)) << "the decode batch was not out when post() returned";
  EXPECT_TRUE(std::holds_alternative<DecodeBatch>(next_batch()));
  EXPECT_EQ(emitting_thread(), std::this_thread::get_id());
}

// A batch window's end, which nobody posts, is the scheduler's own thread's to act on.
TEST_F(SchedulerTest, AWindowsEndIsTheSchedulersThreadToActOn) {
  start(2048, true, /*max_batch=*/16, /*window_ms=*/50);
  const auto submitted = std::chrono::steady_clock::now();
  submit(5);
  EXPECT_FALSE(batch_within(0ms)) << "the window is open";
  ASSERT_TRUE(std::holds_alternative<PrefillBatch>(next_batch()));
  EXPECT_GE(std::chrono::steady_clock::now() - submitted, 50ms);
  EXPECT_NE(emitting_thread(), std::this_thread::get_id());
}

// The thread times a window whose end a pass computed while another pass was in flight: here
// the last running sequence finishes and the newcomer's window, already known, is all that is
// left to wait for.
TEST_F(SchedulerTest, AWindowStillEndsAfterThePassInFlightFinishes) {
  start(2048, true, /*max_batch=*/16, /*window_ms=*/100);
  const SequencePtr first = submit(5);
  ASSERT_TRUE(std::holds_alternative<PrefillBatch>(next_batch()));
  const SequencePtr second = submit(5, 20);  // its window ends 100 ms from now
  post(sampled(true, {first}));              // the next pass sees the window
  ASSERT_TRUE(std::holds_alternative<DecodeBatch>(next_batch()));
  post(finished(false, {first}));  // nothing runs now: only the window is left
  Message last = next_batch();
  ASSERT_TRUE(std::holds_alternative<PrefillBatch>(last));
  EXPECT_EQ(std::get<PrefillBatch>(last).seqs, (std::vector<SequencePtr>{second}));
}

// A chunk asks for its row's argmax alone where its sampler draws nothing else (greedy, nothing
// adjusting the logits, no logprobs) and the pass scores none of its prompt.
TEST_F(SchedulerTest, AChunkAsksForItsArgmaxAloneWhereThatIsAllItsDrawNeeds) {
  start(2048, true, /*max_batch=*/4, /*window_ms=*/5000);  // the four are prefilled together
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams reporting = greedy;
  reporting.logprobs = true;
  const std::vector<SequencePtr> seqs{
      submit(5, 10, false, 0, greedy), submit(5, 20, false, 0, SamplingParams{}),
      submit(5, 30, false, 0, reporting), submit(5, 40, /*score_prompt=*/true, 0, greedy)};
  const auto argmax_only = [&](const std::vector<SequencePtr>& order, const Batch& batch) {
    std::vector<bool> flags(seqs.size());
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t which = size_t(std::find(seqs.begin(), seqs.end(), order[i]) - seqs.begin());
      flags.at(which) = batch.seqs[i].argmax_only;
    }
    return flags;
  };
  Message first = next_batch();
  ASSERT_TRUE(std::holds_alternative<PrefillBatch>(first));
  const auto& prefill = std::get<PrefillBatch>(first);
  EXPECT_EQ(argmax_only(prefill.seqs, prefill.batch),
            (std::vector<bool>{true, false, false, false}));
  EXPECT_FALSE(prefill.batch.argmax_only());
  post(sampled(true, seqs));
  Message second = next_batch();
  ASSERT_TRUE(std::holds_alternative<DecodeBatch>(second));
  const auto& decode = std::get<DecodeBatch>(second);
  // The scored prompt's sequence has its first token: its draws need only the argmax now.
  EXPECT_EQ(argmax_only(decode.seqs, decode.batch), (std::vector<bool>{true, false, false, true}));
}

// An exception in a scheduling pass (here a broken invariant: a step result whose sequence
// holds a block that is free) ends the thread and is reported once, with why; the scheduler
// takes nothing more, where before it ended the process.
TEST_F(SchedulerTest, AnExceptionOnItsThreadIsReportedAndEndsTheScheduler) {
  std::mutex mutex;
  std::condition_variable reported;
  std::vector<std::string> failures;
  start(2048, true, 16, 0, [&](const std::string& why) {
    std::lock_guard lock(mutex);
    failures.push_back(why);
    reported.notify_one();
  });
  const SequencePtr broken = submit(5);
  std::get<PrefillBatch>(next_batch());
  StepResult result;
  result.prefill = true;
  broken->block_table = {kBlocks - 1};  // never handed out
  result.failed = {broken};
  post(std::move(result));
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(reported.wait_for(lock, 5s, [&] { return !failures.empty(); }));
    ASSERT_EQ(failures.size(), 1u);
    EXPECT_EQ(failures[0].rfind("the scheduler failed: BlockManager::release: block 63", 0), 0u)
        << failures[0];
  }
  submit(3);
  EXPECT_FALSE(batch_within(300ms));
}

TEST_F(SchedulerTest, ARiderOfAFailedPrefillPassDecodesTheSamePositionAgain) {
  start();
  const SequencePtr decoder = submit(5);
  auto first = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(first.batch.seqs.size(), 1u);
  post(sampled(true, {decoder}));
  auto step = std::get<DecodeBatch>(next_batch());
  ASSERT_EQ(step.batch.seqs[0].start_pos, 5);

  // A prompt arrives while the decode step runs; the next pass carries both, the rider last.
  const SequencePtr prompt = submit(40);
  post(sampled(false, {decoder}));
  auto mixed = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(mixed.seqs.size(), 2u);
  EXPECT_EQ(mixed.seqs[0], prompt);
  EXPECT_EQ(mixed.seqs[1], decoder);
  EXPECT_EQ(mixed.decoding, 1);
  EXPECT_EQ(mixed.batch.seqs[1].start_pos, 6);
  EXPECT_EQ(mixed.batch.seqs[1].tokens, (std::vector<int32_t>{7}));

  // The pass throws: the prompt fails (the stage told its client), the rider is handed back.
  prompt->stream.fail({500, "out of memory", "server_error", "", ""});
  StepResult failed;
  failed.prefill = true;
  failed.failed = {prompt};
  failed.retry = {decoder};
  post(std::move(failed));

  auto again = std::get<DecodeBatch>(next_batch());
  ASSERT_EQ(again.seqs.size(), 1u);
  EXPECT_EQ(again.seqs[0], decoder);
  EXPECT_EQ(again.batch.seqs[0].start_pos, 6);
  EXPECT_EQ(again.batch.seqs[0].tokens, (std::vector<int32_t>{7}));
  EXPECT_TRUE(prompt->block_table.empty()) << "the failed prompt's blocks were freed";
  EXPECT_EQ(decoder->block_table.size(), 1u);
}

TEST_F(SchedulerTest, ALongPromptGoesInChunksWithTheRunningSequencesAlongside) {
  start(16);
  const SequencePtr decoder = submit(5);
  std::get<PrefillBatch>(next_batch());
  post(sampled(true, {decoder}));
  std::get<DecodeBatch>(next_batch());

  const SequencePtr prompt = submit(40);
  post(sampled(false, {decoder}));
  // 16 + 16 + 8 prompt tokens; the decoder advances one position in each of the three passes.
  const int starts[] = {0, 16, 32};
  const int sizes[] = {16, 16, 8};
  for (int pass = 0; pass < 3; ++pass) {
    auto mixed = std::get<PrefillBatch>(next_batch());
    ASSERT_EQ(mixed.seqs.size(), 2u) << "pass " << pass;
    EXPECT_EQ(mixed.seqs[0], prompt);
    EXPECT_EQ(mixed.batch.seqs[0].start_pos, starts[pass]);
    EXPECT_EQ(int(mixed.batch.seqs[0].tokens.size()), sizes[pass]);
    // Blocks for the whole prompt from its first chunk: later chunks never wait for blocks.
    EXPECT_EQ(mixed.batch.seqs[0].block_table.size(), 3u);
    EXPECT_EQ(mixed.decoding, 1);
    EXPECT_EQ(mixed.batch.seqs[1].start_pos, 6 + pass);
    // Only the chunk that reaches the prompt's last token is sampled.
    post(pass < 2 ? sampled(true, {decoder}) : sampled(true, {prompt, decoder}));
  }
  auto both = std::get<DecodeBatch>(next_batch());
  ASSERT_EQ(both.seqs.size(), 2u);
  EXPECT_EQ(both.seqs[0], decoder);  // by arrival
  EXPECT_EQ(both.batch.seqs[0].start_pos, 9);
  EXPECT_EQ(both.batch.seqs[1].start_pos, 40);
}

// The waiting queue is kept in priority order (lower first), arrival order within a priority.
TEST_F(SchedulerTest, NewcomersQueueByPriorityThenArrival) {
  start(2048, /*prefix_caching=*/false, /*max_batch=*/4, /*window_ms=*/60000);
  const SequencePtr a = submit(5, 10, false, 0);
  const SequencePtr b = submit(5, 20, false, 5);
  const SequencePtr c = submit(5, 30, false, -1);
  const SequencePtr d = submit(5, 40, false, 0);
  EXPECT_EQ(std::get<PrefillBatch>(next_batch()).seqs, (std::vector<SequencePtr>{c, a, d, b}));
}

TEST_F(SchedulerTest, APromptSeenBeforeStartsAfterItsCachedBlocks) {
  start();
  const SequencePtr first = submit(40);
  auto pass = std::get<PrefillBatch>(next_batch());
  const std::vector<int32_t> first_blocks = pass.batch.seqs[0].block_table;
  post(finished(true, {first}));  // its two full blocks stay cached

  const SequencePtr again = submit(40);
  auto cached = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(cached.seqs.size(), 1u);
  EXPECT_EQ(cached.batch.seqs[0].start_pos, 32);
  EXPECT_EQ(cached.batch.seqs[0].tokens.size(), 8u);
  const auto& table = cached.batch.seqs[0].block_table;
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[0], first_blocks[0]);
  EXPECT_EQ(table[1], first_blocks[1]);
  EXPECT_EQ(metrics().prefix_cache_hit_tokens.value(), 32u);
  EXPECT_EQ(metrics().prefix_cache_queried_tokens.value(), 80u);  // both prompts were looked up
  post(finished(true, {again}));

  // Its last token is always computed, for the logits of its first sampled token: a prompt of
  // exactly two blocks takes only the first from the cache.
  submit(32);
  EXPECT_EQ(std::get<PrefillBatch>(next_batch()).batch.seqs[0].start_pos, 16);
}

TEST_F(SchedulerTest, WithoutPrefixCachingEveryPromptIsComputedWhole) {
  start(2048, /*prefix_caching=*/false);
  const SequencePtr first = submit(40);
  std::get<PrefillBatch>(next_batch());
  post(finished(true, {first}));
  submit(40);
  EXPECT_EQ(std::get<PrefillBatch>(next_batch()).batch.seqs[0].start_pos, 0);
  EXPECT_EQ(metrics().prefix_cache_hit_tokens.value(), 0u);
  EXPECT_EQ(metrics().prefix_cache_queried_tokens.value(), 0u);
}

TEST_F(SchedulerTest, EqualPromptsAdmittedTogetherComputeTheirStartOnce) {
  // Three equal prompts and another fill a batch of four. The first of the equal ones computes
  // the shared start; the two that follow it wait one pass and take its blocks from the cache,
  // while the other prompt, behind them, is not held back.
  start(2048, true, /*max_batch=*/4, /*window_ms=*/60000);
  const SequencePtr a = submit(40);
  const SequencePtr b = submit(40);
  const SequencePtr c = submit(40);
  const SequencePtr other = submit(40, /*first_token=*/100);
  auto first = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(first.seqs, (std::vector<SequencePtr>{a, other}));
  const auto a_blocks = first.batch.seqs[0].block_table;
  post(sampled(true, {a, other}));
  auto second = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(second.seqs, (std::vector<SequencePtr>{b, c, a, other}));
  for (int i = 0; i < 2; ++i) {
    const SequenceChunk& chunk = second.batch.seqs[size_t(i)];
    EXPECT_EQ(chunk.start_pos, 32);
    EXPECT_EQ(chunk.block_table[0], a_blocks[0]);
    EXPECT_EQ(chunk.block_table[1], a_blocks[1]);
  }
  EXPECT_EQ(metrics().prefix_cache_hit_tokens.value(), 64u);
}

TEST_F(SchedulerTest, WithoutPrefixCachingEqualPromptsAreAdmittedTogether) {
  start(2048, /*prefix_caching=*/false, /*max_batch=*/2, /*window_ms=*/60000);
  submit(40);
  submit(40);
  EXPECT_EQ(std::get<PrefillBatch>(next_batch()).seqs.size(), 2u);
}

TEST_F(SchedulerTest, APromptEqualToOneBeingPrefilledInChunksWaitsForItsBlocks) {
  // The first copy is prefilled 24 tokens a pass; the second, arriving meanwhile, would compute
  // the block the first finishes next: it waits, and starts from both of the first's blocks.
  start(/*max_prefill_tokens=*/24);
  const SequencePtr a = submit(40);
  auto pass1 = std::get<PrefillBatch>(next_batch());
  const SequencePtr b = submit(40);
  StepResult chunk_only;  // a's first chunk: nothing sampled
  chunk_only.prefill = true;
  post(std::move(chunk_only));
  auto pass2 = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(pass2.seqs, (std::vector<SequencePtr>{a}));
  const auto a_blocks = pass2.batch.seqs[0].block_table;
  post(sampled(true, {a}));
  auto pass3 = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(pass3.seqs, (std::vector<SequencePtr>{b, a}));
  EXPECT_EQ(pass3.batch.seqs[0].start_pos, 32);
  EXPECT_EQ(pass3.batch.seqs[0].block_table[0], a_blocks[0]);
  EXPECT_EQ(pass3.batch.seqs[0].block_table[1], a_blocks[1]);
}

TEST_F(SchedulerTest, PromptsToScoreReturnAtMostTheRowsAPassAllows) {
  // Two prompts of 300 tokens to score: 600 logits rows, more than one pass returns, though the
  // prompt-token budget (2048) would take both whole. The second gets what is left and finishes
  // in the next pass, scored. (A batch of two: both arrive before the window closes.)
  start(2048, true, /*max_batch=*/2, /*window_ms=*/60000);
  const SequencePtr a = submit(300, 10, /*score_prompt=*/true);
  const SequencePtr b = submit(300, 400, /*score_prompt=*/true);
  auto first = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(first.seqs, (std::vector<SequencePtr>{a, b}));
  EXPECT_EQ(first.batch.seqs[0].tokens.size(), 300u);
  EXPECT_EQ(first.batch.seqs[1].tokens.size(), size_t(Scheduler::kMaxScoredRows - 300));
  EXPECT_EQ(first.batch.logit_rows(), Scheduler::kMaxScoredRows);
  post(sampled(true, {a}));
  auto second = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(second.seqs, (std::vector<SequencePtr>{b, a}));
  EXPECT_EQ(second.batch.seqs[0].start_pos, Scheduler::kMaxScoredRows - 300);
  EXPECT_TRUE(second.batch.seqs[0].all_logits);
}

TEST_F(SchedulerTest, AScoredPromptsCopiesOfCachedBlocksGiveWayToThem) {
  // A prompt to score computes every block (the cache has no logits), even those an equal prompt
  // computes in the same pass; once computed, it takes the registered blocks and frees its own,
  // so that the blocks it computes after them chain to the cache too.
  start(2048, true, /*max_batch=*/2, /*window_ms=*/60000);
  const SequencePtr a = submit(40);
  const SequencePtr b = submit(40, 10, /*score_prompt=*/true);
  auto both = std::get<PrefillBatch>(next_batch());
  ASSERT_EQ(both.seqs, (std::vector<SequencePtr>{a, b}));
  const auto a_blocks = both.batch.seqs[0].block_table;
  EXPECT_EQ(both.batch.seqs[1].start_pos, 0);
  EXPECT_TRUE(both.batch.seqs[1].all_logits);
  EXPECT_NE(both.batch.seqs[1].block_table[0], a_blocks[0]);
  post(sampled(true, {a, b}));
  auto step = std::get<DecodeBatch>(next_batch());
  ASSERT_EQ(step.seqs, (std::vector<SequencePtr>{a, b}));
  const auto& b_table = step.batch.seqs[1].block_table;
  EXPECT_EQ(b_table[0], a_blocks[0]);
  EXPECT_EQ(b_table[1], a_blocks[1]);
  EXPECT_NE(b_table[2], a_blocks[2]) << "the partial block stays its own";
  EXPECT_FALSE(step.batch.seqs[1].all_logits) << "its prompt is scored";
}

}  // namespace
}  // namespace pipeline
