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
#include <variant>

#include "graph/log.h"
#include "server/openai_response.h"

namespace pipeline {

using json = ResponseJson;
using Clock = std::chrono::steady_clock;

// A request's outcome, ready to be written.
struct BatchRunner::Finished {
  const BatchInput* input = nullptr;
  std::string request_id;
  int status_code = 200;
  json body;
  // Failed by the engine's shutdown or by a runner failure: not written, a rerun does it.
  bool cut_short = false;
};

// The other choices of a line one of whose choices failed: the line is that error, so they
// need not run on, and end with it. The writer's thread ends them: a sink callback that did
// would take their streams' locks under its own.
struct BatchRunner::Cancel {
  std::vector<std::weak_ptr<Request>> choices;
  RequestError error;
};

// Outcomes and cancellations from the pipeline's threads to the one that writes them.
class BatchRunner::Results {
 public:
  using Event = std::variant<Finished, Cancel>;

  // Notifies under the lock: the last pop may be followed at once by the end of run() and of
  // this object, which must not come while a pusher is still inside notify_one.
  void push(Event event) {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(event));
    ready_.notify_one();
  }
  std::optional<Event> pop(Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_until(lock, deadline, [&] { return !queue_.empty(); })) return std::nullopt;
    Event event = std::move(queue_.front());
    queue_.pop_front();
    return event;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> queue_;
};

// One input line's answer, built from every choice's events; once the last choice has ended,
// the outcome goes to the writer. The engine delivers each request's events in order, one at a
// time, but a line's choices run side by side, hence the lock.
class BatchRunner::Answer {
 public:
  Answer(const BatchInput& input, const ParsedRequest& parsed, const std::string& model,
         TokenTextFn token_text, Results& results)
      : input_(input),
        request_id_(parsed.request->id),
        per_prompt_(parsed.per_prompt),
        builder_(parsed, model, std::move(token_text)),
        completions_(size_t(parsed.choices())),
        left_(parsed.choices()),
        results_(results) {}

  void delta(int choice, const Delta& delta) {
    std::lock_guard lock(mutex_);
    builder_.append(delta, choice);
  }
  void finish(int choice, const Completion& completion) {
    std::lock_guard lock(mutex_);
    completions_.at(size_t(choice)) = completion;
    end();
  }
  // The line's requests, one per choice (weakly: each one's sink holds this answer).
  void set_choices(const std::vector<std::shared_ptr<Request>>& requests) {
    std::lock_guard lock(mutex_);
    choices_.assign(requests.begin(), requests.end());
  }
  void fail(const RequestError& error) {
    std::lock_guard lock(mutex_);
    if (!error_) {
      error_ = error;
      if (left_ > 1) results_.push(Cancel{choices_, error});
    }
    end();
  }

 private:
  void end() {
    if (--left_ > 0) return;
    if (error_) {
      // 503 comes only from the engine's shutdown and a runner failure, which cut requests
      // short.
      results_.push(Finished{&input_, request_id_, error_->http_status, error_body(*error_),
                             error_->http_status == 503});
      return;
    }
    results_.push(
        Finished{&input_, request_id_, 200, builder_.whole_response(completions_), false});
  }

  const BatchInput& input_;
  std::string request_id_;
  int per_prompt_;
  std::mutex mutex_;
  ResponseBuilder builder_;
  std::vector<Completion> completions_;
  int left_;                           // choices not ended yet
  std::optional<RequestError> error_;  // the first choice that failed
  std::vector<std::weak_ptr<Request>> choices_;
  Results& results_;
};

// The sink of one choice's request: its events go to the line's answer.
class BatchRunner::ChoiceSink final : public RequestSink {
 public:
  ChoiceSink(std::shared_ptr<Answer> answer, int choice)
      : answer_(std::move(answer)), choice_(choice) {}

  void on_delta(Delta delta) override { answer_->delta(choice_, delta); }
  void on_finish(const Completion& completion) override { answer_->finish(choice_, completion); }
  void on_error(const RequestError& error) override { answer_->fail(error); }

 private:
  std::shared_ptr<Answer> answer_;
  int choice_;
};

BatchRunner::BatchRunner(Engine& engine, std::string input_name, std::FILE* output)
    : engine_(engine),
      input_name_(std::move(input_name)),
      output_(output),
      served_(served_model(engine.model_name(), engine.config(), engine.tokenizer())) {}

