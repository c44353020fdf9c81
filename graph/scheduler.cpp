#include "graph/scheduler.h"

#include <algorithm>
#include <span>

#include "graph/log.h"
#include "graph/nvtx.h"
#include "model/seconds.h"

namespace pipeline {

Scheduler::Scheduler(const SchedulerSection& config, int num_blocks, int block_size,
                     Metrics& metrics, FailureListener on_failure)
    : limits_{std::chrono::milliseconds(config.window_ms), config.max_batch, config.max_num_seqs,
              block_size, config.max_prefill_tokens.value_or(kGpuPrefillTokens)},
      prefix_caching_(config.enable_prefix_caching),
      log_passes_(config.logs_passes()),
      num_blocks_(num_blocks),
      metrics_(metrics),
      on_failure_(std::move(on_failure)),
      blocks_(num_blocks),
      thread_([this] { loop(); }) {
  metrics_.kv_blocks_total.set(num_blocks);
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::post(Message message, const Emit& emit) {
  std::unique_lock lock(mutex_);
  if (stopping_) return;
  if (!emit_) emit_ = emit;
  inbox_.push_back(std::move(message));
  // Whoever schedules now takes the message before letting go; otherwise the pass runs here, on
  // the batch node's worker, which then runs the pass it hands on: between a forward pass's
  // result and the next pass no thread has to wake.
  if (!scheduling_) run_passes(lock);
}

void Scheduler::close_windows() {
  {
    std::lock_guard lock(mutex_);
    windows_closed_ = true;
  }
  wake_.notify_all();
}

void Scheduler::stop() {
  {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    wake_.wait(lock, [&] { return !scheduling_; });  // a pass on another thread ends first
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::fail(const std::string& what) {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;  // later posts are ignored
  }
  const std::string why = "the scheduler failed: " + what;
  log_line("%s", why.c_str());
  if (on_failure_) on_failure_(why);
}

bool Scheduler::has_news() const {
  return !inbox_.empty() || (windows_closed_ && windows_open_);
}

bool Scheduler::window_ended(Clock::time_point now) const {
  return wake_at_ && !busy_ && now >= *wake_at_;
}

// The thread runs the passes no post runs: at a batch window's end, and for a window closed by
// close_windows(). It reads the scheduling state only while nobody holds it.
void Scheduler::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    if (scheduling_) {
      wake_.wait(lock);  // its holder wakes this thread if it leaves a window to time
    } else if (has_news() || window_ended(Clock::now())) {
      run_passes(lock);
    } else if (wake_at_ && !busy_) {
      wake_.wait_until(lock, *wake_at_);
    } else {
      wake_.wait(lock);
    }
  }
}

void Scheduler::run_passes(std::unique_lock<std::mutex>& lock) {
  scheduling_ = true;
  std::optional<std::string> failure;
  do {
    std::deque<Message> messages;
    messages.swap(inbox_);
    windows_open_ = !windows_closed_;
    lock.unlock();
    try {
      run_pass(messages);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lock.lock();
  } while (!failure && !stopping_ && has_news());
  if (failure) stopping_ = true;  // before anyone else can take the scheduling over
  scheduling_ = false;
  // Only when someone waits on it: stop(), or the thread when a window's end is to be timed. That
  // end may have moved, or passed while this thread held the scheduling and the thread, finding
  // it held, waited for a notice. A decode step's pass (busy, no window) leaves it asleep.
  if (stopping_ || (wake_at_ && !busy_)) wake_.notify_all();
  if (failure) {
    lock.unlock();
    fail(*failure);
    lock.lock();
  }
}

void Scheduler::run_pass(std::deque<Message>& messages) {
  for (auto& m : messages) apply(m);
  if (!windows_open_)
    for (const auto& s : waiting_) s->window_closed = true;
  if (!busy_) schedule_next(Clock::now());
  update_gauges();
}

void Scheduler::apply(Message& message) {
  if (auto* tokenized = std::get_if<Tokenized>(&message)) {
    tokenized->seq->queued_at = Clock::now();
    queue(std::move(tokenized->seq), /*ahead_of_equals=*/false);
  } else if (auto* result = std::get_if<StepResult>(&message)) {
    apply_step(*result);
  }
}

// The waiting queue is in priority order: a sequence goes behind those of a lower priority
// value, and behind or ahead of those of its own (a newcomer behind, a preempted one ahead: it
// arrived before them, and resumes first).
void Scheduler::queue(SequencePtr seq, bool ahead_of_equals) {
  const int priority = seq->request->priority;
  const auto place = std::find_if(waiting_.begin(), waiting_.end(), [&](const SequencePtr& s) {
    return ahead_of_equals ? s->request->priority >= priority : s->request->priority > priority;
  });
  waiting_.insert(place, std::move(seq));
}

void Scheduler::apply_step(StepResult& result) {
  busy_ = false;
  for (const auto& seq : result.failed) free_blocks(*seq);
  for (const auto& seq : result.retry) --seq->computed;  // its one token, again next pass
  for (const auto& out : result.outputs)
    if (out.finish) release(*out.seq);
  std::erase_if(running_, [](const auto& entry) { return entry.second->block_table.empty(); });
  if (!result.prefill) {
    run_tokens_ += int(result.outputs.size());
    run_end_ = Clock::now();
  }
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
  std::erase_if(running_, [&](const auto& entry) {
    if (!ended(entry.second)) return false;
    release(*entry.second);
    return true;
  });
}

void Scheduler::schedule_next(Clock::time_point now) {
  // The scheduling itself: inside the batch node's range when a post runs it, on the
  // scheduler's thread at a window's end.
  static const NvtxName kRange("schedule");
  NvtxRange range(kRange);
  drop_ended();
  // The last pass's blocks become matchable before anyone is admitted.
  for (const auto& [id, s] : running_) register_computed(*s);
  std::vector<WaitingSequence> waiting;
  for (const auto& s : waiting_) {
    WaitingSequence& w =
        waiting.emplace_back(WaitingSequence{s->number, int(s->tokens.size()), s->queued_at});
    w.window_closed = s->window_closed;
    w.priority = s->request->priority;
    w.decodes = !s->request->prompt_only;
    s->cached_prefix.clear();
  }
  // None can be admitted while the window is open or the running set is full: no lookups yet.
  if (window_over(waiting, limits_, now) && int(running_.size()) < limits_.max_num_seqs)
    look_up_candidates(waiting);
  std::vector<RunningSequence> running;
  for (const auto& [id, s] : running_) {
    // A preemption frees only the blocks nobody else holds (a cached prefix may be shared).
    int own = 0;
    for (int32_t block : s->block_table) own += blocks_.ref_count(block) == 1;
    running.push_back({id, int(s->tokens.size()), s->prompt_left(), int(s->block_table.size()), own,
                       s->request->priority});
  }
  const auto decision = schedule(waiting, running, blocks_.num_free(), limits_, now);
  wake_at_ = decision.wake_at;
  preempt(decision.preempt);
  admit(decision.admitted);
  if (decision.window_closed)
    for (const auto& s : waiting_) s->window_closed = true;
  if (decision.computes_prompts()) {
    end_decode_run();
    start_prefill(decision);
  } else if (!decision.decode.empty()) {
    start_decode(decision.decode);
  } else {
    end_decode_run();
  }
}

// The cached blocks that hold the sequence's first tokens; at least its last token is left to
// compute, for the logits its first sampled token needs. A prompt to score takes none: its
// scores need every position's logits.
void Scheduler::look_up_prefix(Sequence& seq, WaitingSequence& w) {
  if (!prefix_caching_ || seq.scores_prompt()) return;
  const int max_blocks = (int(seq.tokens.size()) - 1) / limits_.block_size;
  seq.cached_prefix = blocks_.match(seq.tokens, limits_.block_size, max_blocks);
  w.cached = int(seq.cached_prefix.size()) * limits_.block_size;
  for (int32_t block : seq.cached_prefix) w.cached_in_use += blocks_.ref_count(block) > 0;
}

// Looks up the waiting sequences' cached prefixes, in order, until max_batch of them (all that
// one pass may admit) would compute their own start. The others follow one of those, or a
// running prompt still being prefilled: their next block is one it computes, so they wait for
// the cache rather than compute it too (the n choices of a call compute their prompt once).
void Scheduler::look_up_candidates(std::vector<WaitingSequence>& waiting) {
  std::vector<NextBlock> computed = blocks_being_prefilled();  // and the candidates' next ones
  int candidates = 0;
  for (size_t i = 0; i < waiting.size() && candidates < limits_.max_batch; ++i) {
    Sequence& seq = *waiting_[i];
    look_up_prefix(seq, waiting[i]);
    const std::optional<NextBlock> next = next_block(seq);
    waiting[i].follows =
        next && !seq.scores_prompt() && std::ranges::find(computed, *next) != computed.end();
    if (waiting[i].follows) continue;
    ++candidates;
    if (next) computed.push_back(*next);
  }
}

// The full prompt blocks the running sequences' unfinished prefills have yet to compute (those
// before are registered).
std::vector<Scheduler::NextBlock> Scheduler::blocks_being_prefilled() const {
  std::vector<NextBlock> blocks;
  if (!prefix_caching_) return blocks;
  for (const auto& [id, seq] : running_) {
    if (seq->prompt_left() == 0) continue;
    for (int i = seq->registered_blocks; i < seq->prefill_end / limits_.block_size; ++i)
      blocks.push_back(
          block_at(*seq, i, i == 0 ? BlockManager::kNoParent : seq->block_table[size_t(i) - 1]));
  }
  return blocks;
}

// Block `index` of the sequence's tokens, after block `parent`.
Scheduler::NextBlock Scheduler::block_at(const Sequence& seq, int index, int32_t parent) const {
  const size_t size = size_t(limits_.block_size);
  return NextBlock{index, parent, std::span(seq.tokens).subspan(size_t(index) * size, size)};
}

// The first block a waiting sequence's prefill computes that the cache could then hold (a full
// block before its last token): right after its cached prefix. None when it has no such block.
std::optional<Scheduler::NextBlock> Scheduler::next_block(const Sequence& seq) const {
  if (!prefix_caching_) return std::nullopt;
  const int index = int(seq.cached_prefix.size());
  if (index >= (int(seq.tokens.size()) - 1) / limits_.block_size) return std::nullopt;
  return block_at(seq, index,
                  seq.cached_prefix.empty() ? BlockManager::kNoParent : seq.cached_prefix.back());
}

bool Scheduler::NextBlock::operator==(const NextBlock& other) const {
  return index == other.index && parent == other.parent && std::ranges::equal(tokens, other.tokens);
}

// Registers the sequence's full blocks whose keys and values are computed, so that others (or
// itself after a preemption) can start from them.
void Scheduler::register_computed(Sequence& seq) {
  if (!prefix_caching_) return;
  const int full = std::min(seq.computed, int(seq.tokens.size())) / limits_.block_size;
  for (int i = seq.registered_blocks; i < full; ++i) {
    const auto tokens =
        std::span(seq.tokens)
            .subspan(size_t(i) * size_t(limits_.block_size), size_t(limits_.block_size));
    const int32_t parent = i == 0 ? BlockManager::kNoParent : seq.block_table[size_t(i) - 1];
    int32_t& block = seq.block_table[size_t(i)];
    const int32_t holder = blocks_.register_block(block, parent, tokens);
    // Computed twice (two sequences with the same start in one pass): keep the registered copy,
    // so that this sequence's later blocks chain to it, and free this one. Nothing reads or
    // writes the table while no pass is in flight.
    if (holder != BlockManager::kNoBlock && holder != block) {
      blocks_.share(holder);
      blocks_.release(block);
      block = holder;
    }
  }
  seq.registered_blocks = std::max(seq.registered_blocks, full);
}

void Scheduler::preempt(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {  // the last in order first, so the first ends up ahead
    SequencePtr seq = std::move(running_.extract(id).mapped());
    release(*seq);
    seq->computed = 0;
    seq->window_closed = true;  // it resumes as soon as there is room, not after a window
    queue(seq, /*ahead_of_equals=*/true);
    seq->waiting.enter(metrics_.waiting_sequences);
    metrics_.preemptions.add();
    if (log_passes_)
      log_line("request %s preempted after %d tokens (KV cache full); it resumes later",
               seq->request->id.c_str(), seq->generated());
  }
}

// Newcomers join the running set with blocks for all of their tokens, so the later chunks of a
// long prompt never wait for blocks. Each first takes the cached blocks its lookup found, then
// the new ones: taking new blocks first could evict a cached block another newcomer counts on.
void Scheduler::admit(const std::vector<PromptChunk>& chunks) {
  std::vector<SequencePtr> admitted;
  for (const PromptChunk& chunk : chunks) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const auto& s) { return s->number == chunk.id; });
    SequencePtr seq = *it;
    waiting_.erase(it);
    seq->waiting.leave(metrics_.waiting_sequences);
    for (int32_t block : seq->cached_prefix) blocks_.share(block);
    seq->block_table = std::move(seq->cached_prefix);
    seq->cached_prefix.clear();
    seq->registered_blocks = int(seq->block_table.size());
    seq->computed = seq->registered_blocks * limits_.block_size;
    admitted.push_back(std::move(seq));
  }
  for (auto& seq : admitted) {
    if (!blocks_.ensure_capacity(seq->block_table, int(seq->tokens.size()), limits_.block_size)) {
      fail_kv_exhausted(*seq);
      free_blocks(*seq);
      continue;
    }
    // The cache's hits are counted at a sequence's first admission only, as vLLM counts them: a
    // preempted one resuming from its own blocks (its answer's tokens among them) is no client's
    // hit.
    if (!seq->cached_prompt_tokens) {
      if (prefix_caching_ && !seq->scores_prompt())
        metrics_.prefix_cache_queried_tokens.add(seq->tokens.size());
      metrics_.prefix_cache_hit_tokens.add(uint64_t(seq->computed));
      seq->cached_prompt_tokens = seq->computed;
      seq->scheduled_at = Clock::now();
    }
    seq->prefill_end = int(seq->tokens.size());
    seq->window_closed = false;
    running_.emplace(seq->number, std::move(seq));
  }
}

