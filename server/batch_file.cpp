#include "server/batch_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <utility>

#include "server/openai_response.h"

namespace pipeline {
namespace {

// Lines are read as request bodies are (JsonBody: members in the order written).
using json = JsonBody;

BatchFileError error_at(const std::filesystem::path& file, int line, const std::string& what) {
  return BatchFileError(file.string() + ":" + std::to_string(line) + ": " + what);
}

// A bad input file's first lines in error are each named; past these, only their count.
constexpr size_t kBadLinesNamed = 20;

// nlohmann's parse message without its "[json.exception.parse_error.101] " prefix or its "line
// 1" (the text parsed is one line of the file, which the message names), and with bytes a
// terminal would not show as text (its "last read" quotes the line) written as \xNN.
std::string parse_problem(const nlohmann::json::exception& e) {
  std::string message = e.what();
  if (const size_t end = message.find("] "); message.starts_with("[json") && end != message.npos)
    message.erase(0, end + 2);
  constexpr std::string_view kLineOne = "at line 1, column ";
  if (const size_t at = message.find(kLineOne); at != message.npos)
    message.replace(at, kLineOne.size(), "at column ");
  std::string shown;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) {
      shown += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      shown += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  return shown;
}

// What a JSON value is, for a message that says what was given instead.
std::string kind_of(const json& value) {
  if (value.is_string()) return "an empty string";  // the only string refused
  if (value.is_number()) return "a number";
  if (value.is_boolean()) return "a boolean";
  if (value.is_null()) return "null";
  return value.is_array() ? "an array" : "an object";
}

bool blank(const std::string& text) {
  return text.find_first_not_of(" \t\r") == std::string::npos;
}

// The line as a JSON object, or why it is not one.
json parse_object(const std::filesystem::path& file, int number, const std::string& text) {
  json value;
  try {
    // A line's body, one level in, may nest as deep as a request's.
    value = read_json_body(text, kMaxJsonDepth + 1);
  } catch (const nlohmann::json::other_error&) {
    throw error_at(file, number,
                   "the body nests arrays and objects deeper than " +
                       std::to_string(kMaxJsonDepth) + " levels");
  } catch (const nlohmann::json::exception& e) {  // not JSON, or a number beyond a double
    throw error_at(file, number, "not JSON: " + parse_problem(e));
  }
  if (!value.is_object()) throw error_at(file, number, "not a JSON object");
  return value;
}

std::string required_string(const std::filesystem::path& file, int number, const json& object,
                            const char* field) {
  const auto found = object.find(field);
  if (found == object.end())
    throw error_at(file, number, std::string(field) + ": required, a non-empty string");
  if (!found->is_string() || found->get<std::string>().empty())
    throw error_at(file, number,
                   std::string(field) + ": must be a non-empty string, not " + kind_of(*found));
  return found->get<std::string>();
}

// A device such as /dev/zero reads on without end, so a read of it never returns: only what
// ends can be read, a file or a pipe (for the input; process substitution gives a pipe).
void check_readable_kind(const std::filesystem::path& file, bool pipe_allowed, const char* what) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(file, error);
  if (error || std::filesystem::is_regular_file(status)) return;  // opening it says what is wrong
  if (pipe_allowed && std::filesystem::is_fifo(status)) return;
  throw BatchFileError(file.string() + ": the batch " + what + " must be a regular file" +
                       (pipe_allowed ? " or a pipe" : ", which a rerun reads back to resume"));
}

// Whether `tail`, a last line with no newline, can be the start of a line batch_output_line
// wrote: every one starts with its id, as OpenAI's do (or, written by earlier versions, with
// its custom_id).
bool starts_like_a_result(std::string_view tail) {
  for (std::string_view start : {R"({"id":"batch_req_)", R"({"custom_id":")"}) {
    const size_t n = std::min(tail.size(), start.size());
    if (tail.substr(0, n) == start.substr(0, n)) return true;
  }
  return false;
}

// The url a batch line names an endpoint by.
const char* endpoint_path(Endpoint endpoint) {
  return endpoint == Endpoint::ChatCompletions ? "/v1/chat/completions" : "/v1/completions";
}

// Tries at opening the output before giving up on a path whose file keeps being removed.
constexpr int kOutputOpenAttempts = 8;

// Whether `fd` is still the file at `path`: a run that removed the empty output it created, or
// a person, may have unlinked or replaced it since it was opened.
bool still_at(int fd, const std::filesystem::path& path) {
  struct stat opened {};
  struct stat named {};
  return ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 &&
         opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
}

}  // namespace

namespace {

// One line of the input as a request; `first_line` holds the custom_ids read so far.
BatchInput read_input_line(const std::filesystem::path& file, int number, const std::string& text,
                           std::map<std::string, int>& first_line) {
  const json object = parse_object(file, number, text);
  BatchInput input;
  input.line = number;
  input.custom_id = required_string(file, number, object, "custom_id");
  if (const auto [at, added] = first_line.emplace(input.custom_id, number); !added)
    throw error_at(file, number,
                   "custom_id: '" + input.custom_id + "' is already on line " +
                       std::to_string(at->second) + "; every request needs its own");
  if (required_string(file, number, object, "method") != "POST")
    throw error_at(file, number, "method: must be \"POST\"");
  const std::string url = required_string(file, number, object, "url");
  if (url == endpoint_path(Endpoint::ChatCompletions))
    input.endpoint = Endpoint::ChatCompletions;
  else if (url == endpoint_path(Endpoint::Completions))
    input.endpoint = Endpoint::Completions;
  else
    throw error_at(file, number,
                   "url: '" + url + "' is not /v1/chat/completions or /v1/completions");
  const auto body = object.find("body");
  if (body == object.end() || !body->is_object())
    throw error_at(file, number, "body: required, the request as a JSON object");
  input.body = *body;
  return input;
}

}  // namespace

// Every line is read, so that one run names all the bad lines there are (the first
// kBadLinesNamed of them), not one a run.
std::vector<BatchInput> read_batch_input(const std::filesystem::path& file) {
  check_readable_kind(file, /*pipe_allowed=*/true, "input");
  std::ifstream in(file);
  if (!in)
    throw BatchFileError(file.string() +
                         ": cannot open the batch input file: " + std::strerror(errno));
  std::vector<BatchInput> inputs;
  std::map<std::string, int> first_line;  // custom_id -> its line
  std::string problems;
  size_t bad_lines = 0;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (blank(text)) continue;
    try {
      inputs.push_back(read_input_line(file, number, text, first_line));
    } catch (const BatchFileError& e) {
      if (++bad_lines > kBadLinesNamed) continue;
      if (!problems.empty()) problems += '\n';
      problems += e.what();
    }
  }
  if (in.bad()) throw BatchFileError(file.string() + ": read error");
  if (bad_lines > kBadLinesNamed)
    problems += '\n' + file.string() + ": and " + std::to_string(bad_lines - kBadLinesNamed) +
                " more bad lines";
  if (!problems.empty()) throw BatchFileError(problems);
  if (inputs.empty()) throw BatchFileError(file.string() + ": no requests in the batch input file");
  return inputs;
}

