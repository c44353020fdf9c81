#include "graph/scheduler.h"

#include <algorithm>

#include "graph/log.h"
#include "graph/nvtx.h"

namespace pipeline {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

SequencePtr take(std::vector<SequencePtr>& seqs, uint64_t id) {
  auto it = std::find_if(seqs.begin(), seqs.end(), [&](const auto& s) { return s->number == id; });
  SequencePtr seq = *it;
  seqs.erase(it);
  return seq;
}

}  // namespace

Scheduler::Scheduler(const SchedulerSection& config, int num_blocks, int block_size,
                     Metrics& metrics)
    : limits_{std::chrono::milliseconds(config.window_ms), config.max_batch, config.max_num_seqs,
              block_size},
      num_blocks_(num_blocks),
      metrics_(metrics),
      blocks_(num_blocks),
      thread_([this] { run(); }) {
  metrics_.kv_blocks_total.set(num_blocks);
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::post(Message message, const Emit& emit) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    if (!emit_) emit_ = emit;
    inbox_.push_back(std::move(message));
  }
  wake_.notify_one();
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    auto ready = [&] { return stopping_ || !inbox_.empty(); };
    if (wake_at_ && !busy_)
      wake_.wait_until(lock, *wake_at_, ready);
    else
      wake_.wait(lock, ready);
    if (stopping_) return;
    std::deque<Message> messages;
    messages.swap(inbox_);
    lock.unlock();
    for (auto& m : messages) apply(m);
    if (!busy_) schedule_next(Clock::now());
    update_gauges();
    lock.lock();
  }
}

void Scheduler::apply(Message& message) {
  if (auto* tokenized = std::get_if<Tokenized>(&message)) {
    tokenized->seq->queued_at = Clock::now();
    waiting_.push_back(std::move(tokenized->seq));
  } else if (auto* result = std::get_if<StepResult>(&message)) {
    apply_step(*result);
  }
}

void Scheduler::apply_step(StepResult& result) {
  busy_ = false;
  for (const auto& seq : result.failed) release(*seq);
  for (const auto& out : result.outputs)
    if (out.finish) release(*out.seq);
  auto still_running = [](const SequencePtr& s) { return !s->block_table.empty(); };
  if (result.prefill) {
    for (auto& seq : in_flight_)
      if (still_running(seq)) running_.push_back(seq);
  } else {
    std::erase_if(running_, [&](const SequencePtr& s) { return !still_running(s); });
    run_tokens_ += int(result.outputs.size());
    run_end_ = Clock::now();
  }
  in_flight_.clear();
  prefilling_ = false;
}

// Cancelled by the client, stopped by a stop string, or ended elsewhere (shutdown): free the
// blocks now, before the next step.
void Scheduler::drop_ended() {
  auto ended = [](const SequencePtr& s) { return s->stopped.load() || s->stream.ended(); };
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (ended(*it)) {
      release(**it);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(running_, [&](const SequencePtr& s) {
    if (!ended(s)) return false;
    release(*s);
    return true;
  });
}

void Scheduler::schedule_next(Clock::time_point now) {
  // The batch node's body only hands over; the scheduling itself shows up as this range.
  static const NvtxName kRange("schedule");
  NvtxRange range(kRange);
  drop_ended();
  std::vector<WaitingSequence> waiting;
  for (const auto& s : waiting_)
    waiting.push_back({s->number, int(s->tokens.size()), s->queued_at});
  std::vector<RunningSequence> running;
  for (const auto& s : running_)
    running.push_back({s->number, int(s->tokens.size()), int(s->block_table.size())});
  const auto decision = schedule(waiting, running, blocks_.num_free(), limits_, now);
  wake_at_ = decision.wake_at;
  preempt(decision.preempt);
  if (!decision.prefill.empty()) {
    end_decode_run();
    start_prefill(decision.prefill);
  } else if (!decision.decode.empty()) {
    start_decode(decision.decode);
  } else {
    end_decode_run();
  }
}

void Scheduler::preempt(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {  // newest first, so the oldest ends up at the front
    SequencePtr seq = take(running_, id);
    release(*seq);
    waiting_.push_front(seq);
    seq->waiting.enter(metrics_.waiting_sequences);
    metrics_.preemptions.add();
    log_line("request %s preempted after %d tokens (KV cache full); it resumes later",
             seq->request->id.c_str(), seq->generated());
  }
}

void Scheduler::start_prefill(const std::vector<uint64_t>& ids) {
  PrefillBatch work;
  for (uint64_t id : ids) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const auto& s) { return s->number == id; });
    SequencePtr seq = *it;
    waiting_.erase(it);
    blocks_.ensure_capacity(seq->block_table, int(seq->tokens.size()), limits_.block_size);
    seq->waiting.leave(metrics_.waiting_sequences);
    SequenceChunk chunk;
    chunk.tokens = seq->tokens;
    chunk.start_pos = 0;
    chunk.block_table = seq->block_table;
    work.batch.seqs.push_back(std::move(chunk));
    work.seqs.push_back(seq);
  }
  in_flight_ = work.seqs;
  prefilling_ = true;
  busy_ = true;
  emit_(std::move(work));
}

void Scheduler::start_decode(const std::vector<uint64_t>& ids) {
  DecodeBatch work;
  for (const auto& seq : running_) {
    if (std::find(ids.begin(), ids.end(), seq->number) == ids.end()) continue;
    const int positions = int(seq->tokens.size());
    if (!blocks_.ensure_capacity(seq->block_table, positions, limits_.block_size)) {
      // The policy keeps every step within the pool; reaching this is a bug, not a crash.
      seq->stream.fail({500, "internal error: KV cache exhausted", "server_error", "", ""});
      continue;
    }
    SequenceChunk chunk;
    chunk.tokens = {seq->tokens.back()};
    chunk.start_pos = positions - 1;
    chunk.block_table = seq->block_table;
    work.batch.seqs.push_back(std::move(chunk));
    work.seqs.push_back(seq);
  }
  if (work.seqs.empty()) return;
  if (run_tokens_ == 0) run_start_ = Clock::now();
  in_flight_ = work.seqs;
  busy_ = true;
  emit_(std::move(work));
}

void Scheduler::release(Sequence& seq) {
  blocks_.release_all(seq.block_table);
}

void Scheduler::end_decode_run() {
  if (run_tokens_ == 0) return;
  const double seconds = seconds_between(run_start_, run_end_);
  log_line("decoded %d tokens in %.3f s (%.1f tokens/s)", run_tokens_, seconds,
           seconds > 0 ? run_tokens_ / seconds : 0.0);
  run_tokens_ = 0;
}

void Scheduler::update_gauges() {
  // A prefill's sequences join running_ when it returns; they run already.
  const size_t prefilling = prefilling_ ? in_flight_.size() : 0;
  metrics_.running_sequences.set(int64_t(running_.size() + prefilling));
  metrics_.kv_blocks_used.set(blocks_.num_used());
}

}  // namespace pipeline