void Scheduler::add_chunk(uint64_t id, int tokens, std::vector<SequencePtr>& seqs, Batch& batch) {
  const auto it = running_.find(id);
  if (it == running_.end()) return;  // failed at admission
  const SequencePtr& seq = it->second;
  const int end = seq->computed + tokens;
  if (!blocks_.ensure_capacity(seq->block_table, end, limits_.block_size)) {
    fail_kv_exhausted(*seq);
    return;
  }
  SequenceChunk chunk;
  chunk.tokens.assign(seq->tokens.begin() + seq->computed, seq->tokens.begin() + end);
  chunk.start_pos = seq->computed;
  chunk.block_table = seq->block_table;
  chunk.all_logits = seq->scores_prompt();
  // The sampler's state can be read here: it draws only in the model step, between passes.
  chunk.argmax_only = !chunk.all_logits && seq->sampler->draws_argmax();
  seq->computed = end;
  batch.seqs.push_back(std::move(chunk));
  seqs.push_back(seq);
}

// The policy keeps every step within the pool; reaching this is a bug, not a crash.
void Scheduler::fail_kv_exhausted(Sequence& seq) {
  seq.stream.fail({500, "internal error: KV cache exhausted", "server_error", "", ""});
}

void Scheduler::start_prefill(const SchedulerDecision& decision) {
  PrefillBatch work;
  int scored_rows_left = kMaxScoredRows;
  for (const auto* chunks : {&decision.prefill, &decision.admitted})
    for (const PromptChunk& chunk : *chunks) {
      const int tokens = within_scored_rows(chunk, scored_rows_left);
      if (tokens > 0) add_chunk(chunk.id, tokens, work.seqs, work.batch);
    }
  const size_t prompts = work.seqs.size();
  for (uint64_t id : decision.decode) add_chunk(id, 1, work.seqs, work.batch);
  work.decoding = int(work.seqs.size() - prompts);
  if (work.seqs.empty()) return schedule_again();
  busy_ = true;
  emit_(std::move(work));
}

