// The engine's counters, gauges and histograms, updated lock-free from any pipeline thread and
// written out in the Prometheus text format (GET /metrics).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace pipeline {

// A sample's value as the Prometheus text format writes it.
std::string prometheus_number(double v);
// A metric family's "# HELP" and "# TYPE" lines.
void write_help(std::string& out, const char* name, const char* type, const char* help);

class Counter {
 public:
  void add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  int64_t add(int64_t n) { return value_.fetch_add(n, std::memory_order_relaxed) + n; }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Cumulative buckets by upper bound, as Prometheus histograms are.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // The buckets' total: the count is not kept apart, so a scrape during an observation cannot
  // write a `_count` other than its +Inf bucket, which Prometheus requires to be equal.
  uint64_t count() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  // Lines "NAME_bucket{le=...} N", "NAME_sum", "NAME_count"; `labels` like `stage="emit"`.
  void write(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::deque<std::atomic<uint64_t>> buckets_;  // one per bound, then +Inf
  std::atomic<double> sum_{0.0};
};

// One graph node's body: how often it ran, for how long, and how many messages wait for it.
struct StageMetrics {
  explicit StageMetrics(std::string node);
  std::string node;
  Counter calls;
  Histogram seconds;
  Gauge queue_depth;
};

class Metrics {
 public:
  Metrics();

  // Registers a node before the graph runs; the reference stays valid.
  StageMetrics& add_stage(const std::string& node);
  std::string prometheus_text() const;

  uint64_t requests_finished() const { return requests_stopped.value() + requests_cut.value(); }

  Counter requests_added;
  Counter requests_stopped;    // ended with a completion: an end-of-sequence token or stop string
  Counter requests_cut;        // ended with a completion: max_tokens or the end of the context
  Counter requests_failed;     // ended with an error (refused, cancelled, shutdown)
  Counter requests_cancelled;  // of those, the ones whose client left (HTTP 499)
  Counter prompt_tokens;       // tokenized
  Counter prompt_tokens_prefilled;      // of sequences that got their first token
  Counter prefix_cache_queried_tokens;  // tokens looked up in the prefix cache at admission
  Counter prefix_cache_hit_tokens;      // prompt tokens whose keys and values came from the cache
  Counter generated_tokens;  // as usage counts them: none sampled after a stop string matched
  Counter prefill_batches;
  Histogram prefill_batch_size;   // prompts (whole or a chunk) per prefill batch
  Counter prefill_decode_tokens;  // decoding sequences' tokens computed beside prompt chunks
  Counter decode_steps;
  Counter preemptions;
  Gauge running_sequences;
  Gauge waiting_sequences;
  Gauge kv_blocks_used;
  Gauge kv_blocks_total;
  Histogram time_to_first_token;  // seconds from arrival to the first sampled token
  Histogram inter_token_latency;  // seconds between a sequence's consecutive tokens
  // Per completed request (choice): seconds from arrival to its last token, and its tokens.
  Histogram request_seconds;
  Histogram request_prompt_tokens;
  Histogram request_generation_tokens;
  // Per completed request, its phases as vLLM splits them: queued (from entering the
  // scheduler's queue to its first admission), prefill (admission to the first token), decode
  // (first token to the end), inference (admission to the end), and the decode's seconds per
  // token after the first (0 for an answer of one token).
  Histogram request_queue_seconds;
  Histogram request_prefill_seconds;
  Histogram request_decode_seconds;
  Histogram request_inference_seconds;
  Histogram request_time_per_output_token;
  // The runner's forward() alone (on a GPU: the inputs up, the device's work, the logits
  // back), so that a step's time splits into the model's and the host's (sampling, bookkeeping).
  Histogram prefill_forward_seconds;
  Histogram decode_forward_seconds;
  // From the end of the forward pass that drew the latest token of a decode pass's sequences
  // to that decode pass's start: the host's turnaround between passes (sampling, bookkeeping,
  // the scheduler, the hand-offs between nodes), during which the device has nothing to do.
  // Observed for the decode passes that ran; a failed pass in between counts in the next one.
  Histogram decode_turnaround_seconds;
  Histogram pass_tokens;  // tokens computed per forward pass, prompt chunks and decodes together
  // vLLM's iteration tokens, per forward pass: the tokens drawn, and the whole prompt of each
  // sequence whose first token it drew (cached tokens too, as vLLM counts them).
  Histogram iteration_tokens;

 private:
  std::deque<StageMetrics> stages_;
};

}  // namespace pipeline
