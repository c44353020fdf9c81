// Offline generation: a batch file's requests through an Engine, each answered as the
// non-streaming API answers it, one output line written per request as it finishes
// (server/batch_file.h has both formats). The front end of `pipeline batch`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/engine.h"
#include "server/batch_file.h"

namespace pipeline {

struct BatchProgress {
  size_t total = 0;          // requests this run was given
  size_t written = 0;        // of them, with their line written
  size_t failed = 0;         // of those, refused or failed (the line carries the error)
  size_t in_flight = 0;      // submitted to the engine, not finished
  bool interrupted = false;  // stopped before every request had its line
};

// The output file took no more lines (a full disk, say); those written before are whole.
class BatchOutputWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class BatchRunner {
 public:
  // Lines go to `output` (open for appending), each flushed as it is written; `input_name`
  // names the input file in messages. The engine and the file must outlive the runner.
  BatchRunner(Engine& engine, std::string input_name, std::FILE* output);

  using Report = std::function<void(const BatchProgress&)>;

  // Submits `todo` in order, keeping the scheduler's running and waiting capacity busy
  // (scheduler.max_num_seqs + max_batch requests in flight, at most server.max_queue), and writes
  // each line as its request finishes; calls `report` about every `period` and once at the end.
  // When `stop` turns true nothing more is submitted; the engine shuts down with its grace
  // (server.shutdown_grace_s), the requests that finished are written and those it cut short
  // are not, so a rerun does them. Throws BatchOutputWriteError when the output cannot be
  // written, once the engine has failed every request still in flight, and std::runtime_error
  // when the engine fails for good (Engine::failure: its model runner or scheduler), once the
  // lines that finished before it are written, leaving those it failed unwritten.
  BatchProgress run(const std::vector<BatchInput>& todo, const std::atomic<bool>& stop,
                    std::chrono::milliseconds period, const Report& report);

 private:
  struct Finished;
  struct Cancel;
  class Results;
  class Answer;
  class ChoiceSink;

  void submit_and_write(const std::vector<BatchInput>& todo, const std::atomic<bool>& stop,
                        std::chrono::milliseconds period, const Report& report, Results& results,
                        BatchProgress& progress);
  void drain(Results& results, BatchProgress& progress, std::exception_ptr& failure);
  // False when the engine's queue is full (try again later); a request the API refuses gets
  // its line at once.
  bool submit(const BatchInput& input, Results& results, BatchProgress& progress);
  void write(const Finished& finished, BatchProgress& progress);
  void cancel_choices(const Cancel& cancel);

  Engine& engine_;
  std::string input_name_;
  std::FILE* output_;
  ServedModel served_;
};

}  // namespace pipeline