namespace {

// Whether a result line carries an error: a status other than 200.
bool failed_result(const json& object) {
  const auto response = object.find("response");
  if (response == object.end() || !response->is_object()) return false;
  const auto status = response->find("status_code");
  return status != response->end() && status->is_number_integer() && *status != 200;
}

// Adds a line of the output file to `results`, once the line has proved to be a result of this
// batch (a custom_id of `expected`, an answer from the endpoint it names) and the only one of
// its custom_id (`first_line` holds those seen).
void record_result(const std::filesystem::path& file, int number, const std::string& text,
                   const std::map<std::string, Endpoint>& expected,
                   std::map<std::string, int>& first_line, OutputResults& results) {
  const json object = parse_object(file, number, text);
  const auto custom_id = object.find("custom_id");
  if (custom_id == object.end() || !custom_id->is_string())
    throw error_at(file, number, "not a result line: no custom_id string");
  if (!object.contains("response")) throw error_at(file, number, "not a result line: no response");
  const std::string id = custom_id->get<std::string>();
  const auto endpoint = expected.find(id);
  if (endpoint == expected.end())
    throw error_at(
        file, number,
        "custom_id: '" + id + "' is not in the batch input; is this the output of another batch?");
  // An answer of the other endpoint was asked by another input that used the same custom_id.
  const json& response = object.at("response");
  if (response.is_object() && response.contains("body") && response.at("body").is_object()) {
    const json& body = response.at("body");
    const auto kind = body.find("object");
    const char* wanted = answer_object(endpoint->second == Endpoint::ChatCompletions);
    if (kind != body.end() && kind->is_string() && *kind != wanted)
      throw error_at(file, number,
                     "custom_id: '" + id + "' has a " + kind->get<std::string>() +
                         " answer, where the batch input asks " +
                         std::string(endpoint_path(endpoint->second)) + " for it (a " + wanted +
                         "); is this the output of another batch?");
  }
  if (const auto [at, added] = first_line.emplace(id, number); !added)
    throw error_at(
        file, number,
        "custom_id: '" + id + "' already has a result on line " + std::to_string(at->second));
  results.ids.insert(id);
  if (failed_result(object)) results.failed.insert(id);
}

bool is_json(const std::string& text) {
  try {
    read_json_body(text);
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace

BatchOutput::BatchOutput(const std::filesystem::path& file) : path_(file) {
  check_readable_kind(file, /*pipe_allowed=*/false, "output");
  // A run that opened the file just before its creator removed it (empty) gets the lock on a
  // file no longer there once the creator closes it, and opens the path again.
  for (int attempt = 0; attempt < kOutputOpenAttempts; ++attempt) {
    int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    created_ = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0)
      throw BatchFileError(file.string() +
                           ": cannot open the batch output file: " + std::strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int why = errno;
      ::close(fd);
      throw BatchFileError(
          file.string() +
          (why == EWOULDBLOCK
               ? ": another pipeline batch is writing this output file"
               : ": cannot lock the batch output file: " + std::string(std::strerror(why))));
    }
    if (!still_at(fd, file)) {
      ::close(fd);
      continue;
    }
    file_ = ::fdopen(fd, "a");
    if (file_ == nullptr) {
      const int why = errno;
      ::close(fd);
      throw BatchFileError(file.string() +
                           ": cannot open the batch output file: " + std::strerror(why));
    }
    remove_unfinished_rewrites();
    return;
  }
  throw BatchFileError(file.string() +
                       ": the batch output file was removed or replaced while "
                       "this run opened it, " +
                       std::to_string(kOutputOpenAttempts) + " times running");
}

BatchOutput::~BatchOutput() {
  const int fd = ::fileno(file_);
  struct stat opened {};
  if (created_ && std::fflush(file_) == 0 && ::fstat(fd, &opened) == 0 && opened.st_size == 0 &&
      still_at(fd, path_))
    ::unlink(path_.c_str());
  std::fclose(file_);
}

// A rewrite's file is made while its run holds the output's lock, and renamed over the output
// before the lock goes: one that is still there, seen under the lock, was left by a run killed
// in between.
void BatchOutput::remove_unfinished_rewrites() const {
  const std::string prefix = path_.filename().string() + kRewriteSuffix;
  std::error_code error;
  const auto folder = path_.has_parent_path() ? path_.parent_path() : ".";
  std::error_code ignored;  // a cleanup that cannot see or remove a file leaves it
  for (std::filesystem::directory_iterator it(folder, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() > prefix.size() && name.starts_with(prefix) &&
        std::all_of(name.begin() + long(prefix.size()), name.end(),
                    [](unsigned char c) { return std::isdigit(c); }))
      std::filesystem::remove(it->path(), ignored);
  }
}

size_t BatchOutput::drop_failed_results() {
  std::string kept;
  size_t dropped = 0;
  {
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw BatchFileError(path_.string() + ": cannot read the batch output file back");
    for (std::string text; std::getline(in, text);) {
      if (blank(text)) continue;
      if (failed_result(read_json_body(text))) {
        ++dropped;
      } else {
        kept += text;
        kept += '\n';
      }
    }
  }
  if (dropped == 0) return 0;
  // The kept lines go to a new file beside the output, locked before it takes the output's
  // name: a run that opens the name from then on finds it held, and one that opened the old
  // file finds, once it gets its lock, that the name is another file's (BatchOutput's check).
  const std::filesystem::path next = path_.string() + kRewriteSuffix + std::to_string(::getpid());
  const int fd = ::open(next.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  auto fail = [&](const char* what) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    std::error_code ignored;
    std::filesystem::remove(next, ignored);
    return BatchFileError(next.string() + ": " + what + ": " + why);
  };
  if (fd < 0) throw fail("cannot create the output without its failed results");
  struct stat old {};
  if (::fstat(::fileno(file_), &old) != 0 || ::fchmod(fd, old.st_mode & 07777) != 0)
    throw fail("cannot give it the output's permissions");
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) throw fail("cannot lock it");
  if (::write(fd, kept.data(), kept.size()) != ssize_t(kept.size()) || ::fsync(fd) != 0)
    throw fail("cannot write it");
  if (::rename(next.c_str(), path_.c_str()) != 0) throw fail("cannot rename it to the output");
  std::FILE* replaced = ::fdopen(fd, "a");
  if (replaced == nullptr) throw fail("cannot open it");
  std::fclose(file_);
  file_ = replaced;
  return dropped;
}

OutputResults finished_in_output(const std::filesystem::path& file,
                                 const std::map<std::string, Endpoint>& expected) {
  OutputResults finished;
  if (!std::filesystem::exists(file)) return finished;
  check_readable_kind(file, /*pipe_allowed=*/false, "output");
  std::string contents;
  {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw BatchFileError(file.string() + ": cannot open the batch output file");
    std::ostringstream all;
    all << in.rdbuf();
    contents = all.str();
  }
  // Everything after the last newline was being written when the run stopped. The file changes
  // only once every whole line has proved to be a result, so that a file that is no batch
  // output (the input, say) is refused, never cut.
  const size_t complete = contents.rfind('\n') == std::string::npos ? 0 : contents.rfind('\n') + 1;
  const std::string torn = contents.substr(complete);
  contents.resize(complete);
  std::istringstream lines(std::move(contents));
  std::map<std::string, int> first_line;
  std::string text;
  int number = 1;
  for (; std::getline(lines, text); ++number)
    if (!blank(text)) record_result(file, number, text, expected, first_line, finished);
  if (torn.empty() || blank(torn)) return finished;
  if (is_json(torn)) {
    // A whole line whose newline was not written: a result like any other, or a refusal.
    record_result(file, number, torn, expected, first_line, finished);
    std::ofstream(file, std::ios::app | std::ios::binary) << '\n';
  } else if (starts_like_a_result(torn)) {
    std::filesystem::resize_file(file, complete);  // cut off while it was written
  } else {
    throw error_at(file, number, "not a result line (and no newline at its end)");
  }
  return finished;
}

std::string batch_output_line(const BatchInput& input, const std::string& request_id,
                              int status_code, const ResponseJson& body) {
  const ResponseJson line = {
      {"id", "batch_req_" + std::to_string(input.line)},
      {"custom_id", input.custom_id},
      {"response",
       {{"status_code", status_code},
        {"request_id", request_id.empty() ? json(nullptr) : json(request_id)},
        {"body", body}}},
      {"error", nullptr}};
  return to_json_text(line) + "\n";
}

}  // namespace pipeline
