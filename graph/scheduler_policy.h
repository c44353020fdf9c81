// The scheduling policy as a pure function, testable without a model: given the waiting
// queue, the running sequences, the free KV blocks and the limits, choose the next forward
// pass. Every running sequence advances in every pass: one that is decoding by one token, one
// whose prompt is unfinished by its next chunk of prompt tokens; waiting sequences join it.
//
//  - Window: waiting sequences are admitted once the oldest has waited window_ms, or as
//    soon as max_batch of them wait; those a closed window leaves waiting (for lack of blocks,
//    places or prompt-token budget) go as soon as there is room.
//  - Order: by priority (vLLM's: lower first; every request has 0 unless scheduler.policy is
//    priority), then arrival. The waiting queue is kept in this order, and "first" and "last"
//    below follow it.
//  - Admission in queue order (the head blocks the rest, so nobody of its priority starves) while
//    max_batch, max_num_seqs, free blocks and the pass's prompt-token budget allow. A sequence
//    is admitted only when the blocks for its tokens plus its first decoded token if any (less the
//    cached ones that running sequences hold already) fit beside what the running sequences need
//    for their next step, and, while prompts are being
//    prefilled in chunks, for the decoding sequences' growth until the last chunk.
//  - Prefix cache: a newcomer's cached first tokens are not computed again; its prefill, and
//    the budget it takes, starts after them. A newcomer that follows another sequence (the next
//    block it would compute is one an earlier newcomer or a running prefill computes, as for the
//    n choices of a call) is passed over until that block is cached, and the ones after it are
//    not held back.
//  - Chunked prefill: a pass computes at most max_prefill_tokens prompt tokens, unfinished
//    prompts first (in order), then the newcomers'; the last prompt to get tokens may get
//    only its first part and continues in the next pass. The decoding sequences' tokens ride
//    along every pass, so a long prompt never stalls the running streams for more than one
//    chunk.
//  - Preemption: when the running sequences need more new blocks than are free, the last in
//    order (the newest of the lowest priority) are preempted (their own blocks freed, a cached
//    prefix they share staying with the others; they return to the front of their priority in
//    the waiting queue to be recomputed) until the rest fit, and nobody is admitted in that
//    pass. The first is never preempted: every single sequence fits the pool by itself
//    (tokenize caps max_tokens so).
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
  int max_prefill_tokens = 2048;
};

struct WaitingSequence {
  uint64_t id = 0;
  int tokens = 0;              // tokens its prefill covers (prompt, plus any generated before)
  Clock::time_point queued;    // arrival (a preempted sequence keeps its own)
  bool window_closed = false;  // a window already closed over it (it was left for lack of room)
  int cached = 0;              // of its tokens, the first ones the prefix cache holds
  int cached_in_use = 0;       // blocks of those held by running sequences (not free)
  // Its next block is one an earlier newcomer or a running prefill computes: it waits for the
  // cache instead.
  bool follows = false;
  int priority = 0;  // lower goes first
  // A token is decoded after its prompt, at a position of its own; not for a prompt-only answer
  // (echo with max_tokens 0), which ends with its prefill, so its prompt may fill the pool.
  bool decodes = true;
};

struct RunningSequence {
  uint64_t id = 0;      // arrival order: larger is newer
  int tokens = 0;       // positions its next step reaches once its prompt is computed
  int prompt_left = 0;  // prompt tokens still to compute; 0: it decodes
  int blocks = 0;       // blocks it holds
  int own_blocks = 0;   // of those, the ones no other sequence holds: what preempting it frees
  int priority = 0;     // lower goes first
  bool decoding() const { return prompt_left == 0; }
};

// Prompt tokens of one sequence that a pass computes: positions [computed, computed + tokens).
struct PromptChunk {
  uint64_t id = 0;
  int tokens = 0;
  bool operator==(const PromptChunk&) const = default;
};

struct SchedulerDecision {
  std::vector<PromptChunk> prefill;   // running sequences' unfinished prompts, in order
  std::vector<PromptChunk> admitted;  // waiting sequences that start now, in waiting order
  std::vector<uint64_t> decode;       // running sequences that decode a token, in running order
  std::vector<uint64_t> preempt;      // the last in order first
  // The window closed in this pass: the sequences still waiting after it were all waiting when
  // it did, and are admitted as soon as there is room, without waiting for another window.
  bool window_closed = false;
  // Nothing to run now: when the window of the longest-waiting sequence ends (unset: wait for
  // an event).
  std::optional<Clock::time_point> wake_at;

  bool computes_prompts() const { return !prefill.empty() || !admitted.empty(); }
  bool idle() const { return !computes_prompts() && decode.empty(); }
};

// Whether `a` goes before `b`: lower priority value, then earlier arrival.
inline bool goes_before(const RunningSequence& a, const RunningSequence& b) {
  return a.priority != b.priority ? a.priority < b.priority : a.id < b.id;
}

// Whether the waiting sequences may be admitted now (the window rule above).
bool window_over(const std::vector<WaitingSequence>& waiting, const SchedulerLimits& limits,
                 Clock::time_point now);

SchedulerDecision schedule(const std::vector<WaitingSequence>& waiting,
                           const std::vector<RunningSequence>& running, int free_blocks,
                           const SchedulerLimits& limits, Clock::time_point now);

}  // namespace pipeline
