#include "graph/engine.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>

#include "graph/engine_context.h"
#include "graph/flow_graph.h"
#include "graph/graph_plan.h"
#include "graph/log.h"
#include "graph/runner_factory.h"
#include "graph/scheduler.h"
#include "graph/vllm_metrics.h"
#include "model/llama_weights.h"
#include "model/seconds.h"
#include "stages/tokenize.h"

namespace pipeline {
namespace {

std::string folder_name(const std::filesystem::path& path) {
  auto p = path;
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

LlamaWeights load_weights(const ModelSection& model) {
  check_model_folder(model);
  return LlamaWeights::load(model.path);
}

// The most tokens the scheduler puts in one forward pass: its prefill budget (no more prompt
// tokens than max_num_seqs whole contexts can hold, however large the budget; a GPU's default
// when the config leaves it, as only the CUDA runner reads this) and a token for each sequence
// decoding beside them.
int max_pass_tokens(const SchedulerSection& scheduler, const LlamaConfig& model) {
  const int64_t prompts =
      std::min<int64_t>(scheduler.max_prefill_tokens.value_or(kGpuPrefillTokens),
                        int64_t(scheduler.max_num_seqs) * model.max_position_embeddings);
  return int(std::min<int64_t>(prompts + scheduler.max_num_seqs, std::numeric_limits<int>::max()));
}

}  // namespace

struct Engine::Impl {
  Impl(const ServeConfig& cfg, const RunnerMaker& make);
  void on_end(Sequence& seq, const ResponseStream::Payload& ending);
  void observe_phases(const Sequence& seq, const Completion& completion);
  void fail_for_good(const std::string& why);

  ServeConfig config;
  GraphPlan plan;
  std::string model_name;
  std::shared_ptr<const LlamaWeights> weights;
  Tokenizer tokenizer;
  std::unique_ptr<ModelRunner> runner;
  Metrics metrics;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<GuidedVocabulary> guided_vocabulary;
  std::unique_ptr<EngineContext> context;
  std::unique_ptr<FlowGraph> graph;

  // Every accepted request until its sink got its ending.
  std::mutex live_mutex;
  std::condition_variable live_changed;
  std::map<uint64_t, std::weak_ptr<Sequence>> live;
  bool accepting = true;
  bool grace_ended = false;
  uint64_t next_number = 0;
  std::optional<std::string> failure;
  std::function<void(const std::string&)> failure_listener;

