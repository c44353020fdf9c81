// The scheduler behind the batch_window stage: it owns the waiting queue, the running sequences
// and the KV BlockManager, and runs the step loop. The batch_window node (an async_node) hands it
// new sequences and step results; it answers with the next PrefillBatch or DecodeBatch through
// the node's gateway, one forward pass at a time. A scheduling pass runs on the thread that
// posts, unless another thread is in one (which then takes the message too), so a forward pass's
// result is turned into the next pass without waking a thread; the scheduler's own thread runs
// the passes nobody posts for: at a batch window's end, and when close_windows() closes them.
// The policy is scheduler_policy's pure function.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "graph/message.h"
#include "graph/metrics.h"
#include "graph/scheduler_policy.h"
#include "graph/serve_config.h"
#include "graph/stage.h"
#include "model/kv_cache.h"

namespace pipeline {

class Scheduler {
 public:
  // Logits rows of prompts to score (Request::prompt_logprobs) in one pass. Each row is a
  // vocabulary of floats, on the host and on the device, so a long prompt to score goes in
  // chunks of at most this many tokens, whatever max_prefill_tokens allows.
  static constexpr int kMaxScoredRows = 512;

  // Told why, from the thread of the pass, when a scheduling pass threw: an exception there (a
  // bad_alloc, a broken invariant) leaves the queue and the KV pool in no state to go on from.
  using FailureListener = std::function<void(const std::string& why)>;

  // `num_blocks` and `block_size`: the runner's KV pool. After `on_failure` no pass runs again
  // and later posts are ignored; the sequences it held are left to their owner (the engine
  // fails every request in flight).
  Scheduler(const SchedulerSection& config, int num_blocks, int block_size, Metrics& metrics,
            FailureListener on_failure = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // From the batch_window node: a Tokenized sequence or a StepResult. `emit` (the node's
  // gateway) carries the batches out; the first call's is kept. Runs the scheduling pass, and
  // so may emit, before it returns, unless another thread is in one.
  void post(Message message, const Emit& emit);
  // No sequence waits for a batch window from now on, those waiting now and those still to
  // come: the engine calls it when it stops accepting requests (shutdown), after which no
  // newcomer could join a window, and the grace should go to computing.
  void close_windows();
  // Ends the thread, after a pass in progress on another thread; later posts are ignored.
  // Sequences still held are left to their owner (the engine fails them).
  void stop();

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return limits_.block_size; }

 private:
  void loop();
  // With mutex_ held, by a thread that found nobody scheduling: takes the scheduling, runs
  // passes until nothing new waits (has_news), hands it back and wakes whoever waits for that.
  // Returns with mutex_ held. A pass that throws ends the scheduler (fail).
  void run_passes(std::unique_lock<std::mutex>& lock);
  // One pass: the messages applied, then the next forward pass chosen and handed on.
  void run_pass(std::deque<Message>& messages);
  // With mutex_ held, and the scheduling held or free: messages, or windows closed since the
  // last pass.
  bool has_news() const;
  // With mutex_ held and the scheduling free: the batch window to wait for has ended.
  bool window_ended(Clock::time_point now) const;
  void fail(const std::string& what);
  void apply(Message& message);
  void queue(SequencePtr seq, bool ahead_of_equals);
  void apply_step(StepResult& result);
  void drop_ended();
  void schedule_next(Clock::time_point now);
  // A block a prefill computes: its place in the sequence, the block before it (none for the
  // first) and its tokens. Two equal ones hold the same keys and values.
  struct NextBlock {
    int index = -1;
    int32_t parent = -1;
    std::span<const int32_t> tokens;
    bool operator==(const NextBlock& other) const;
  };
  void look_up_candidates(std::vector<WaitingSequence>& waiting);
  void look_up_prefix(Sequence& seq, WaitingSequence& w);
  std::vector<NextBlock> blocks_being_prefilled() const;
  NextBlock block_at(const Sequence& seq, int index, int32_t parent) const;
  std::optional<NextBlock> next_block(const Sequence& seq) const;
  void register_computed(Sequence& seq);
  void preempt(const std::vector<uint64_t>& ids);
  void admit(const std::vector<PromptChunk>& chunks);
  // Adds the running sequence's next `tokens` tokens to a batch, or fails the sequence if the
  // KV cache has no blocks for them.
  void add_chunk(uint64_t id, int tokens, std::vector<SequencePtr>& seqs, Batch& batch);
  void fail_kv_exhausted(Sequence& seq);
  void start_prefill(const SchedulerDecision& decision);
  int within_scored_rows(const PromptChunk& chunk, int& rows_left) const;
  void start_decode(const std::vector<uint64_t>& ids);
  void schedule_again();
  // Frees the sequence's blocks; its computed full blocks stay in the prefix cache.
  void release(Sequence& seq);
  // Frees the sequence's blocks without registering any in the prefix cache: what release()
  // does after registering, and all that is done for a sequence whose last pass failed or
  // that found no blocks at admission (its cache contents may be unfinished).
  void free_blocks(Sequence& seq);
  void end_decode_run();
  void update_gauges();

  SchedulerLimits limits_;
  bool prefix_caching_;
  bool log_passes_;
  int num_blocks_;
  Metrics& metrics_;
  FailureListener on_failure_;

  // Guards the inbox, emit_, stopping_, windows_closed_ and scheduling_. Whoever sets
  // scheduling_ holds what follows it until it clears it: taking and handing back the
  // scheduling under the mutex orders one holder's changes before the next one's reads.
  std::mutex mutex_;
  std::condition_variable wake_;  // the thread and stop() wait on it
  std::deque<Message> inbox_;
  Emit emit_;
  bool stopping_ = false;
  bool windows_closed_ = false;  // close_windows() was called
  bool scheduling_ = false;      // a thread is running passes (run_passes)

  // The scheduling's holder only.
  bool windows_open_ = true;  // windows_closed_ not yet seen
  BlockManager blocks_;
  std::deque<SequencePtr> waiting_;
  // Admitted (decoding, or with a prompt still to compute), by arrival: the order the policy
  // sees them in, and a pass looks each one up by its number.
  std::map<uint64_t, SequencePtr> running_;
  bool busy_ = false;  // a forward pass is in flight
  std::optional<Clock::time_point> wake_at_;
  // The current run of decode steps, for the "decoded N tokens at X tokens/s" log line.
  int run_tokens_ = 0;
  Clock::time_point run_start_;
  Clock::time_point run_end_;

  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace pipeline
