#include "graph/vllm_metrics.h"

namespace pipeline {
namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class VllmWriter {
 public:
  VllmWriter(std::string& out, const std::string& model_name)
      : out_(out), label_("model_name=\"" + label_value(model_name) + "\"") {}

  void value(const char* name, const char* type, const char* help, double v) {
    header(name, type, help);
    sample(name, label_, v);
  }
  // A counter split by the reason a request finished, as vllm:request_success_total is.
  void by_reason(const char* name, const char* help, uint64_t stopped, uint64_t cut,
                 uint64_t aborted) {
    header(name, "counter", help);
    sample(name, "finished_reason=\"stop\"," + label_, double(stopped));
    sample(name, "finished_reason=\"length\"," + label_, double(cut));
    sample(name, "finished_reason=\"abort\"," + label_, double(aborted));
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    h.write(out_, name, label_);
  }

 private:
  void header(const char* name, const char* type, const char* help) {
    write_help(out_, name, type, help);
  }
  void sample(const char* name, const std::string& labels, double v) {
    out_ += name;
    out_ += '{';
    out_ += labels;
    out_ += "} ";
    out_ += prometheus_number(v);
    out_ += '\n';
  }

  std::string& out_;
  std::string label_;
};

}  // namespace

// vLLM's names for what Metrics counts; a request whose client left is vLLM's "abort".
std::string vllm_metrics_text(const Metrics& m, const std::string& model_name) {
  std::string out;
  VllmWriter w(out, model_name);
  w.value("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
          double(m.running_sequences.value()));
  w.value("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
          double(m.waiting_sequences.value()));
  const int64_t total = m.kv_blocks_total.value();
  w.value("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
          total > 0 ? double(m.kv_blocks_used.value()) / double(total) : 0.0);
  w.value("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions.",
          double(m.preemptions.value()));
  // Counted when a prompt's prefill ends (its first token), as vLLM counts it: a request whose
  // client left while it waited was never prefilled.
  w.value("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
          double(m.prompt_tokens_prefilled.value()));
  w.value("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
          double(m.generated_tokens.value()));
  w.value("vllm:prefix_cache_queries_total", "counter",
          "Prefix cache queries, in terms of number of queried tokens.",
          double(m.prefix_cache_queried_tokens.value()));
  w.value("vllm:prefix_cache_hits_total", "counter",
          "Prefix cache hits, in terms of number of cached tokens.",
          double(m.prefix_cache_hit_tokens.value()));
  w.by_reason("vllm:request_success_total", "Count of successfully processed requests.",
              m.requests_stopped.value(), m.requests_cut.value(), m.requests_cancelled.value());
  w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              m.time_to_first_token);
  w.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              m.inter_token_latency);
  w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
              m.request_seconds);
  w.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
              m.request_prompt_tokens);
  w.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
              m.request_generation_tokens);
  w.histogram("vllm:request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", m.request_queue_seconds);
  w.histogram("vllm:request_prefill_time_seconds",
              "Histogram of time spent in PREFILL phase for request.", m.request_prefill_seconds);
  w.histogram("vllm:request_decode_time_seconds",
              "Histogram of time spent in DECODE phase for request.", m.request_decode_seconds);
  w.histogram("vllm:request_inference_time_seconds",
              "Histogram of time spent in RUNNING phase for request.", m.request_inference_seconds);
  w.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
              m.iteration_tokens);
  w.histogram("vllm:request_time_per_output_token_seconds",
              "Histogram of time_per_output_token_seconds per request.",
              m.request_time_per_output_token);
  return out;
}

}  // namespace pipeline