  std::mutex shutdown_mutex;
  bool shut_down = false;
};

Engine::Impl::Impl(const ServeConfig& cfg, const RunnerMaker& make)
    : config(cfg),
      plan(plan_graph(config)),  // a bad graph fails before the model loads
      model_name(config.model.name.empty() ? folder_name(config.model.path) : config.model.name),
      weights(std::make_shared<const LlamaWeights>(load_weights(config.model))),
      tokenizer(config.model.path / "tokenizer.model") {
  tokenizer.check_fits(weights->config.vocab_size);
  RunnerOptions options;
  options.kv_block_size = config.scheduler.kv_block_size;
  options.kv_cache_blocks = config.scheduler.kv_cache_blocks;
  options.kv_cache_fraction = config.scheduler.kv_cache_fraction;
  options.kv_cache_dtype = config.scheduler.kv_cache_dtype;
  options.matmul_activations = config.model.matmul_activations;
  options.max_num_seqs = config.scheduler.max_num_seqs;
  options.max_pass_tokens = max_pass_tokens(config.scheduler, weights->config);
  options.max_pass_logit_rows = config.scheduler.max_num_seqs + Scheduler::kMaxScoredRows;
  options.threads = config.threads;
  runner = make ? make(weights, options) : make_runner(config.device, weights, options);
  if (!config.scheduler.max_prefill_tokens)
    config.scheduler.max_prefill_tokens = prefill_tokens_for(runner->device_name());
  const auto& kv = runner->kv_shape();
  scheduler = std::make_unique<Scheduler>(config.scheduler, kv.num_blocks, kv.block_size, metrics,
                                          [this](const std::string& why) { fail_for_good(why); });
  guided_vocabulary = std::make_unique<GuidedVocabulary>(tokenizer, runner->config());
  context = std::make_unique<EngineContext>(EngineContext{
      config, runner->config(), tokenizer, *guided_vocabulary,
      *parse_chat_template(config.model.chat_template), *runner, *scheduler, metrics,
      std::random_device{}(), [this](const std::string& why) { fail_for_good(why); }});
  graph = std::make_unique<FlowGraph>(plan, *context, metrics);
  for (const auto& line : runner->setup_report())
    log_line("engine: %s: %s", runner->device_name().c_str(), line.c_str());
  const int64_t kv_tokens = int64_t(kv.num_blocks) * kv.block_size;
  const double kv_mib = 2.0 * kv.num_layers * double(kv.block_elems()) * dtype_size(kv.dtype) *
                        kv.num_blocks / double(1 << 20);
  log_line(
      "engine: model %s on %s, KV cache %d blocks of %d tokens in %s (%.*f %s, %lld tokens), "
      "%zu graph nodes",
      model_name.c_str(), runner->device_name().c_str(), kv.num_blocks, kv.block_size,
      dtype_name(kv.dtype), kv_mib < 1024 ? 0 : 1, kv_mib < 1024 ? kv_mib : kv_mib / 1024,
      kv_mib < 1024 ? "MiB" : "GiB", (long long)kv_tokens, plan.nodes.size());
  const int64_t contexts = kv_tokens / runner->config().max_position_embeddings;
  if (contexts >= 1 && contexts < config.scheduler.max_num_seqs)
    log_line(
        "engine: the KV cache holds %lld full contexts of %d tokens for max_num_seqs %d: long "
        "requests beyond that wait or preempt one another (scheduler.kv_cache_blocks sets the "
        "pool)",
        (long long)contexts, runner->config().max_position_embeddings,
        config.scheduler.max_num_seqs);
  if (kv_tokens < runner->config().max_position_embeddings)
    log_line(
        "engine: warning: the KV cache holds %lld tokens, fewer than the model's context "
        "of %d: a request's prompt and answer together stop at %lld tokens",
        (long long)kv_tokens, runner->config().max_position_embeddings, (long long)kv_tokens);
}

// A completed sequence's phases, as vLLM times them: they end when its last token was drawn. A
// sequence that ended before its first token (never admitted, or its answer empty) has no
// phases to count.
void Engine::Impl::observe_phases(const Sequence& seq, const Completion& completion) {
  using Clock = std::chrono::steady_clock;
  if (seq.scheduled_at == Clock::time_point{} || seq.first_token_at == Clock::time_point{} ||
      completion.last_token_at == Clock::time_point{})
    return;
  const auto end = completion.last_token_at;
  const int completion_tokens = completion.completion_tokens;
  metrics.request_queue_seconds.observe(seconds_between(seq.queued_at, seq.scheduled_at));
  metrics.request_prefill_seconds.observe(seconds_between(seq.scheduled_at, seq.first_token_at));
  const double decode = seconds_between(seq.first_token_at, end);
  metrics.request_decode_seconds.observe(decode);
  metrics.request_inference_seconds.observe(seconds_between(seq.scheduled_at, end));
  metrics.request_time_per_output_token.observe(
      completion_tokens > 1 ? decode / double(completion_tokens - 1) : 0.0);
}

void Engine::Impl::on_end(Sequence& seq, const ResponseStream::Payload& ending) {
  seq.waiting.end(metrics.waiting_sequences);
  const auto& id = seq.request->id;
  if (const auto* completion = std::get_if<Completion>(&ending)) {
    (completion->reason == FinishReason::Stop ? metrics.requests_stopped : metrics.requests_cut)
        .add();
    metrics.request_seconds.observe(seconds_since(seq.request->arrival));
    metrics.request_prompt_tokens.observe(completion->prompt_tokens);
    metrics.request_generation_tokens.observe(completion->completion_tokens);
    observe_phases(seq, *completion);
    if (config.server.logs_requests())
      log_line("request %s finished (%s): %d tokens in %.3f s", id.c_str(),
               finish_reason_name(completion->reason), completion->completion_tokens,
               seconds_since(seq.request->arrival));
  } else {
    const auto& error = std::get<RequestError>(ending);
    metrics.requests_failed.add();
    if (error.http_status == kClientGoneStatus) metrics.requests_cancelled.add();
    if (config.server.logs_requests())
      log_line("request %s failed (%d): %s", id.c_str(), error.http_status, error.message.c_str());
  }
  std::lock_guard lock(live_mutex);
  live.erase(seq.number);
  live_changed.notify_all();
}

// Every request in flight that still needs the model fails now, not at the scheduler's next
// step: nothing can run them. An answer already complete is left to detokenize and emit, which
// need no model, so that the client gets what the model finished; so is one whose drawn tokens
// detokenize has yet to have, which fails only if they do not end it (a stop string). A
// shutdown's grace ends them like any request still in flight.
void Engine::Impl::fail_for_good(const std::string& why) {
  std::vector<SequencePtr> remaining;
  size_t delivering = 0;
  std::function<void(const std::string&)> listener;
  {
    std::lock_guard lock(live_mutex);
    if (failure) return;
    failure = why;
    accepting = false;
    for (auto& [number, weak] : live) {
      auto seq = weak.lock();
      if (!seq) continue;
      if (seq->answer_complete())
        ++delivering;
      else
        remaining.push_back(std::move(seq));
    }
    listener = failure_listener;
  }
  log_line(
      "engine: failed for good (%s): failing the %zu requests in flight that need the model "
      "(unless the tokens drawn for them, on their way to detokenize, end their answers), "
      "delivering the %zu complete answers",
      why.c_str(), remaining.size(), delivering);
  for (const auto& seq : remaining) seq->fail_unless_answered(engine_failed_error(why));
  if (listener) listener(why);
}

Engine::Engine(const ServeConfig& config, RunnerMaker make)
    : impl_(std::make_unique<Impl>(config, make)) {}

Engine::~Engine() {
  shutdown(std::chrono::seconds(impl_->config.server.shutdown_grace_s));
}

SubmitStatus Engine::submit(std::shared_ptr<Request> request) {
  return submit(std::span(&request, 1));
}

SubmitStatus Engine::submit(std::span<const std::shared_ptr<Request>> requests) {
  for (const auto& request : requests)
    if (!request || !request->sink)
      throw std::invalid_argument("Engine::submit: a request needs a sink");
  auto& m = *impl_;
  const auto count = int64_t(requests.size());
  std::vector<SequencePtr> seqs;
  {
    std::lock_guard lock(m.live_mutex);
    if (m.failure) return SubmitStatus::EngineFailed;
    if (!m.accepting) return SubmitStatus::ShuttingDown;
    if (m.metrics.waiting_sequences.add(count) > m.config.server.max_queue) {
      m.metrics.waiting_sequences.add(-count);
      return SubmitStatus::QueueFull;
    }
    Impl* impl = &m;
    for (const auto& request : requests) {
      request->sequence_number = m.next_number;
      auto seq = std::make_shared<Sequence>(
          request, m.next_number++,
          [impl](Sequence& s, const ResponseStream::Payload& ending) { impl->on_end(s, ending); });
      m.live.emplace(seq->number, seq);
      seqs.push_back(std::move(seq));
    }
  }
  for (auto& seq : seqs) {
    m.metrics.requests_added.add();
    m.graph->put(Submitted{std::move(seq)});
  }
  return SubmitStatus::Accepted;
}

std::optional<RequestError> Engine::refusal_whatever_the_load(const Request& request) const {
  return TokenizeStage(*impl_->context).refusal_before_encoding(request);
}

void Engine::cancel(Request& request) {
  end(request, {kClientGoneStatus, "request cancelled", "cancelled", "", ""});
}

void Engine::end(Request& request, const RequestError& error) {
  auto& m = *impl_;
  if (!request.sequence_number) return;  // never accepted
  SequencePtr seq;
  {
    std::lock_guard lock(m.live_mutex);
    if (auto found = m.live.find(*request.sequence_number); found != m.live.end())
      seq = found->second.lock();
  }
  // Outside the lock: the ending runs on_end, which takes it. The scheduler drops an ended
  // sequence, freeing its blocks, at its next step.
  if (seq) seq->stream.fail(error);
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  auto& m = *impl_;
  std::lock_guard once(m.shutdown_mutex);
  if (m.shut_down) return;
  std::vector<SequencePtr> remaining;
  {
    std::unique_lock lock(m.live_mutex);
    m.accepting = false;
    m.scheduler->close_windows();  // no newcomer can join one now: those waiting start at once
    if (!m.live.empty()) log_line("shutting down: %zu requests in flight", m.live.size());
    m.live_changed.wait_for(lock, grace, [&] { return m.live.empty() || m.grace_ended; });
    for (auto& [number, weak] : m.live)
      if (auto seq = weak.lock()) remaining.push_back(std::move(seq));
  }
  // The scheduler frees their blocks at its next step; late events for them are dropped.
  for (const auto& seq : remaining)
    seq->stream.fail({503, "server shutting down", "server_error", "", "shutting_down"});
  // Every request has ended, so a pass in progress stops at its next check (the model step's
  // PassWatch), rather than compute for no one.
  m.scheduler->stop();
  m.graph->wait();
  m.shut_down = true;
}

void Engine::end_grace() {
  {
    std::lock_guard lock(impl_->live_mutex);
    impl_->grace_ended = true;
  }
  impl_->live_changed.notify_all();
}

std::optional<std::string> Engine::failure() const {
  std::lock_guard lock(impl_->live_mutex);
  return impl_->failure;
}

void Engine::on_failure(std::function<void(const std::string& why)> listener) {
  std::optional<std::string> failed;
  {
    std::lock_guard lock(impl_->live_mutex);
    impl_->failure_listener = listener;
    failed = impl_->failure;
  }
  if (failed && listener) listener(*failed);
}

std::string Engine::metrics_text() const {
  return impl_->metrics.prometheus_text() + vllm_metrics_text(impl_->metrics, impl_->model_name);
}
const Metrics& Engine::metrics() const {
  return impl_->metrics;
}
const Tokenizer& Engine::tokenizer() const {
  return impl_->tokenizer;
}

ChatTemplate Engine::chat_template() const {
  return impl_->context->chat_template;
}

const LlamaConfig& Engine::model_config() const {
  return impl_->runner->config();
}
int Engine::max_model_len() const {
  const auto& kv = impl_->runner->kv_shape();
  return int(std::min<int64_t>(model_config().max_position_embeddings,
                               int64_t(kv.num_blocks) * kv.block_size));
}
const std::string& Engine::model_name() const {
  return impl_->model_name;
}
const ServeConfig& Engine::config() const {
  return impl_->config;
}

}  // namespace pipeline
