// `pipeline batch CONFIG --input FILE --output FILE`: offline generation over an OpenAI batch
// file with the engine a config describes. Resumable: the output is appended to, and every
// request that already has a line there is skipped. Progress goes to stderr.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "apps/commands.h"
#include "apps/config_overrides.h"
#include "apps/options.h"
#include "apps/stop_signals.h"
#include "graph/engine.h"
#include "graph/serve_config.h"
#include "model/seconds.h"
#include "server/batch_file.h"
#include "server/batch_runner.h"

namespace pipeline {

namespace {

constexpr const char* kUsage =
    "usage: pipeline batch CONFIG --input FILE --output FILE [--retry-failed] [--model DIR]\n"
    "                      [--device cpu|cuda|auto] [--threads N] [--set section.key=value ...]\n"
    "Runs every request of an OpenAI batch input file through the model CONFIG describes and\n"
    "appends one result line per request to the output, as each finishes.\n"
    "  --input FILE    JSONL, one request a line: {\"custom_id\": ..., \"method\": \"POST\",\n"
    "                  \"url\": \"/v1/chat/completions\" or \"/v1/completions\", \"body\": {...}}\n"
    "  --output FILE   JSONL, one {\"id\", \"custom_id\", \"response\": {\"status_code\",\n"
    "                  \"request_id\", \"body\"}, \"error\"} a request. Requests it already holds\n"
    "                  are skipped, so the same command resumes an interrupted batch.\n"
    "  --retry-failed  answer again the requests whose line in the output carries an error\n"
    "                  (after fixing their input lines, say): those lines are removed first\n"
    "  --model DIR     model.path: a Hugging Face model folder\n"
    "  --device D      device: cpu, cuda or auto\n"
    "  --threads N     threads: CPU kernel threads (0, the default: all cores; at most 1024)\n"
    "  --set K=V       any config field, e.g. --set scheduler.max_num_seqs=32 (repeatable)\n"
    "SIGINT, SIGTERM or SIGHUP: submit nothing more, finish the requests in flight\n"
    "(server.shutdown_grace_s), write their lines and exit 130 (saying whether any request\n"
    "is left for the next run); a second one fails those still in flight at once (they have\n"
    "no line, so the next run does them).";

constexpr auto kReportPeriod = std::chrono::seconds(2);

// "37/100 done, 2 failed, 8 in flight, 12034 tokens (412 tok/s), 29 s, about 50 s left": the
// whole batch's requests done, `earlier` of them by earlier runs; the rest of the line is this
// run's: the tokens generated so far, those of requests in flight too (the engine's count, as
// usage counts them), and the time left at this run's pace (none once it was interrupted).
void print_progress(const BatchProgress& p, size_t earlier, uint64_t tokens, double seconds) {
  std::string eta;
  if (p.written > 0 && p.written < p.total && !p.interrupted)
    eta = ", about " +
          std::to_string(int(seconds / double(p.written) * double(p.total - p.written) + 0.5)) +
          " s left";
  std::fprintf(stderr,
               "pipeline batch: %zu/%zu done, %zu failed, %zu in flight, %llu tokens (%.0f "
               "tok/s), %.0f s%s\n",
               earlier + p.written, earlier + p.total, p.failed, p.in_flight,
               static_cast<unsigned long long>(tokens),
               seconds > 0 ? double(tokens) / seconds : 0.0, seconds, eta.c_str());
}

// The results the output file already holds for `inputs`.
OutputResults results_in_output(const std::vector<BatchInput>& inputs,
                                const std::string& output_file) {
  std::map<std::string, Endpoint> ids;
  for (const auto& input : inputs) ids.emplace(input.custom_id, input.endpoint);
  return finished_in_output(output_file, ids);
}

// The inputs whose custom_id is not in `finished`.
std::vector<BatchInput> not_in(const std::vector<BatchInput>& inputs,
                               const std::set<std::string>& finished) {
  std::vector<BatchInput> todo;
  for (const auto& input : inputs)
    if (!finished.contains(input.custom_id)) todo.push_back(input);
  return todo;
}

}  // namespace

int batch_command(int argc, char** argv) {
  Options options(argc, argv, kUsage, {"--retry-failed"});
  if (options.help()) return 0;
  // From the start, so that a stop while the files are read (seconds, for a large batch) ends the
  // run as any other does, not the process without a word; and before the engine starts its
  // threads, so that they inherit it.
  block_stop_signals();
  // Progress goes to stderr, often a pipe (`2>&1 | tee log`): a reader gone must not end the run
  // with SIGPIPE; the write fails instead, and the results still go to the output file.
  signal(SIGPIPE, SIG_IGN);
  std::atomic<bool> stop{false};
  std::optional<StopSignalWatcher> while_reading(
      std::in_place,
      [&](int signal_number) {
        std::fprintf(stderr, "pipeline batch: %s received, stopping once the files are read\n",
                     stop_signal_name(signal_number));
        stop.store(true);
      },
      [](int) {});
  const std::string input_file = options.required("--input");
  const std::string output_file = options.required("--output");
  const bool retry_failed = options.flag("--retry-failed");
  const std::vector<std::string> overrides = config_overrides(options);
  const std::string config_file = options.finish(1, 1)[0];
  ServeConfig config = load_serve_config(config_file, overrides);
  // The progress line, every 2 s, says how far the batch is and at what rate; a line per request
  // or per pass would bury it.
  if (!config.server.log_requests) config.server.log_requests = false;
  if (!config.scheduler.log_passes) config.scheduler.log_passes = false;

  // Both files are checked before the model loads.
  std::error_code not_there;  // an output that does not exist yet is not the input
  if (std::filesystem::equivalent(input_file, output_file, not_there))
    throw UsageError("--output " + output_file + " is the input file: the results go to a file " +
                     "of their own");
  const std::vector<BatchInput> inputs = read_batch_input(input_file);
  BatchOutput output(output_file);  // locked before it is read
  OutputResults earlier = results_in_output(inputs, output_file);
  while_reading.reset();  // a signal from here on waits for the watcher below
  if (stop.load()) {
    const size_t missing = inputs.size() - earlier.ids.size();
    std::fprintf(stderr,
                 "pipeline batch: interrupted before any request ran: %zu of %zu requests have "
                 "results in %s%s\n",
                 earlier.ids.size(), inputs.size(), output_file.c_str(),
                 missing == 0 ? "" : "; run the same command again for the rest");
    return 130;
  }
  size_t retried = 0;
  if (retry_failed && !earlier.failed.empty()) {
    retried = output.drop_failed_results();
    for (const std::string& id : earlier.failed) earlier.ids.erase(id);
    earlier.failed.clear();
  }
  const std::vector<BatchInput> todo = not_in(inputs, earlier.ids);
  if (todo.empty()) {
    const std::string failures = earlier.failed.empty()
                                     ? ""
                                     : "; " + std::to_string(earlier.failed.size()) +
                                           " of them failed (--retry-failed answers those again)";
    std::fprintf(stderr, "pipeline batch: all %zu requests of %s already have results in %s%s\n",
                 inputs.size(), input_file.c_str(), output_file.c_str(), failures.c_str());
    return 0;
  }
  const size_t finished = inputs.size() - todo.size();
  const std::string retrying = retried == 0 ? ""
                                            : "; answering again the " + std::to_string(retried) +
                                                  " whose results were errors";
  if (finished > 0 || retried > 0)
    std::fprintf(stderr, "pipeline batch: resuming: %zu of %zu requests already have results%s\n",
                 finished, inputs.size(), retrying.c_str());

  Engine engine(config);
  const auto start = std::chrono::steady_clock::now();
  BatchRunner runner(engine, input_file, output.get());
  const StopSignalWatcher watcher(
      [&](int signal_number) {
        std::fprintf(stderr,
                     "pipeline batch: %s received, submitting nothing more and finishing the "
                     "requests in flight (up to %d s; another signal ends them now)\n",
                     stop_signal_name(signal_number), config.server.shutdown_grace_s);
        stop.store(true);
      },
      [&](int second) {
        std::fprintf(stderr, "pipeline batch: second %s: failing the requests still in flight\n",
                     stop_signal_name(second));
        engine.end_grace();
      });
  BatchProgress progress;
  try {
    progress = runner.run(todo, stop, kReportPeriod, [&](const BatchProgress& p) {
      print_progress(p, finished, engine.metrics().generated_tokens.value(), seconds_since(start));
    });
  } catch (const BatchOutputWriteError& e) {
    std::fprintf(stderr,
                 "pipeline batch: %s: writing a result failed: %s; the results written before it "
                 "are kept: run the same command again, once the file can take more, for the "
                 "rest\n",
                 output_file.c_str(), e.what());
    return 1;
  }
  const size_t done = finished + progress.written;
  if (progress.interrupted) {
    std::fprintf(stderr,
                 "pipeline batch: interrupted: %zu of %zu requests have results in %s; run the "
                 "same command again for the rest\n",
                 done, inputs.size(), output_file.c_str());
    return 130;
  }
  const std::string failures = progress.failed == 0 ? ""
                                                    : "; " + std::to_string(progress.failed) +
                                                          " failed, their lines carry the error";
  std::fprintf(stderr,
               "pipeline batch: done: all %zu requests have results in %s (%zu this run%s)\n",
               inputs.size(), output_file.c_str(), progress.written, failures.c_str());
  // A stop whose grace finished every request left cut nothing short, but it came: the run
  // exits as a stopped one does.
  return stop.load() ? 130 : 0;
}

}  // namespace pipeline