// A prompt to score returns a logits row per token: its chunk takes at most what is left of the
// pass's kMaxScoredRows (the rest of its prompt waits for the next pass).
int Scheduler::within_scored_rows(const PromptChunk& chunk, int& rows_left) const {
  const auto it = running_.find(chunk.id);
  if (it == running_.end() || !it->second->scores_prompt()) return chunk.tokens;
  const int tokens = std::min(chunk.tokens, rows_left);
  rows_left -= tokens;
  return tokens;
}

void Scheduler::start_decode(const std::vector<uint64_t>& ids) {
  DecodeBatch work;
  for (uint64_t id : ids) add_chunk(id, 1, work.seqs, work.batch);
  if (work.seqs.empty()) return schedule_again();
  if (run_tokens_ == 0) run_start_ = Clock::now();
  busy_ = true;
  emit_(std::move(work));
}

// Every sequence of the pass failed on the way into its batch: the next round drops them.
void Scheduler::schedule_again() {
  wake_at_ = Clock::now();
}

void Scheduler::release(Sequence& seq) {
  register_computed(seq);
  free_blocks(seq);
}

void Scheduler::free_blocks(Sequence& seq) {
  blocks_.release_all(seq.block_table);
  seq.registered_blocks = 0;
}

void Scheduler::end_decode_run() {
  if (run_tokens_ == 0) return;
  const double seconds = seconds_between(run_start_, run_end_);
  if (log_passes_)
    log_line("decoded %d tokens in %.3f s (%.1f tokens/s)", run_tokens_, seconds,
             seconds > 0 ? run_tokens_ / seconds : 0.0);
  run_tokens_ = 0;
}

void Scheduler::update_gauges() {
  metrics_.running_sequences.set(int64_t(running_.size()));
  metrics_.kv_blocks_used.set(blocks_.num_used());
}

}  // namespace pipeline
