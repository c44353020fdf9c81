#include "server/batch_runner.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "graph/log.h"

namespace pipeline {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A request's outcome, ready to be written.
struct BatchRunner::Finished {
  const BatchInput* input = nullptr;
  std::string request_id;
  int status_code = 200;
  json body;
  int completion_tokens = 0;
  bool cut_short = false;  // failed by the engine's shutdown: not written, a rerun does it
};

// Outcomes from the pipeline's threads to the one that writes them.
class BatchRunner::Results {
 public:
  // Notifies under the lock: the last pop may be followed at once by the end of run() and of
  // this object, which must not come while a pusher is still inside notify_one.
  void push(Finished finished) {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(finished));
    ready_.notify_one();
  }
  std::optional<Finished> pop(Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_until(lock, deadline, [&] { return !queue_.empty(); })) return std::nullopt;
    Finished finished = std::move(queue_.front());
    queue_.pop_front();
    return finished;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Finished> queue_;
};

// One request's sink: its deltas make the whole answer, as the non-streaming API returns it.
// The engine delivers a request's events in order, one at a time.
class BatchRunner::Sink final : public RequestSink {
 public:
  Sink(const BatchInput& input, const Request& request, const ResponseOptions& options,
       const std::string& model, TokenTextFn token_text, Results& results)
      : input_(input),
        request_id_(request.id),
        builder_(request, options, model, std::move(token_text)),
        results_(results) {}

  void on_delta(Delta delta) override { builder_.append(delta); }
  void on_finish(const Completion& completion) override {
    results_.push({&input_, request_id_, 200, builder_.whole_response(completion),
                   completion.completion_tokens, false});
  }
  void on_error(const RequestError& error) override {
    // 503 comes only from the engine's shutdown, which cuts requests short.
    results_.push(
        {&input_, request_id_, error.http_status, error_body(error), 0, error.http_status == 503});
  }

 private:
  const BatchInput& input_;
  std::string request_id_;
  ResponseBuilder builder_;
  Results& results_;
};

BatchRunner::BatchRunner(Engine& engine, std::string input_name, std::FILE* output)
    : engine_(engine),
      input_name_(std::move(input_name)),
      output_(output),
      served_{engine.model_name(), engine.config().sampling} {}

BatchProgress BatchRunner::run(const std::vector<BatchInput>& todo, const std::atomic<bool>& stop,
                               std::chrono::milliseconds period, const Report& report) {
  const ServeConfig& config = engine_.config();
  const size_t max_in_flight = size_t(std::clamp(
      config.scheduler.max_num_seqs + config.scheduler.max_batch, 1, config.server.max_queue));
  Results results;
  BatchProgress progress;
  progress.total = todo.size();
  size_t next = 0;
  auto next_report = Clock::now() + period;
  while (progress.written < todo.size() && !stop.load()) {
    while (next < todo.size() && progress.in_flight < max_in_flight && !stop.load()) {
      if (!submit(todo[next], results, progress)) {
        // The engine's queue is full: wait for a request to finish. With none in flight it
        // never will, so the engine will not take any.
        if (progress.in_flight == 0)
          throw std::runtime_error("the engine refuses requests (queue full or shutting down)");
        break;
      }
      ++next;
    }
    if (progress.in_flight == 0) continue;  // all answered at submission (refusals)
    if (auto finished = results.pop(next_report)) {
      --progress.in_flight;
      write(*finished, progress);
    }
    if (Clock::now() >= next_report) {
      report(progress);
      next_report = Clock::now() + period;
    }
  }
  if (progress.written < todo.size()) {
    // Stopped: the engine finishes what it can within its grace and fails the rest.
    progress.interrupted = true;
    engine_.shutdown(std::chrono::seconds(config.server.shutdown_grace_s));
    while (progress.in_flight > 0) {
      auto finished = results.pop(Clock::now() + std::chrono::seconds(10));
      if (!finished) break;  // cannot happen: shutdown has ended every request
      --progress.in_flight;
      if (!finished->cut_short) write(*finished, progress);
    }
  }
  report(progress);
  return progress;
}

bool BatchRunner::submit(const BatchInput& input, Results& results, BatchProgress& progress) {
  ParsedRequest parsed;
  try {
    parsed = parse_openai_request(input.endpoint, input.body, served_);
    if (parsed.options.stream)
      throw ApiError({400, "stream is not supported in a batch: each answer is one response body",
                      "invalid_request_error", "stream", ""});
  } catch (const ApiError& e) {
    write({&input, "", e.error().http_status, error_body(e.error()), 0, false}, progress);
    return true;
  }
  auto sink = std::make_shared<Sink>(
      input, *parsed.request, parsed.options, served_.name,
      [this](int32_t token) { return engine_.tokenizer().token_text(token); }, results);
  parsed.request->sink = sink;
  if (engine_.submit(parsed.request) != SubmitStatus::Accepted) return false;
  ++progress.in_flight;
  return true;
}

void BatchRunner::write(const Finished& finished, BatchProgress& progress) {
  const BatchInput& input = *finished.input;
  if (finished.status_code != 200) {
    ++progress.failed;
    const json& error = finished.body.at("error");
    log_line("batch: %s:%d (custom_id %s) failed with %d: %s", input_name_.c_str(), input.line,
             input.custom_id.c_str(), finished.status_code,
             error.value("message", std::string()).c_str());
  }
  const std::string line =
      batch_output_line(input, finished.request_id, finished.status_code, finished.body);
  if (std::fwrite(line.data(), 1, line.size(), output_) != line.size() || std::fflush(output_) != 0)
    throw std::runtime_error(std::string("writing the batch output failed: ") +
                             std::strerror(errno));
  ++progress.written;
  progress.completion_tokens += uint64_t(finished.completion_tokens);
}

}  // namespace pipeline
