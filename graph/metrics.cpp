#include "graph/metrics.h"

#include <cstdio>

namespace pipeline {

std::string prometheus_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void write_help(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

namespace {

void write_value(std::string& out, const char* name, const char* type, const char* help,
                 double value) {
  write_help(out, name, type, help);
  out += std::string(name) + " " + prometheus_number(value) + "\n";
}

// From 100 µs (a tiny model's decode step on a CPU) to 10 minutes (a long prompt queued behind
// others, or a 7B model's 2048-token prefill pass on a CPU, which takes about a minute).
const std::vector<double> kLatencyBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                            0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5,
                                            5.0,    10.0,    30.0,   60.0,  120.0,  300.0, 600.0};

// A phase of a request (vLLM's queue, prefill, decode, inference): one layout for the four, so
// that they add up bucket by bucket, from a fast queue's 100 µs to a long CPU answer's hours.
const std::vector<double> kPhaseBounds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,  0.025, 0.05,  0.1,    0.25,  0.5,
    1.0,    2.5,     5.0,    10.0,  30.0,   60.0,  120.0, 300.0, 600.0, 1200.0, 7200.0};

// A request's whole time, from a fraction of a second to two hours (a long answer on a CPU).
const std::vector<double> kRequestBounds = {0.1,  0.25, 0.5,  1.0,   2.5,   5.0,    10.0,
                                            20.0, 30.0, 60.0, 120.0, 300.0, 1200.0, 7200.0};

// The host's time between two decode passes, from a few microseconds (a serving loop that
// keeps up with a GPU) to a second (a host too busy to).
const std::vector<double> kTurnaroundBounds = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
                                               0.001,   0.0025,   0.005,   0.01,   0.1,     1.0};

// Tokens of a forward pass, as vLLM buckets its iterations' tokens.
const std::vector<double> kPassTokenBounds = {1,   8,    16,   32,   64,   128,  256,
                                              512, 1024, 2048, 4096, 8192, 16384};

