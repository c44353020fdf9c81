#include "graph/scheduler_policy.h"

#include <algorithm>

namespace pipeline {
namespace {

int blocks_for(int tokens, int block_size) {
  return (tokens + block_size - 1) / block_size;
}

// New blocks a running sequence needs for its next decode step.
int step_need(const RunningSequence& s, int block_size) {
  return std::max(0, blocks_for(s.tokens, block_size) - s.blocks);
}

}  // namespace

SchedulerDecision schedule(const std::vector<WaitingSequence>& waiting,
                           const std::vector<RunningSequence>& running, int free_blocks,
                           const SchedulerLimits& limits, Clock::time_point now) {
  SchedulerDecision decision;
  const int bs = limits.block_size;

  int running_need = 0;
  for (const auto& s : running) running_need += step_need(s, bs);

  if (!waiting.empty()) {
    const bool window_over =
        now >= waiting.front().queued + limits.window || int(waiting.size()) >= limits.max_batch;
    if (window_over) {
      int available = free_blocks - running_need;
      for (const auto& w : waiting) {
        if (int(decision.prefill.size()) >= limits.max_batch) break;
        if (int(running.size() + decision.prefill.size()) >= limits.max_num_seqs) break;
        const int need = blocks_for(w.tokens + 1, bs);
        if (need > available) break;
        available -= need;  // its prefill and, right after, its first decode step
        decision.prefill.push_back(w.id);
      }
      if (!decision.prefill.empty()) return decision;
    } else if (running.empty()) {
      decision.wake_at = waiting.front().queued + limits.window;
      return decision;
    }
  }

  // Decode everything running, preempting the newest while their next step does not fit.
  std::vector<const RunningSequence*> order;
  for (const auto& s : running) order.push_back(&s);
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->id > b->id; });  // newest first
  int need = running_need;
  int available = free_blocks;
  size_t preempted = 0;
  while (need > available && preempted + 1 < order.size()) {
    const auto* victim = order[preempted++];
    need -= step_need(*victim, bs);
    available += victim->blocks;
    decision.preempt.push_back(victim->id);
  }
  for (const auto& s : running) {
    if (std::find(decision.preempt.begin(), decision.preempt.end(), s.id) == decision.preempt.end())
      decision.decode.push_back(s.id);
  }
  return decision;
}

}  // namespace pipeline
