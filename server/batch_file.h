// OpenAI's batch file format, without an engine. The input is JSONL, one request a line:
//   {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
// The output is JSONL too, one line per request in the order they finish:
//   {"id": "batch_req_7", "custom_id": "q1",
//    "response": {"status_code": 200, "request_id": "chatcmpl-3", "body": {...}}, "error": null}
// where a request the API refused has its status and OpenAI's error object as the body. The
// output is also the batch's record of what is done: a rerun skips every custom_id it holds.
#pragma once

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/openai_request.h"
#include "server/openai_response.h"

namespace pipeline {

// A batch file that cannot be used as it is; the message names the file, line and field.
class BatchFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct BatchInput {
  int line = 0;  // 1-based line in the input file
  std::string custom_id;
  Endpoint endpoint = Endpoint::ChatCompletions;
  JsonBody body;  // a JSON object; the API checks its fields when the request runs
};

// Every request of the input file, in file order; blank lines are skipped. Throws
// BatchFileError, naming every such line ("file:line: field: why", one a line, the first 20),
// on lines that are not JSON objects, or whose custom_id (a non-empty string, unique in the
// file), method ("POST"), url (/v1/chat/completions or /v1/completions) or body (an object) is
// missing or wrong.
std::vector<BatchInput> read_batch_input(const std::filesystem::path& file);

// The output file, opened for appending (created if missing) and locked (flock) by this run for
// as long as the object lives: a second run on the same output would answer the same requests.
// A file this run created and left empty (a model that failed to load, a stop before the first
// result) is removed on destruction, while still locked, so that no run that took the file
// after this one can lose what it writes. Throws BatchFileError when the path is no regular
// file, cannot be opened, or another run holds it.
class BatchOutput {
 public:
  explicit BatchOutput(const std::filesystem::path& file);
  ~BatchOutput();
  BatchOutput(const BatchOutput&) = delete;
  BatchOutput& operator=(const BatchOutput&) = delete;

  // Removes the lines of failed requests (a status other than 200), once finished_in_output
  // has checked every line, so that this run answers those requests again; returns how many.
  // The file is replaced whole (a new one renamed over it, locked first), so that a stop
  // meanwhile leaves the old lines or the kept ones, never a part.
  size_t drop_failed_results();

  std::FILE* get() const { return file_; }

 private:
  // drop_failed_results writes the kept lines to the output's name with this and its process id
  // appended, then renames that over the output.
  static constexpr const char* kRewriteSuffix = ".retry-";
  void remove_unfinished_rewrites() const;

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  bool created_ = false;  // by this run
};

// The custom_ids that have a line in an output file, and of them those whose line carries an
// error.
struct OutputResults {
  std::set<std::string> ids;
  std::set<std::string> failed;
};

// The results already in the output file (none when it does not exist); read while a
// BatchOutput holds it.
// A last line with no newline at its end is a result like any other if it is whole JSON (its
// newline is then added); if not, it was cut short by a run stopped while writing it, and is
// removed from the file, once every other line has proved to be a result and it starts as one
// does. Throws BatchFileError, the file untouched, on any other line that is not a result, or
// whose custom_id is not in `expected` or has an answer of another endpoint than `expected`
// gives it (the output of another batch).
OutputResults finished_in_output(const std::filesystem::path& file,
                                 const std::map<std::string, Endpoint>& expected);

// One output line, newline included. `request_id` empty: null (the request never started).
std::string batch_output_line(const BatchInput& input, const std::string& request_id,
                              int status_code, const ResponseJson& body);

}  // namespace pipeline