BatchProgress BatchRunner::run(const std::vector<BatchInput>& todo, const std::atomic<bool>& stop,
                               std::chrono::milliseconds period, const Report& report) {
  Results results;
  BatchProgress progress;
  progress.total = todo.size();
  // A failed write ends the run, but only once every request in flight has ended: their sinks
  // push into `results` until then.
  std::exception_ptr failure;
  try {
    submit_and_write(todo, stop, period, report, results, progress);
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  if (progress.written < todo.size()) {
    // Stopped: the engine finishes what it can within its grace and fails the rest (after it
    // failed for good, what it finishes are the answers the model had completed); after a failed
    // write there is no grace, and nothing more is written.
    const std::chrono::seconds grace(failure ? 0 : engine_.config().server.shutdown_grace_s);
    engine_.shutdown(grace);
    drain(results, progress, failure);
    // The grace may have finished every request left, and with them the batch.
    progress.interrupted = progress.written < todo.size();
  }
  if (failure) std::rethrow_exception(failure);
  // The run stopped for it, after writing the lines that had finished: those it failed are
  // left unwritten, for a rerun to do.
  if (progress.interrupted)
    if (const auto why = engine_.failure())
      throw std::runtime_error(*why +
                               "; run the same command again for the lines left without results");
  report(progress);
  return progress;
}

void BatchRunner::submit_and_write(const std::vector<BatchInput>& todo,
                                   const std::atomic<bool>& stop, std::chrono::milliseconds period,
                                   const Report& report, Results& results,
                                   BatchProgress& progress) {
  const ServeConfig& config = engine_.config();
  const size_t max_in_flight = size_t(std::clamp(
      config.scheduler.max_num_seqs + config.scheduler.max_batch, 1, config.server.max_queue));
  size_t next = 0;
  auto next_report = Clock::now() + period;
  while (progress.written < todo.size() && !stop.load()) {
    // The run stops (run() says why): drain() still writes the lines that finished before the
    // failure, whose events may not have been taken yet.
    if (engine_.failure()) return;
    while (next < todo.size() && progress.in_flight < max_in_flight && !stop.load()) {
      if (!submit(todo[next], results, progress)) {
        // The engine's queue is full: wait for a request to finish. With none in flight it
        // never will, so the engine will not take any. (An engine failure ends the run above.)
        if (progress.in_flight == 0 && !engine_.failure())
          throw std::runtime_error("the engine refuses requests (queue full or shutting down)");
        break;
      }
      ++next;
    }
    if (progress.in_flight == 0) continue;  // all answered at submission (refusals)
    if (auto event = results.pop(next_report)) {
      if (auto* cancel = std::get_if<Cancel>(&*event)) {
        cancel_choices(*cancel);
      } else {
        --progress.in_flight;
        const Finished& finished = std::get<Finished>(*event);
        if (!finished.cut_short) write(finished, progress);
      }
    }
    if (Clock::now() >= next_report) {
      report(progress);
      next_report = Clock::now() + period;
    }
  }
}

// After the engine's shutdown, which ends every request: takes their outcomes, writing those
// that finished (not those it cut short, which a rerun does) until a write fails (`failure`).
void BatchRunner::drain(Results& results, BatchProgress& progress, std::exception_ptr& failure) {
  while (progress.in_flight > 0) {
    auto event = results.pop(Clock::now() + std::chrono::seconds(10));
    if (!event) break;  // cannot happen: shutdown has ended every request
    const auto* finished = std::get_if<Finished>(&*event);
    if (!finished) continue;  // a cancellation: shutdown ends them all anyway
    --progress.in_flight;
    if (failure || finished->cut_short) continue;
    try {
      write(*finished, progress);
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
  }
}

bool BatchRunner::submit(const BatchInput& input, Results& results, BatchProgress& progress) {
  ParsedRequest parsed;
  try {
    parsed = parse_openai_request(input.endpoint, input.body, served_);
    if (parsed.options.stream)
      throw ApiError({400, "stream is not supported in a batch: each answer is one response body",
                      "invalid_request_error", "stream", ""});
  } catch (const ApiError& e) {
    write({&input, "", e.error().http_status, error_body(e.error()), false}, progress);
    return true;
  }
  auto answer = std::make_shared<Answer>(
      input, parsed, served_.name,
      [this](int32_t token) { return engine_.tokenizer().token_text(token); }, results);
  auto requests = choice_requests(parsed);
  for (size_t i = 0; i < requests.size(); ++i)
    requests[i]->sink = std::make_shared<ChoiceSink>(answer, int(i));
  // Before they run: a choice may fail before submit() returns.
  answer->set_choices(requests);
  // All of a line's choices are accepted or none: a full queue leaves the line for later.
  if (engine_.submit(requests) != SubmitStatus::Accepted) return false;
  ++progress.in_flight;
  return true;
}

void BatchRunner::cancel_choices(const Cancel& cancel) {
  for (const auto& choice : cancel.choices)
    if (const std::shared_ptr<Request> request = choice.lock()) engine_.end(*request, cancel.error);
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
    throw BatchOutputWriteError(std::strerror(errno));
  ++progress.written;
}

}  // namespace pipeline
