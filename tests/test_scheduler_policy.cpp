// The scheduling policy without a model: windows, admission limits, continuous batching, chunked
// prefill and preemption, as a pure function of (waiting, running, free blocks, limits, now).
#include <gtest/gtest.h>

#include <ostream>

#include "graph/scheduler_policy.h"

namespace pipeline {

// Failures print chunks as {id, tokens}.
void PrintTo(const PromptChunk& chunk, std::ostream* os) {
  *os << "{" << chunk.id << ", " << chunk.tokens << "}";
}

namespace {

using std::chrono::milliseconds;
using Ids = std::vector<uint64_t>;
using Chunks = std::vector<PromptChunk>;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1);

SchedulerLimits limits(int window_ms = 200, int max_batch = 16, int max_num_seqs = 64,
                       int block_size = 16, int max_prefill_tokens = 2048) {
  return {milliseconds(window_ms), max_batch, max_num_seqs, block_size, max_prefill_tokens};
}

std::vector<WaitingSequence> waiting(int n, int tokens, Clock::time_point queued,
                                     uint64_t first = 1) {
  std::vector<WaitingSequence> out;
  for (int i = 0; i < n; ++i) out.push_back({first + i, tokens, queued});
  return out;
}

// A running sequence whose next step decodes the token at position tokens - 1.
RunningSequence decoding(uint64_t id, int tokens, int blocks) {
  return {id, tokens, 0, blocks, blocks};
}

// A running sequence with `prompt_left` of its `tokens` prompt tokens still to compute.
RunningSequence prefilling(uint64_t id, int tokens, int prompt_left, int blocks) {
  return {id, tokens, prompt_left, blocks, blocks};
}

TEST(SchedulerPolicy, WaitsForTheWindowThenAdmitsEveryoneWaiting) {
  const auto w = waiting(3, 10, kT0);
  const auto early = schedule(w, {}, 100, limits(200), kT0 + milliseconds(50));
  EXPECT_TRUE(early.idle());
  ASSERT_TRUE(early.wake_at.has_value());
  EXPECT_EQ(*early.wake_at, kT0 + milliseconds(200));

  const auto late = schedule(w, {}, 100, limits(200), kT0 + milliseconds(200));
  EXPECT_EQ(late.admitted, (Chunks{{1, 10}, {2, 10}, {3, 10}}));
  EXPECT_TRUE(late.decode.empty());
  EXPECT_TRUE(late.prefill.empty());
}

TEST(SchedulerPolicy, ZeroWindowAdmitsAtOnce) {
  const auto d = schedule(waiting(1, 10, kT0), {}, 100, limits(0), kT0);
  EXPECT_EQ(d.admitted, (Chunks{{1, 10}}));
}

TEST(SchedulerPolicy, AFullBatchEndsTheWindowEarly) {
  const auto d = schedule(waiting(4, 10, kT0), {}, 100, limits(200, 4), kT0);
  EXPECT_EQ(d.admitted.size(), 4u);
  // More than max_batch waiting: the first max_batch go now.
  const auto d6 = schedule(waiting(6, 10, kT0), {}, 100, limits(200, 4), kT0);
  EXPECT_EQ(d6.admitted, (Chunks{{1, 10}, {2, 10}, {3, 10}, {4, 10}}));
}

TEST(SchedulerPolicy, AdmissionStopsAtMaxNumSeqs) {
  const std::vector<RunningSequence> running = {decoding(10, 20, 2), decoding(11, 20, 2)};
  const auto d = schedule(waiting(3, 10, kT0), running, 100, limits(0, 16, 3), kT0);
  EXPECT_EQ(d.admitted, (Chunks{{1, 10}}));
}

TEST(SchedulerPolicy, AdmissionNeedsBlocksForThePromptAndItsFirstToken) {
  // 16 tokens + 1 decoded = 2 blocks of 16; with 3 free only the first fits.
  const auto d = schedule(waiting(2, 16, kT0), {}, 3, limits(0), kT0);
  EXPECT_EQ(d.admitted, (Chunks{{1, 16}}));
  // The head of the queue blocks the rest even when a later one would fit.
  std::vector<WaitingSequence> w = {{1, 100, kT0}, {2, 1, kT0}};
  const auto blocked = schedule(w, {}, 3, limits(0), kT0);
  EXPECT_TRUE(blocked.admitted.empty());
}

// A prompt-only answer (echo with max_tokens 0) ends with its prefill: its prompt may fill the
// whole pool, with no block for a first decoded token, which it never computes.
TEST(SchedulerPolicy, APromptOnlyAnswerNeedsBlocksForItsPromptAlone) {
  std::vector<WaitingSequence> w = waiting(1, 32, kT0);
  w[0].decodes = false;
  const auto d = schedule(w, {}, 2, limits(0), kT0);
  EXPECT_EQ(d.admitted, (Chunks{{1, 32}}));
}

TEST(SchedulerPolicy, AdmissionLeavesRoomForTheRunningSequencesNextStep) {
  // Running sequence at 32 positions with 1 block needs 1 more; 2 free leaves 1 for newcomers.
  const std::vector<RunningSequence> running = {decoding(10, 32, 1)};
  const auto d = schedule(waiting(1, 20, kT0), running, 2, limits(0), kT0);
  EXPECT_TRUE(d.admitted.empty());
  EXPECT_EQ(d.decode, (Ids{10}));
}

TEST(SchedulerPolicy, RunningSequencesDecodeWhileNewcomersWaitAndAlongsideTheirPrefill) {
  const std::vector<RunningSequence> running = {decoding(10, 30, 2), decoding(11, 40, 3)};
  const auto during =
      schedule(waiting(1, 5, kT0), running, 100, limits(200), kT0 + milliseconds(10));
  EXPECT_FALSE(during.computes_prompts());
  EXPECT_EQ(during.decode, (Ids{10, 11}));
  // Once the window is over the newcomer is prefilled in the same pass as their tokens.
  const auto after =
      schedule(waiting(1, 5, kT0), running, 100, limits(200), kT0 + milliseconds(200));
  EXPECT_EQ(after.admitted, (Chunks{{1, 5}}));
  EXPECT_EQ(after.decode, (Ids{10, 11}));
}

TEST(SchedulerPolicy, ALongPromptIsPrefilledInChunksOfTheBudget) {
  const SchedulerLimits l = limits(0, 16, 64, 16, 32);
  const auto first = schedule(waiting(1, 100, kT0), {}, 100, l, kT0);
  EXPECT_EQ(first.admitted, (Chunks{{1, 32}}));
  // Admitted with blocks for all 100 tokens; each pass computes the next 32, then the rest.
  for (int left : {68, 36}) {
    const auto next = schedule({}, {prefilling(1, 100, left, 7)}, 0, l, kT0);
    EXPECT_EQ(next.prefill, (Chunks{{1, 32}}));
    EXPECT_TRUE(next.preempt.empty()) << "an unfinished prompt already holds its blocks";
  }
  const auto last = schedule({}, {prefilling(1, 100, 4, 7)}, 0, l, kT0);
  EXPECT_EQ(last.prefill, (Chunks{{1, 4}}));
  EXPECT_TRUE(last.decode.empty());
  // One token left is still a prompt chunk, not a decode step.
  const auto one = schedule({}, {prefilling(1, 100, 1, 7)}, 0, l, kT0);
  EXPECT_EQ(one.prefill, (Chunks{{1, 1}}));
  EXPECT_TRUE(one.decode.empty());
  // Its first token sampled, it decodes.
  const auto decode = schedule({}, {decoding(1, 101, 7)}, 1, l, kT0);
  EXPECT_FALSE(decode.computes_prompts());
  EXPECT_EQ(decode.decode, (Ids{1}));
}

TEST(SchedulerPolicy, NewcomersShareTheBudgetInArrivalOrder) {
  const auto d = schedule(waiting(4, 20, kT0), {}, 100, limits(0, 16, 64, 16, 50), kT0);
  EXPECT_EQ(d.admitted, (Chunks{{1, 20}, {2, 20}, {3, 10}})) << "the fourth waits";
}

TEST(SchedulerPolicy, ThoseAClosedWindowLeftForLackOfBudgetGoWithoutWaitingAgain) {
  // Four arrive together and fill max_batch; the budget takes the first two.
  const SchedulerLimits l = limits(200, 4, 64, 16, 40);
  const auto first = schedule(waiting(4, 20, kT0), {}, 100, l, kT0);
  EXPECT_EQ(first.admitted, (Chunks{{1, 20}, {2, 20}}));
  EXPECT_TRUE(first.window_closed);
  // The two left are marked so; a newcomer behind them is admitted with them.
  std::vector<WaitingSequence> left = waiting(2, 20, kT0, 3);
  for (auto& w : left) w.window_closed = true;
  left.push_back({5, 20, kT0 + milliseconds(5)});
  const auto next =
      schedule(left, {decoding(1, 21, 2), decoding(2, 21, 2)}, 100, l, kT0 + milliseconds(10));
  EXPECT_EQ(next.admitted, (Chunks{{3, 20}, {4, 20}}));
  EXPECT_EQ(next.decode, (Ids{1, 2}));
  // Without the mark they would wait for a window of their own.
  const auto unmarked =
      schedule(waiting(2, 20, kT0, 3), {decoding(1, 21, 2)}, 100, l, kT0 + milliseconds(10));
  EXPECT_TRUE(unmarked.admitted.empty());
  EXPECT_FALSE(unmarked.window_closed);
}

TEST(SchedulerPolicy, UnfinishedPromptsComeFirstAndDecodingSequencesRideAlong) {
  const std::vector<RunningSequence> running = {decoding(1, 50, 4), prefilling(3, 100, 60, 7),
                                                prefilling(2, 90, 80, 6), decoding(4, 20, 2)};
  const auto d = schedule(waiting(1, 10, kT0, 5), running, 100, limits(0, 16, 64, 16, 100), kT0);
  EXPECT_EQ(d.prefill, (Chunks{{2, 80}, {3, 20}})) << "oldest first, within the budget";
  EXPECT_TRUE(d.admitted.empty()) << "no budget left";
  EXPECT_EQ(d.decode, (Ids{1, 4}));
}

TEST(SchedulerPolicy, APromptOfSeveralChunksWaitsForRoomForTheDecodersToGrow) {
  // Four decoders each fill their 2 blocks this pass (32 positions) and need a third within the
  // next pass. A 100-token prompt at 32 a pass leaves 68 tokens, 3 more passes: it needs its own
  // 7 blocks and 4 for the decoders' growth meanwhile.
  const std::vector<RunningSequence> running = {decoding(1, 32, 2), decoding(2, 32, 2),
                                                decoding(3, 32, 2), decoding(4, 32, 2)};
  const SchedulerLimits chunked = limits(0, 16, 64, 16, 32);
  EXPECT_TRUE(schedule(waiting(1, 100, kT0, 5), running, 10, chunked, kT0).admitted.empty());
  EXPECT_EQ(schedule(waiting(1, 100, kT0, 5), running, 11, chunked, kT0).admitted,
            (Chunks{{5, 32}}));
  // In one pass it needs only its own blocks, as before chunked prefill.
  EXPECT_EQ(schedule(waiting(1, 100, kT0, 5), running, 7, limits(0), kT0).admitted,
            (Chunks{{5, 100}}));
  // Two newcomers at 120 a pass: the first (100 tokens, 7 blocks) is done in this pass; the
  // second (50 tokens, 4 blocks) gets 20 and needs one more pass, for which the decoders need
  // their 4 blocks.
  const std::vector<WaitingSequence> two = {{5, 100, kT0}, {6, 50, kT0}};
  const SchedulerLimits wider = limits(0, 16, 64, 16, 120);
  EXPECT_EQ(schedule(two, running, 7 + 4 + 3, wider, kT0).admitted, (Chunks{{5, 100}}));
  EXPECT_EQ(schedule(two, running, 7 + 4 + 4, wider, kT0).admitted, (Chunks{{5, 100}, {6, 20}}));
}

TEST(SchedulerPolicy, PromptsThatFinishInThisPassCountAmongTheDecodersThatGrow) {
  // A running prompt (32 tokens, 2 blocks) finishes in this pass and decodes during the 3 passes
  // a 100-token newcomer at 32 a pass needs after this one: a third block meanwhile.
  const std::vector<RunningSequence> running = {prefilling(1, 32, 10, 2)};
  const SchedulerLimits chunked = limits(0, 16, 64, 16, 32);
  EXPECT_TRUE(schedule(waiting(1, 100, kT0, 5), running, 7, chunked, kT0).admitted.empty());
  EXPECT_EQ(schedule(waiting(1, 100, kT0, 5), running, 8, chunked, kT0).admitted,
            (Chunks{{5, 22}}));
  // So does a newcomer admitted whole before one with chunks left: 31 tokens (2 blocks with its
  // first decoded token) reach a third block in the 2 passes the 100-token one needs after this.
  const std::vector<WaitingSequence> two = {{5, 31, kT0}, {6, 100, kT0}};
  const SchedulerLimits wider = limits(0, 16, 64, 16, 64);
  EXPECT_EQ(schedule(two, {}, 2 + 7, wider, kT0).admitted, (Chunks{{5, 31}}));
  EXPECT_EQ(schedule(two, {}, 2 + 7 + 1, wider, kT0).admitted, (Chunks{{5, 31}, {6, 33}}));
  // Its first decoded token's block is counted once: 30 tokens reach 32 positions in those two
  // passes, all in the 2 blocks its own need counts.
  const std::vector<WaitingSequence> thirty = {{5, 30, kT0}, {6, 100, kT0}};
  EXPECT_EQ(schedule(thirty, {}, 2 + 7, wider, kT0).admitted, (Chunks{{5, 30}, {6, 34}}));
}

TEST(SchedulerPolicy, CachedTokensAreNotComputedAndCachedBlocksInUseCostNothing) {
  // 100 tokens, the first 64 in the prefix cache: only 36 are computed, in a smaller chunk.
  WaitingSequence w{5, 100, kT0, false, 64, 0};
  EXPECT_EQ(schedule({w}, {}, 7, limits(0, 16, 64, 16, 40), kT0).admitted, (Chunks{{5, 36}}));
  EXPECT_EQ(schedule({w}, {}, 7, limits(0, 16, 64, 16, 20), kT0).admitted, (Chunks{{5, 20}}));
  // 7 blocks for its 101 positions; evictable cached blocks are taken from the free ones...
  EXPECT_TRUE(schedule({w}, {}, 6, limits(0), kT0).admitted.empty());
  // ...but the 4 that running sequences hold are shared, not taken.
  w.cached_in_use = 4;
  EXPECT_EQ(schedule({w}, {}, 3, limits(0), kT0).admitted, (Chunks{{5, 36}}));
  EXPECT_TRUE(schedule({w}, {}, 2, limits(0), kT0).admitted.empty());
}

TEST(SchedulerPolicy, AFollowerIsPassedOverAndThoseBehindItAreNot) {
  // 6 follows 5 (it would compute the block 5 computes): it waits for the cache, takes no
  // budget or blocks, and 7 behind it is admitted.
  WaitingSequence follower{6, 40, kT0};
  follower.follows = true;
  const std::vector<WaitingSequence> waiting = {{5, 40, kT0}, follower, {7, 40, kT0}};
  EXPECT_EQ(schedule(waiting, {}, 6, limits(0), kT0).admitted, (Chunks{{5, 40}, {7, 40}}));
}

TEST(SchedulerPolicy, PreemptionCountsOnlyTheBlocksItFrees) {
  // Four decoders share a 5-block cached prefix and each holds one full block of its own, so each
  // needs a new block and none is free. Preempting one frees its own block, not its 6.
  std::vector<RunningSequence> running;
  for (uint64_t id = 1; id <= 4; ++id) {
    RunningSequence s = decoding(id, 6 * 16 + 1, 6);
    s.own_blocks = 1;
    running.push_back(s);
  }
  const auto d = schedule({}, running, 0, limits(0), kT0);
  EXPECT_EQ(d.preempt, (Ids{4, 3}));  // two freed blocks for the two that stay
  EXPECT_EQ(d.decode, (Ids{1, 2}));
  // Counting their whole tables, one preemption would have seemed to make room for all three.
  for (auto& s : running) s.own_blocks = s.blocks;
  EXPECT_EQ(schedule({}, running, 0, limits(0), kT0).preempt, (Ids{4}));
}

TEST(SchedulerPolicy, NobodyIsAdmittedInAPassThatPreempts) {
  const std::vector<RunningSequence> running = {decoding(1, 33, 2), decoding(2, 33, 2)};
  const auto d = schedule(waiting(1, 1, kT0, 3), running, 1, limits(0), kT0);
  EXPECT_EQ(d.preempt, (Ids{2}));
  EXPECT_TRUE(d.admitted.empty());
  EXPECT_EQ(d.decode, (Ids{1}));
}

TEST(SchedulerPolicy, AnUnfinishedPromptIsPreemptedLikeAnyNewerSequence) {
  const std::vector<RunningSequence> running = {decoding(1, 33, 2), prefilling(2, 100, 68, 7)};
  const auto d = schedule({}, running, 0, limits(0), kT0);
  EXPECT_EQ(d.preempt, (Ids{2}));
  EXPECT_TRUE(d.prefill.empty());
  EXPECT_EQ(d.decode, (Ids{1}));
}

TEST(SchedulerPolicy, PreemptsTheNewestWhenBlocksRunOut) {
  // Three sequences each at a block boundary (need one new block), one block free.
  const std::vector<RunningSequence> running = {decoding(1, 33, 2), decoding(2, 33, 2),
                                                decoding(3, 33, 2)};
  const auto d = schedule({}, running, 1, limits(0), kT0);
  // Preempting 3 frees 2 blocks: 3 available, 2 needed.
  EXPECT_EQ(d.preempt, (Ids{3}));
  EXPECT_EQ(d.decode, (Ids{1, 2}));
}

TEST(SchedulerPolicy, PreemptsNewestFirstUntilTheRestFit) {
  const std::vector<RunningSequence> running = {decoding(5, 17, 1), decoding(9, 17, 1),
                                                decoding(7, 17, 1)};
  const auto d = schedule({}, running, 0, limits(0), kT0);
  EXPECT_EQ(d.preempt, (Ids{9, 7}));
  EXPECT_EQ(d.decode, (Ids{5}));
}

TEST(SchedulerPolicy, NeverPreemptsTheLastSequence) {
  const auto d = schedule({}, {decoding(1, 17, 1)}, 0, limits(0), kT0);
  EXPECT_TRUE(d.preempt.empty());
  EXPECT_EQ(d.decode, (Ids{1}));
}

// scheduler.policy priority: the lowest priority goes first, however old, and the highest
// priority is never preempted.
TEST(SchedulerPolicy, PreemptsTheLowestPriorityFirstThenTheNewest) {
  auto with_priority = [](RunningSequence s, int priority) {
    s.priority = priority;
    return s;
  };
  const std::vector<RunningSequence> running = {
      with_priority(decoding(1, 17, 1), 5), with_priority(decoding(2, 17, 1), 0),
      with_priority(decoding(3, 17, 1), 5), with_priority(decoding(4, 17, 1), -1)};
  // Each needs a block and frees one: two preempted leave the two others room.
  const auto d = schedule({}, running, 0, limits(0), kT0);
  EXPECT_EQ(d.preempt, (Ids{3, 1}));
  EXPECT_EQ(d.decode, (Ids{2, 4}));
  // With none free and one held each but two needed each, all but the first in order go.
  const std::vector<RunningSequence> hungry = {
      with_priority(decoding(1, 33, 1), 5), with_priority(decoding(2, 33, 1), 0),
      with_priority(decoding(3, 33, 1), 5), with_priority(decoding(4, 33, 1), -1)};
  EXPECT_EQ(schedule({}, hungry, 0, limits(0), kT0).preempt, (Ids{3, 1, 2}));
}

TEST(SchedulerPolicy, UnfinishedPromptsGetTheBudgetInPriorityOrder) {
  RunningSequence old_low = prefilling(1, 100, 60, 7);
  old_low.priority = 1;
  const std::vector<RunningSequence> running = {old_low, prefilling(2, 100, 60, 7)};
  const auto d = schedule({}, running, 100, limits(0, 16, 64, 16, 80), kT0);
  EXPECT_EQ(d.prefill, (Chunks{{2, 60}, {1, 20}}));
}

// The queue is in priority order, so its head may be a newcomer: the window is the
// longest-waiting sequence's, and a sequence a closed window left anywhere in it ends it.
TEST(SchedulerPolicy, TheWindowIsTheLongestWaitingSequencesWhateverItsPlace) {
  std::vector<WaitingSequence> w = {{2, 10, kT0 + milliseconds(150)}, {1, 10, kT0}};
  w[0].priority = -1;
  const auto early = schedule(w, {}, 100, limits(200), kT0 + milliseconds(160));
  ASSERT_TRUE(early.wake_at.has_value());
  EXPECT_EQ(*early.wake_at, kT0 + milliseconds(200));
  const auto over = schedule(w, {}, 100, limits(200), kT0 + milliseconds(200));
  EXPECT_EQ(over.admitted, (Chunks{{2, 10}, {1, 10}}));
  w[1].window_closed = true;
  EXPECT_EQ(schedule(w, {}, 100, limits(200), kT0 + milliseconds(160)).admitted.size(), 2u);
}

TEST(SchedulerPolicy, NoPreemptionWhileBlocksSuffice) {
  const std::vector<RunningSequence> running = {decoding(1, 17, 1), decoding(2, 10, 1)};
  const auto d = schedule({}, running, 1, limits(0), kT0);
  EXPECT_TRUE(d.preempt.empty());
  EXPECT_EQ(d.decode, (Ids{1, 2}));
}

TEST(SchedulerPolicy, IdleWithNothingToDo) {
  const auto d = schedule({}, {}, 10, limits(), kT0);
  EXPECT_TRUE(d.idle());
  EXPECT_FALSE(d.wake_at.has_value());
}

}  // namespace
}  // namespace pipeline
