// The scheduling policy as a pure function, testable without a model: given the waiting
// queue, the running sequences, the free KV blocks and the limits, choose the next forward
// pass. Each step is either a prefill (new or preempted sequences join) or a decode (every
// running sequence advances one token).
//
//  - Window: waiting sequences are prefilled once the oldest has waited window_ms, or as
//    soon as max_batch of them wait.
//  - Admission in arrival order (the head blocks the rest, so nobody starves) while
//    max_batch, max_num_seqs and free blocks allow. A sequence is admitted only when the
//    blocks for its tokens plus its first decoded token fit beside what the running
//    sequences need for their next step.
//  - Continuous batching: a prefill step takes priority; the sequences it admits decode with
//    the others from the next step on.
//  - Preemption: when the running sequences need more new blocks than are free, the newest
//    are preempted (their blocks freed, they return to the front of the waiting queue to be
//    recomputed) until the rest fit. The oldest is never preempted: every single sequence fits
//    the pool by itself (tokenize caps max_tokens so).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace pipeline {

using Clock = std::chrono::steady_clock;

struct SchedulerLimits {
  std::chrono::milliseconds window{200};
  int max_batch = 16;
  int max_num_seqs = 64;
  int block_size = 16;
};

struct WaitingSequence {
  uint64_t id = 0;
  int tokens = 0;            // tokens its prefill computes (prompt, plus any generated before)
  Clock::time_point queued;  // arrival (a preempted sequence keeps its own)
};

struct RunningSequence {
  uint64_t id = 0;  // arrival order: larger is newer
  int tokens = 0;   // positions its next decode step covers
  int blocks = 0;   // blocks it holds
};

struct SchedulerDecision {
  std::vector<uint64_t> prefill;  // in waiting order
  std::vector<uint64_t> decode;   // in running order
  std::vector<uint64_t> preempt;  // newest first
  // Nothing to run now: when the window of the oldest waiting sequence ends (unset: wait for
  // an event).
  std::optional<Clock::time_point> wake_at;

  bool idle() const { return prefill.empty() && decode.empty(); }
};

SchedulerDecision schedule(const std::vector<WaitingSequence>& waiting,
                           const std::vector<RunningSequence>& running, int free_blocks,
                           const SchedulerLimits& limits, Clock::time_point now);

}  // namespace pipeline
