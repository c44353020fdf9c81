#include "graph/scheduler_policy.h"

#include <algorithm>

namespace pipeline {
namespace {

int blocks_for(int tokens, int block_size) {
  return (tokens + block_size - 1) / block_size;
}

// New blocks a running sequence needs for its next step. An unfinished prompt was given blocks
// for all of its tokens when it was admitted, so only a decoding sequence can need one.
int step_need(const RunningSequence& s, int block_size) {
  return std::max(0, blocks_for(s.tokens, block_size) - s.blocks);
}

// Running sequences, the first in order first.
std::vector<const RunningSequence*> in_order(const std::vector<RunningSequence>& running) {
  std::vector<const RunningSequence*> order;
  for (const auto& s : running) order.push_back(&s);
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return goes_before(*a, *b); });
  return order;
}

// Preempts the last running sequences in order until the others' next step fits the free blocks
// (never the first); returns the blocks left over once the kept sequences took their step's
// share.
int preempt_until_the_step_fits(const std::vector<RunningSequence>& running, int free_blocks,
                                int block_size, SchedulerDecision& decision) {
  int need = 0;
  for (const auto& s : running) need += step_need(s, block_size);
  auto order = in_order(running);
  std::reverse(order.begin(), order.end());
  int available = free_blocks;
  for (size_t i = 0; need > available && i + 1 < order.size(); ++i) {
    need -= step_need(*order[i], block_size);
    available += order[i]->own_blocks;
    decision.preempt.push_back(order[i]->id);
  }
  return available - need;
}

bool is_preempted(const SchedulerDecision& decision, uint64_t id) {
  return std::find(decision.preempt.begin(), decision.preempt.end(), id) != decision.preempt.end();
}

// Every kept sequence advances: a decoding one by its token, an unfinished prompt by the next
// chunk the budget allows (in order). Returns the budget left for newcomers.
int advance_running(const std::vector<RunningSequence>& running, int budget,
                    SchedulerDecision& decision) {
  for (const auto& s : running)
    if (s.decoding() && !is_preempted(decision, s.id)) decision.decode.push_back(s.id);
  for (const auto* s : in_order(running)) {
    if (s->decoding() || is_preempted(decision, s->id)) continue;
    const int n = std::min(s->prompt_left, budget);
    if (n == 0) break;
    decision.prefill.push_back({s->id, n});
    budget -= n;
  }
  return budget;
}

// A sequence that decodes during the passes after this one: the positions it holds after this
// pass, and those its blocks are already counted for.
struct Decoder {
  int positions = 0;
  int covered = 0;
};

// Blocks the decoders need beyond those counted for `passes` more passes: each advances one
// position a pass.
int growth(const std::vector<Decoder>& decoders, int passes, int block_size) {
  int blocks = 0;
  for (const Decoder& d : decoders)
    blocks += std::max(
        0, blocks_for(d.positions + passes, block_size) - blocks_for(d.covered, block_size));
  return blocks;
}

// Passes still needed, after this one, for `prompt_tokens` prompt tokens.
int passes_for(int prompt_tokens, const SchedulerLimits& limits) {
  return (prompt_tokens + limits.max_prefill_tokens - 1) / limits.max_prefill_tokens;
}

// Newcomers in queue order while the limits, the blocks and the prompt-token budget allow;
// the last may get only its prompt's first chunk. Besides a newcomer's own blocks, admission
// keeps room for the decoding sequences to grow until the newcomers' last chunks, so that a long
// prompt is not preempted (and recomputed) between two of its chunks. Newcomers only get budget
// in a pass that finishes every running prompt, so every running sequence decodes during those
// passes, and so does every newcomer admitted whole before the one with a chunk left.
void admit(const std::vector<WaitingSequence>& waiting, const std::vector<RunningSequence>& running,
           int available, int budget, const SchedulerLimits& limits, SchedulerDecision& decision) {
  std::vector<Decoder> decoders;
  for (const auto& s : running) decoders.push_back({s.tokens, s.tokens});
  int prompt_after = 0;  // prompt tokens the newcomers leave for later passes
  int reserved = 0;      // blocks kept for the decoders' growth meanwhile
  for (const auto& w : waiting) {
    if (w.follows) continue;
    if (budget == 0) break;
    if (int(decision.admitted.size()) >= limits.max_batch) break;
    if (int(running.size() + decision.admitted.size()) >= limits.max_num_seqs) break;
    const int to_compute = w.tokens - w.cached;
    const int n = std::min(to_compute, budget);
    const int after = prompt_after + to_compute - n;
    const int more = growth(decoders, passes_for(after, limits), limits.block_size) - reserved;
    // Its prompt and, right after, its first decoded token (a prompt-only answer has none); the
    // decoders' longer wait.
    const int positions = w.tokens + (w.decodes ? 1 : 0);
    const int need = blocks_for(positions, limits.block_size) - w.cached_in_use + more;
    if (need > available) break;
    available -= need;
    reserved += more;
    prompt_after = after;
    budget -= n;
    decision.admitted.push_back({w.id, n});
    // Whole in this pass: it decodes from the next, its need counting its first token.
    if (n == to_compute && w.decodes) decoders.push_back({w.tokens, w.tokens + 1});
  }
}

// When the longest-waiting sequence arrived. The queue is in priority order, so that need not be
// the first.
Clock::time_point first_arrival(const std::vector<WaitingSequence>& waiting) {
  return std::min_element(waiting.begin(), waiting.end(),
                          [](const auto& a, const auto& b) { return a.queued < b.queued; })
      ->queued;
}

}  // namespace

bool window_over(const std::vector<WaitingSequence>& waiting, const SchedulerLimits& limits,
                 Clock::time_point now) {
  return !waiting.empty() &&
         (std::any_of(waiting.begin(), waiting.end(),
                      [](const auto& w) { return w.window_closed; }) ||
          now >= first_arrival(waiting) + limits.window || int(waiting.size()) >= limits.max_batch);
}

SchedulerDecision schedule(const std::vector<WaitingSequence>& waiting,
                           const std::vector<RunningSequence>& running, int free_blocks,
                           const SchedulerLimits& limits, Clock::time_point now) {
  SchedulerDecision decision;
  const int available =
      preempt_until_the_step_fits(running, free_blocks, limits.block_size, decision);
  const int budget = advance_running(running, limits.max_prefill_tokens, decision);
  // A pass that had to preempt has no room for newcomers.
  if (waiting.empty() || !decision.preempt.empty()) return decision;
  if (window_over(waiting, limits, now)) {
    admit(waiting, running, available, budget, limits, decision);
    decision.window_closed = true;
  } else if (running.empty()) {
    decision.wake_at = first_arrival(waiting) + limits.window;
  }
  return decision;
}

}  // namespace pipeline
