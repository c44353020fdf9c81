// The scheduling policy without a model: windows, admission limits, continuous batching and
// preemption, as a pure function of (waiting, running, free blocks, limits, now).
#include <gtest/gtest.h>

#include "graph/scheduler_policy.h"

namespace pipeline {
namespace {

using std::chrono::milliseconds;
using Ids = std::vector<uint64_t>;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1);

SchedulerLimits limits(int window_ms = 200, int max_batch = 16, int max_num_seqs = 64,
                       int block_size = 16) {
  return {milliseconds(window_ms), max_batch, max_num_seqs, block_size};
}

std::vector<WaitingSequence> waiting(int n, int tokens, Clock::time_point queued,
                                     uint64_t first = 1) {
  std::vector<WaitingSequence> out;
  for (int i = 0; i < n; ++i) out.push_back({first + i, tokens, queued});
  return out;
}

TEST(SchedulerPolicy, WaitsForTheWindowThenPrefillsEveryoneWaiting) {
  const auto w = waiting(3, 10, kT0);
  const auto early = schedule(w, {}, 100, limits(200), kT0 + milliseconds(50));
  EXPECT_TRUE(early.idle());
  ASSERT_TRUE(early.wake_at.has_value());
  EXPECT_EQ(*early.wake_at, kT0 + milliseconds(200));

  const auto late = schedule(w, {}, 100, limits(200), kT0 + milliseconds(200));
  EXPECT_EQ(late.prefill, (Ids{1, 2, 3}));
  EXPECT_TRUE(late.decode.empty());
}

TEST(SchedulerPolicy, ZeroWindowPrefillsAtOnce) {
  const auto d = schedule(waiting(1, 10, kT0), {}, 100, limits(0), kT0);
  EXPECT_EQ(d.prefill, (Ids{1}));
}

TEST(SchedulerPolicy, AFullBatchEndsTheWindowEarly) {
  const auto d = schedule(waiting(4, 10, kT0), {}, 100, limits(200, 4), kT0);
  EXPECT_EQ(d.prefill, (Ids{1, 2, 3, 4}));
  // More than max_batch waiting: the first max_batch go now.
  const auto d6 = schedule(waiting(6, 10, kT0), {}, 100, limits(200, 4), kT0);
  EXPECT_EQ(d6.prefill, (Ids{1, 2, 3, 4}));
}

TEST(SchedulerPolicy, AdmissionStopsAtMaxNumSeqs) {
  const std::vector<RunningSequence> running = {{10, 20, 2}, {11, 20, 2}};
  const auto d = schedule(waiting(3, 10, kT0), running, 100, limits(0, 16, 3), kT0);
  EXPECT_EQ(d.prefill, (Ids{1}));
}

TEST(SchedulerPolicy, AdmissionNeedsBlocksForThePromptAndItsFirstToken) {
  // 16 tokens + 1 decoded = 2 blocks of 16; with 3 free only the first fits.
  const auto d = schedule(waiting(2, 16, kT0), {}, 3, limits(0), kT0);
  EXPECT_EQ(d.prefill, (Ids{1}));
  // The head of the queue blocks the rest even when a later one would fit.
  std::vector<WaitingSequence> w = {{1, 100, kT0}, {2, 1, kT0}};
  const auto blocked = schedule(w, {}, 3, limits(0), kT0);
  EXPECT_TRUE(blocked.prefill.empty());
}

TEST(SchedulerPolicy, AdmissionLeavesRoomForTheRunningSequencesNextStep) {
  // Running sequence at 32 positions with 1 block needs 1 more; 2 free leaves 1 for newcomers.
  const std::vector<RunningSequence> running = {{10, 32, 1}};
  const auto d = schedule(waiting(1, 20, kT0), running, 2, limits(0), kT0);
  EXPECT_TRUE(d.prefill.empty());
  EXPECT_EQ(d.decode, (Ids{10}));
}

TEST(SchedulerPolicy, ContinuousBatchingDecodesWhileNewcomersWaitTheirWindow) {
  const std::vector<RunningSequence> running = {{10, 30, 2}, {11, 40, 3}};
  const auto during =
      schedule(waiting(1, 5, kT0), running, 100, limits(200), kT0 + milliseconds(10));
  EXPECT_TRUE(during.prefill.empty());
  EXPECT_EQ(during.decode, (Ids{10, 11}));
  // Once the window is over the newcomer is prefilled; it decodes with the others after.
  const auto after =
      schedule(waiting(1, 5, kT0), running, 100, limits(200), kT0 + milliseconds(200));
  EXPECT_EQ(after.prefill, (Ids{1}));
  EXPECT_TRUE(after.decode.empty());
}

TEST(SchedulerPolicy, PreemptsTheNewestWhenBlocksRunOut) {
  // Three sequences each at a block boundary (need one new block), one block free.
  const std::vector<RunningSequence> running = {{1, 33, 2}, {2, 33, 2}, {3, 33, 2}};
  const auto d = schedule({}, running, 1, limits(0), kT0);
  // Preempting 3 frees 2 blocks: 3 available, 2 needed.
  EXPECT_EQ(d.preempt, (Ids{3}));
  EXPECT_EQ(d.decode, (Ids{1, 2}));
}

TEST(SchedulerPolicy, PreemptsNewestFirstUntilTheRestFit) {
  const std::vector<RunningSequence> running = {{5, 17, 1}, {9, 17, 1}, {7, 17, 1}};
  const auto d = schedule({}, running, 0, limits(0), kT0);
  EXPECT_EQ(d.preempt, (Ids{9, 7}));
  EXPECT_EQ(d.decode, (Ids{5}));
}

TEST(SchedulerPolicy, NeverPreemptsTheLastSequence) {
  const std::vector<RunningSequence> running = {{1, 17, 1}};
  const auto d = schedule({}, running, 0, limits(0), kT0);
  EXPECT_TRUE(d.preempt.empty());
  EXPECT_EQ(d.decode, (Ids{1}));
}

TEST(SchedulerPolicy, NoPreemptionWhileBlocksSuffice) {
  const std::vector<RunningSequence> running = {{1, 17, 1}, {2, 10, 1}};
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