// Tokens in a prompt or an answer, as vLLM buckets them: 1, 2, 5 a decade.
const std::vector<double> kTokenBounds = {1,   2,    5,    10,   20,    50,    100,   200,
                                          500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(bounds_.size() + 1) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

uint64_t Histogram::count() const {
  uint64_t total = 0;
  for (const auto& bucket : buckets_) total += bucket.load(std::memory_order_relaxed);
  return total;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : labels + ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < bounds_.size() ? prometheus_number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + sep + "le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + braces + " " + prometheus_number(sum()) + "\n";
  out += name + "_count" + braces + " " + std::to_string(cumulative) + "\n";
}

StageMetrics::StageMetrics(std::string node) : node(std::move(node)), seconds(kLatencyBounds) {}

Metrics::Metrics()
    : prefill_batch_size({1, 2, 4, 8, 16, 32, 64, 128, 256}),
      time_to_first_token(kLatencyBounds),
      inter_token_latency(kLatencyBounds),
      request_seconds(kRequestBounds),
      request_prompt_tokens(kTokenBounds),
      request_generation_tokens(kTokenBounds),
      request_queue_seconds(kPhaseBounds),
      request_prefill_seconds(kPhaseBounds),
      request_decode_seconds(kPhaseBounds),
      request_inference_seconds(kPhaseBounds),
      request_time_per_output_token(kLatencyBounds),
      prefill_forward_seconds(kLatencyBounds),
      decode_forward_seconds(kLatencyBounds),
      decode_turnaround_seconds(kTurnaroundBounds),
      pass_tokens(kPassTokenBounds),
      iteration_tokens(kPassTokenBounds) {}

StageMetrics& Metrics::add_stage(const std::string& node) {
  return stages_.emplace_back(node);
}

std::string Metrics::prometheus_text() const {
  std::string out;
  write_help(out, "pipeline_stage_calls_total", "counter", "Node body calls.");
  for (const auto& s : stages_)
    out += "pipeline_stage_calls_total{stage=\"" + s.node + "\"} " +
           std::to_string(s.calls.value()) + "\n";
  write_help(out, "pipeline_stage_seconds", "histogram", "Node body latency.");
  for (const auto& s : stages_)
    s.seconds.write(out, "pipeline_stage_seconds", "stage=\"" + s.node + "\"");
  write_help(out, "pipeline_stage_queue_depth", "gauge", "Messages waiting for a node.");
  for (const auto& s : stages_)
    out += "pipeline_stage_queue_depth{stage=\"" + s.node + "\"} " +
           std::to_string(s.queue_depth.value()) + "\n";

  write_value(out, "pipeline_requests_added_total", "counter",
              "Requests accepted (a call with n choices counts n).",
              double(requests_added.value()));
  write_value(out, "pipeline_requests_finished_total", "counter",
              "Requests (choices) that completed.", double(requests_finished()));
  write_value(out, "pipeline_requests_failed_total", "counter",
              "Requests (choices) that ended in an error or were cancelled.",
              double(requests_failed.value()));
  write_value(out, "pipeline_requests_cancelled_total", "counter",
              "Requests (choices) cancelled because their client left (also counted as failed).",
              double(requests_cancelled.value()));
  write_value(out, "pipeline_prompt_tokens_total", "counter", "Prompt tokens tokenized.",
              double(prompt_tokens.value()));
  write_value(out, "pipeline_prompt_tokens_prefilled_total", "counter",
              "Prompt tokens of requests (choices) whose prefill ended with their first token.",
              double(prompt_tokens_prefilled.value()));
  write_value(out, "pipeline_prefix_cache_queried_tokens_total", "counter",
              "Tokens of admitted sequences looked up in the prefix cache.",
              double(prefix_cache_queried_tokens.value()));
  write_value(out, "pipeline_prefix_cache_hit_tokens_total", "counter",
              "Prompt tokens whose keys and values came from the prefix cache, not computed.",
              double(prefix_cache_hit_tokens.value()));
  write_value(out, "pipeline_generation_tokens_total", "counter", "Tokens generated.",
              double(generated_tokens.value()));
  write_value(out, "pipeline_prefill_batches_total", "counter", "Prefill forward passes.",
              double(prefill_batches.value()));
  write_help(out, "pipeline_prefill_batch_size", "histogram", "Prompts per prefill batch.");
  prefill_batch_size.write(out, "pipeline_prefill_batch_size", "");
  write_value(out, "pipeline_prefill_decode_tokens_total", "counter",
              "Tokens of decoding sequences computed in prefill passes, beside the prompt chunks.",
              double(prefill_decode_tokens.value()));
  write_value(out, "pipeline_decode_steps_total", "counter", "Decode forward passes.",
              double(decode_steps.value()));
  write_value(out, "pipeline_preemptions_total", "counter",
              "Sequences preempted for lack of KV blocks (recomputed later).",
              double(preemptions.value()));
  write_value(out, "pipeline_running_sequences", "gauge",
              "Sequences admitted and holding KV blocks, those still prefilling included.",
              double(running_sequences.value()));
  write_value(out, "pipeline_waiting_sequences", "gauge",
              "Requests waiting for their prefill, preempted ones included.",
              double(waiting_sequences.value()));
  write_value(out, "pipeline_kv_blocks_used", "gauge", "KV cache blocks in use.",
              double(kv_blocks_used.value()));
  write_value(out, "pipeline_kv_blocks_total", "gauge", "KV cache blocks in the pool.",
              double(kv_blocks_total.value()));
  write_help(out, "pipeline_time_to_first_token_seconds", "histogram",
             "Seconds from a request's arrival to its first token.");
  time_to_first_token.write(out, "pipeline_time_to_first_token_seconds", "");
  write_help(out, "pipeline_inter_token_latency_seconds", "histogram",
             "Seconds between a sequence's consecutive tokens.");
  inter_token_latency.write(out, "pipeline_inter_token_latency_seconds", "");
  write_help(out, "pipeline_request_seconds", "histogram",
             "Seconds from a completed request's arrival to its last token.");
  request_seconds.write(out, "pipeline_request_seconds", "");
  write_help(out, "pipeline_request_prompt_tokens", "histogram",
             "Prompt tokens per completed request.");
  request_prompt_tokens.write(out, "pipeline_request_prompt_tokens", "");
  write_help(out, "pipeline_request_generation_tokens", "histogram",
             "Generated tokens per completed request.");
  request_generation_tokens.write(out, "pipeline_request_generation_tokens", "");
  const std::pair<const char*, const Histogram*> phases[] = {
      {"queue", &request_queue_seconds},
      {"prefill", &request_prefill_seconds},
      {"decode", &request_decode_seconds},
      {"inference", &request_inference_seconds}};
  write_help(out, "pipeline_request_phase_seconds", "histogram",
             "Seconds a completed request spent in each phase: queue (to its first admission), "
             "prefill (to its first token), decode (to its end), inference (admission to end).");
  for (const auto& [phase, histogram] : phases)
    histogram->write(out, "pipeline_request_phase_seconds", std::string("phase=\"") + phase + "\"");
  write_help(out, "pipeline_request_time_per_output_token_seconds", "histogram",
             "A completed request's decode seconds per token after its first.");
  request_time_per_output_token.write(out, "pipeline_request_time_per_output_token_seconds", "");
  write_help(out, "pipeline_forward_seconds", "histogram",
             "Seconds of the model's forward pass per batch, without sampling.");
  prefill_forward_seconds.write(out, "pipeline_forward_seconds", "phase=\"prefill\"");
  decode_forward_seconds.write(out, "pipeline_forward_seconds", "phase=\"decode\"");
  write_help(out, "pipeline_decode_turnaround_seconds", "histogram",
             "Seconds from the end of the forward pass that drew a decode pass's latest token to "
             "the start of that decode pass: sampling, bookkeeping and scheduling, while the "
             "device waits.");
  decode_turnaround_seconds.write(out, "pipeline_decode_turnaround_seconds", "");
  write_help(out, "pipeline_pass_tokens", "histogram",
             "Tokens computed per forward pass: prompt chunks and decoding sequences' tokens.");
  pass_tokens.write(out, "pipeline_pass_tokens", "");
  return out;
}

}  // namespace pipeline
