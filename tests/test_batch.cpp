// Offline batches: the batch file formats (every input problem named by file, line and field;
// the output as the record of what is done, a torn last line dropped), and `pipeline batch` on
// stories260K: answers equal to the API's, refusals as error lines, a resumed run that does
// only what is missing, and SIGINT (once, or twice to cut the grace) that leaves a batch a
// rerun completes.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/engine.h"
#include "graph/serve_config.h"
#include "server/batch_file.h"
#include "server/batch_runner.h"
#include "tests/support/command.h"
#include "tests/support/server_process.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using json = nlohmann::json;
using testing::make_temp_dir;
using testing::run_pipeline;
using testing::run_shell;
using testing::shell_quoted;

class BatchTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("batch"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The message read_batch_input throws for a file of `text`.
  std::string input_error(const std::string& text) {
    const auto path = write("in.jsonl", text);
    try {
      read_batch_input(path);
    } catch (const BatchFileError& e) {
      return e.what();
    }
    return "no error";
  }

  std::filesystem::path dir_;
};

// prefix + number, built by appending (GCC 12 warns falsely about "literal" + std::string).
std::string numbered(const char* prefix, size_t number) {
  std::string text = prefix;
  text += std::to_string(number);
  return text;
}

std::string request_line(const std::string& custom_id, const std::string& url, const json& body) {
  return json{{"custom_id", custom_id}, {"method", "POST"}, {"url", url}, {"body", body}}.dump() +
         "\n";
}

std::vector<json> lines_of(const std::filesystem::path& file) {
  std::vector<json> lines;
  std::ifstream in(file);
  for (std::string text; std::getline(in, text);) lines.push_back(json::parse(text));
  return lines;
}

std::string contents(const std::filesystem::path& file) {
  std::ostringstream all;
  all << std::ifstream(file, std::ios::binary).rdbuf();
  return all.str();
}

TEST_F(BatchTest, InputLinesAreReadInOrderSkippingBlankOnes) {
  const json body = {{"model", "m"}, {"prompt", "x"}};
  const auto path = write("in.jsonl", request_line("a", "/v1/chat/completions", body) + "\n  \n" +
                                          request_line("b", "/v1/completions", body));
  const auto inputs = read_batch_input(path);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0].custom_id, "a");
  EXPECT_EQ(inputs[0].line, 1);
  EXPECT_EQ(inputs[0].endpoint, Endpoint::ChatCompletions);
  EXPECT_EQ(inputs[1].custom_id, "b");
  EXPECT_EQ(inputs[1].line, 4);  // after an empty line and one of spaces
  EXPECT_EQ(inputs[1].endpoint, Endpoint::Completions);
  EXPECT_EQ(inputs[1].body, body);
}

TEST_F(BatchTest, EveryInputProblemNamesFileLineAndField) {
  const std::string good = request_line("a", "/v1/completions", {{"prompt", "x"}});
  const std::string file = (dir_ / "in.jsonl").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good + "{\"custom_id\": \"b\",", ":2: not JSON: parse error at column 19: "},
      {good + "[1, 2]\n", ":2: not a JSON object"},
      {good + R"({"method": "POST", "url": "/v1/completions", "body": {}})"
              "\n",
       ":2: custom_id: required, a non-empty string"},
      {good + R"({"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {}})"
              "\n",
       ":2: custom_id: must be a non-empty string, not a number"},
      {good + "\"Hi \xff\n", ":2: not JSON: "},
      {good + std::string("{\"custom_id\": \"b\"}\0junk\n", 24),
       ":2: not JSON: parse error at column 19: syntax error while parsing value - unexpected "
       "NUL byte"},
      {good + good, ":2: custom_id: 'a' is already on line 1"},
      {R"({"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}})"
       "\n",
       ":1: method: must be \"POST\""},
      {R"({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}})"
       "\n",
       ":1: url: '/v1/embeddings' is not /v1/chat/completions or /v1/completions"},
      {R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": "x"})"
       "\n",
       ":1: body: required, the request as a JSON object"},
      {R"({"custom_id": "a", "method": "POST", "url": "/v1/completions"})"
       "\n",
       ":1: body: required"},
      {R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"x": )" +
           std::string(100000, '[') + std::string(100000, ']') + "}}\n",
       ":1: the body nests arrays and objects deeper than 1000 levels"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = input_error(text);
    EXPECT_NE(message.find(file + expected), std::string::npos) << message;
  }
  EXPECT_EQ(input_error(good + "\"Hi \xff\n").find('\xff'), std::string::npos)
      << "a byte no terminal shows is written \\xff";
  EXPECT_NE(input_error("\n\n").find(file + ": no requests"), std::string::npos);
  // A body nested as deep as a request may be (1000 levels) is a line like any other.
  EXPECT_EQ(input_error(R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", )"
                        R"("body": {"x": )" +
                        std::string(999, '[') + std::string(999, ']') + "}}\n"),
            "no error");
  EXPECT_THROW(read_batch_input(dir_ / "missing.jsonl"), BatchFileError);
}

// One reading names every bad line, the first 20 of them, and counts the rest.
TEST_F(BatchTest, EveryBadLineIsNamedInOneReading) {
  const std::string good = request_line("a", "/v1/completions", {{"prompt", "x"}});
  const std::string file = (dir_ / "in.jsonl").string();
  const std::string two_bad = "[1]\n" + good + "{\"custom_id\": \"b\"}\n";
  const std::string message = input_error(two_bad);
  EXPECT_NE(message.find(file + ":1: not a JSON object\n" + file + ":3: method: required"),
            std::string::npos)
      << message;
  std::string many_bad = good;
  for (int i = 0; i < 25; ++i) many_bad += "[1]\n";
  const std::string many = input_error(many_bad);
  EXPECT_NE(many.find(file + ":21: not a JSON object\n"), std::string::npos) << many;
  EXPECT_EQ(many.find(file + ":22:"), std::string::npos) << many;
  EXPECT_NE(many.find(file + ": and 5 more bad lines"), std::string::npos) << many;
}

TEST_F(BatchTest, OutputIsTheRecordOfWhatIsDoneAndATornLastLineIsDropped) {
  const std::map<std::string, Endpoint> expected = {
      {"a", Endpoint::Completions}, {"b", Endpoint::Completions}, {"c", Endpoint::Completions}};
  EXPECT_TRUE(finished_in_output(dir_ / "none.jsonl", expected).ids.empty());

  BatchInput a{1, "a", Endpoint::Completions, {}}, b{2, "b", Endpoint::Completions, {}};
  const std::string complete = batch_output_line(a, "cmpl-1", 200, {{"x", 1}}) +
                               batch_output_line(b, "", 400, {{"error", {{"message", "no"}}}});
  BatchInput c{3, "c", Endpoint::Completions, {}};
  const std::string torn = batch_output_line(c, "cmpl-3", 200, {{"x", 1}});
  const auto out = write("out.jsonl", complete + torn.substr(0, torn.size() / 2));
  const OutputResults results = finished_in_output(out, expected);
  EXPECT_EQ(results.ids, (std::set<std::string>{"a", "b"}));
  EXPECT_EQ(results.failed, (std::set<std::string>{"b"}));
  EXPECT_EQ(contents(out), complete);  // the torn line is gone, the rest kept byte for byte
  // Earlier versions wrote custom_id first: their torn lines are known too.
  const auto earlier = write("earlier.jsonl", complete + R"({"custom_id":"c","id":"batch_r)");
  EXPECT_EQ(finished_in_output(earlier, expected).ids, (std::set<std::string>{"a", "b"}));
  EXPECT_EQ(contents(earlier), complete);

  write("other.jsonl", complete);
  try {
    finished_in_output(dir_ / "other.jsonl", {{"a", Endpoint::Completions}});
    FAIL() << "an output naming a custom_id the input lacks was accepted";
  } catch (const BatchFileError& e) {
    EXPECT_NE(std::string(e.what()).find("other.jsonl:2: custom_id: 'b' is not in the batch input"),
              std::string::npos)
        << e.what();
  }
  // A file that is no output is refused and left as it is, even a last line with no newline.
  const std::string not_outputs[] = {complete + "not a result", R"({"custom_id": "a"})",
                                     "{\"custom_id\": \"a\"}\n{\"custom_id\": \"b\"}"};
  for (const std::string& text : not_outputs) {
    const auto file = write("not_output.jsonl", text);
    EXPECT_THROW(finished_in_output(file, expected), BatchFileError) << text;
    EXPECT_EQ(contents(file), text);
  }
  // A whole last line without its newline is a line like any other: this batch's result is
  // kept (and its newline added), another batch's is refused, the file untouched.
  const std::string whole = torn.substr(0, torn.size() - 1);
  const auto unterminated = write("unterminated.jsonl", complete + whole);
  EXPECT_EQ(finished_in_output(unterminated, expected).ids, (std::set<std::string>{"a", "b", "c"}));
  EXPECT_EQ(contents(unterminated), complete + torn);
  const auto foreign = write("foreign.jsonl", whole);
  try {
    finished_in_output(foreign, {{"a", Endpoint::Completions}});
    FAIL() << "another batch's result with no newline was accepted";
  } catch (const BatchFileError& e) {
    EXPECT_NE(std::string(e.what()).find("foreign.jsonl:1: custom_id: 'c' is not in the batch"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(contents(foreign), whole);
  // The same custom_ids asked of the other endpoint: another batch's answers.
  const auto chat =
      write("chat.jsonl", batch_output_line(a, "cmpl-1", 200, {{"object", "text_completion"}}));
  try {
    finished_in_output(chat, {{"a", Endpoint::ChatCompletions}});
    FAIL() << "a completion was taken for the chat completion the input asks";
  } catch (const BatchFileError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "chat.jsonl:1: custom_id: 'a' has a text_completion answer, where the batch "
                  "input asks /v1/chat/completions for it (a chat.completion)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(finished_in_output(chat, expected).ids, (std::set<std::string>{"a"}));
  write("bad.jsonl", "not json\n" + complete);
  EXPECT_THROW(finished_in_output(dir_ / "bad.jsonl", expected), BatchFileError);
  write("twice.jsonl", complete + batch_output_line(a, "cmpl-2", 200, {}));
  EXPECT_THROW(finished_in_output(dir_ / "twice.jsonl", expected), BatchFileError);
}

// Two runs on one output would both find the same results missing and write each twice: the
// output is held by one run at a time.
TEST_F(BatchTest, OneRunAtATimeHoldsTheOutput) {
  const auto out = dir_ / "out.jsonl";
  {
    const BatchOutput first(out);
    try {
      const BatchOutput second(out);
      FAIL() << "a second run opened the output the first holds";
    } catch (const BatchFileError& e) {
      EXPECT_NE(std::string(e.what()).find("another pipeline batch is writing this output file"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(BatchOutput{out});  // held until closed
  const auto message = [&](const std::filesystem::path& file) {
    try {
      const BatchOutput output(file);
    } catch (const BatchFileError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(dir_ / "no-dir" / "out.jsonl").find("No such file or directory"),
            std::string::npos);
}

// The failed requests' lines are removed, the others kept byte for byte, in a file that is held
// as the old one was.
TEST_F(BatchTest, DroppingFailedResultsKeepsTheRestAndTheLock) {
  BatchInput a{1, "a", Endpoint::Completions, {}}, b{2, "b", Endpoint::Completions, {}},
      c{3, "c", Endpoint::Completions, {}};
  const std::string ok_a = batch_output_line(a, "cmpl-1", 200, {{"x", 1}});
  const std::string ok_c = batch_output_line(c, "cmpl-3", 200, {{"x", 3}});
  const auto out =
      write("out.jsonl", ok_a + batch_output_line(b, "", 400, {{"error", {{"message", "no"}}}}) +
                             ok_c + batch_output_line(b, "cmpl-2", 500, {{"error", {}}}));
  using std::filesystem::perms;
  const perms mode = perms::owner_read | perms::owner_write | perms::group_read;
  std::filesystem::permissions(out, mode);
  BatchOutput output(out);
  EXPECT_EQ(output.drop_failed_results(), 2u);
  EXPECT_EQ(contents(out), ok_a + ok_c);
  EXPECT_EQ(std::filesystem::status(out).permissions(), mode);
  EXPECT_EQ(output.drop_failed_results(), 0u);
  EXPECT_THROW(BatchOutput{out}, BatchFileError) << "the new file is not held";
  std::fputs("{}\n", output.get());
  std::fflush(output.get());
  EXPECT_EQ(contents(out), ok_a + ok_c + "{}\n") << "lines go to the new file";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            1)
      << "a file was left beside the output";
}

// Two runs started together on a new output: the one that does not get it leaves it alone, and
// the file the other created is removed only if that one, still holding it, wrote nothing.
TEST_F(BatchTest, TheRunThatLosesTheOutputLeavesItToTheOther) {
  const auto out = dir_ / "new.jsonl";
  {
    const BatchOutput winner(out);
    EXPECT_THROW(BatchOutput{out}, BatchFileError);
    EXPECT_TRUE(std::filesystem::exists(out)) << "the losing run removed the winner's output";
    std::fputs("{}\n", winner.get());
  }
  EXPECT_EQ(std::filesystem::file_size(out), 3u) << "the winner's line is kept";
  std::filesystem::remove(out);
  { const BatchOutput empty(out); }
  EXPECT_FALSE(std::filesystem::exists(out)) << "a created output left empty is removed";
  write("existing.jsonl", "");
  { const BatchOutput existing(dir_ / "existing.jsonl"); }
  EXPECT_TRUE(std::filesystem::exists(dir_ / "existing.jsonl")) << "only a created one is removed";
}

// /dev/zero reads on without end: a read of it as the input, or as the output a rerun scans,
// grew without bound until memory ran out. A pipe is an input that ends, not an output.
TEST_F(BatchTest, ADeviceIsRefusedAsInputOrOutputAndAPipeAsOutput) {
  const auto message_of = [](const auto& read) {
    try {
      read();
    } catch (const BatchFileError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message_of([] { read_batch_input("/dev/zero"); }),
            "/dev/zero: the batch input must be a regular file or a pipe");
  EXPECT_EQ(message_of([] {
              finished_in_output("/dev/zero", {{"a", Endpoint::Completions}});
            }),
            "/dev/zero: the batch output must be a regular file, which a rerun reads back to "
            "resume");

  const std::filesystem::path fifo = dir_ / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(message_of([&] {
              finished_in_output(fifo, {{"a", Endpoint::Completions}});
            }),
            fifo.string() +
                ": the batch output must be a regular file, which a rerun reads "
                "back to resume");
  std::thread writer([&] {
    std::ofstream(fifo) << R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", )"
                        << R"("body": {"prompt": "x"}})"
                        << "\n";
  });
  const std::vector<BatchInput> inputs = read_batch_input(fifo);
  writer.join();
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].custom_id, "a");
}

TEST_F(BatchTest, OutputLineHasOpenAIsBatchShape) {
  BatchInput input{4, "q", Endpoint::ChatCompletions, {}};
  const std::string text = batch_output_line(input, "chatcmpl-9", 200, {{"object", "x"}});
  ASSERT_EQ(text.back(), '\n');
  // In OpenAI's order: id, custom_id, response {status_code, request_id, body}, error.
  EXPECT_TRUE(text.starts_with(R"({"id":"batch_req_4","custom_id":"q","response":{"status_code")"))
      << text;
  EXPECT_NE(text.find(R"(},"error":null})"), std::string::npos) << text;
  const json line = json::parse(text);
  EXPECT_EQ(line["id"], "batch_req_4");
  EXPECT_EQ(line["custom_id"], "q");
  EXPECT_EQ(line["response"]["status_code"], 200);
  EXPECT_EQ(line["response"]["request_id"], "chatcmpl-9");
  EXPECT_EQ(line["response"]["body"]["object"], "x");
  EXPECT_TRUE(line["error"].is_null());
  EXPECT_TRUE(
      json::parse(batch_output_line(input, "", 400, {}))["response"]["request_id"].is_null());
}

// ---- `pipeline batch` on stories260K

constexpr const char* kModel = "stories260K";

class BatchCommandTest : public BatchTest {
 protected:
  void SetUp() override {
    BatchTest::SetUp();
    config_ = write("batch.yaml",
                    testing::stories_config("scheduler:\n  window_ms: 10\n  max_num_seqs: 16\n"
                                            "  max_batch: 16\n"));
  }
  // The batch command line for sh, to run it in the background and signal it.
  std::string shell_command(const std::filesystem::path& in,
                            const std::filesystem::path& out) const {
    return shell_quoted(testing::pipeline_binary().string()) + " batch " +
           shell_quoted(config_.string()) + " --input " + shell_quoted(in.string()) + " --output " +
           shell_quoted(out.string());
  }
  testing::CommandResult batch(const std::filesystem::path& in, const std::filesystem::path& out,
                               std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"batch",     config_.string(), "--input",
                                     in.string(), "--output",       out.string()};
    args.insert(args.end(), more.begin(), more.end());
    return run_pipeline(args);
  }
  std::filesystem::path config_;
};

json completion(const std::string& prompt, int max_tokens) {
  return {{"model", kModel}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

json chat(const std::string& question, int max_tokens) {
  return {{"model", kModel},
          {"messages", {{{"role", "user"}, {"content", question}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// Six requests the model answers (greedy; one with two choices), and two the API refuses.
std::string mixed_batch() {
  std::string text;
  const std::vector<std::string> prompts = {"Once upon a time", "The dog", "Lily wanted to",
                                            "One day"};
  for (size_t i = 0; i < prompts.size(); ++i)
    text += request_line(numbered("c", i), "/v1/completions", completion(prompts[i], 24));
  text += request_line("chat0", "/v1/chat/completions", chat("Tell me a story.", 24));
  json two = chat("What is a cat?", 24);
  two["n"] = 2;
  text += request_line("chat1", "/v1/chat/completions", two);
  json hot = completion("x", 4);
  hot["temperature"] = 5;
  text += request_line("too-hot", "/v1/completions", hot);
  json streamed = chat("x", 4);
  streamed["stream"] = true;
  text += request_line("streamed", "/v1/chat/completions", streamed);
  return text;
}

std::map<std::string, json> by_custom_id(const std::vector<json>& lines) {
  std::map<std::string, json> results;
  for (const auto& line : lines) results[line["custom_id"]] = line;
  return results;
}

TEST_F(BatchCommandTest, AnswersEveryRequestAsTheApiWouldAndRefusalsAsErrorLines) {
  const auto in = write("in.jsonl", mixed_batch());
  const auto out = dir_ / "out.jsonl";
  const auto result = batch(in, out);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("done: all 8 requests have results"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("(8 this run; 2 failed, their lines carry the error)"),
            std::string::npos)
      << result.err;
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 8u);
  auto results = by_custom_id(lines);
  ASSERT_EQ(results.size(), 8u);

  // A completion's text is `pipeline generate`'s, greedy, as the server's is.
  const auto reference =
      run_pipeline({"generate", "--model", testing::shared_path("models/stories260K").string(),
                    "--device", "cpu", "--temperature", "0", "--json", "--max-tokens", "24",
                    "--prompt", "Once upon a time"});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const json& c0 = results["c0"]["response"];
  EXPECT_EQ(c0["status_code"], 200);
  EXPECT_EQ(c0["body"]["object"], "text_completion");
  EXPECT_EQ(c0["body"]["choices"][0]["text"], json::parse(reference.out)["text"]);
  EXPECT_EQ(c0["request_id"], c0["body"]["id"]);
  for (const char* id : {"c1", "c2", "c3"}) {
    EXPECT_EQ(results[id]["response"]["status_code"], 200) << id;
    EXPECT_FALSE(results[id]["response"]["body"]["choices"][0]["text"].get<std::string>().empty());
  }
  for (const char* id : {"chat0", "chat1"}) {
    const json& body = results[id]["response"]["body"];
    EXPECT_EQ(body["object"], "chat.completion") << id;
    EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant") << id;
    EXPECT_GT(body["usage"]["completion_tokens"].get<int>(), 0) << id;
  }
  const json& two = results["chat1"]["response"]["body"];
  ASSERT_EQ(two["choices"].size(), 2u);
  EXPECT_EQ(two["choices"][1]["index"], 1);
  EXPECT_EQ(two["choices"][0]["message"], two["choices"][1]["message"]) << "greedy choices";
  EXPECT_EQ(two["usage"]["completion_tokens"].get<int>() % 2, 0);
  const json& hot = results["too-hot"]["response"];
  EXPECT_EQ(hot["status_code"], 400);
  EXPECT_EQ(hot["body"]["error"]["param"], "temperature");
  EXPECT_TRUE(hot["request_id"].is_null());
  EXPECT_EQ(results["streamed"]["response"]["body"]["error"]["param"], "stream");
  // The refusals are named on stderr by their line, and the progress line counts the tokens;
  // the engine's line per request is left out unless asked for.
  EXPECT_NE(result.err.find("in.jsonl:7 (custom_id too-hot) failed with 400"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("8/8 done, 2 failed, 0 in flight, "), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("8/8 done, 2 failed, 0 in flight, 0 tokens"), std::string::npos)
      << result.err;
  for (const char* per_request_or_pass : {" added: ", "prefilled ", "decoded "})
    EXPECT_EQ(result.err.find(per_request_or_pass), std::string::npos) << result.err;
  const auto logged =
      batch(in, dir_ / "logged.jsonl",
            {"--set", "server.log_requests=true", "--set", "scheduler.log_passes=true"});
  ASSERT_EQ(logged.exit_code, 0) << logged.err;
  EXPECT_NE(logged.err.find("request cmpl-"), std::string::npos) << logged.err;
  for (const char* per_request_or_pass : {" added: ", "prefilled ", "decoded "})
    EXPECT_NE(logged.err.find(per_request_or_pass), std::string::npos) << logged.err;

  // Run again: nothing left to do, the model is not even loaded.
  const auto again = batch(in, out);
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_NE(again.err.find("all 8 requests of"), std::string::npos) << again.err;
  EXPECT_EQ(lines_of(out).size(), 8u);
}

// A line is answered with the first error of its choices; the others end with it rather than
// run to their end for nothing (and are not counted as cancelled by a client).
TEST_F(BatchCommandTest, ALineWhoseChoiceFailsEndsItsOtherChoicesWithItsError) {
  std::string too_long;
  for (int i = 0; i < 600; ++i) too_long += "word ";
  json body = completion("Once upon a time", 480);
  body["prompt"] = {"Once upon a time", too_long};
  body["ignore_eos"] = true;
  const auto in = write("in.jsonl", request_line("mixed", "/v1/completions", body));
  const auto out = dir_ / "out.jsonl";
  // The engine's log line per request says how the first choice ended.
  const auto result = batch(in, out, {"--set", "server.log_requests=true"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["response"]["status_code"], 400);
  EXPECT_EQ(lines[0]["response"]["body"]["error"]["param"], "prompt");
  EXPECT_NE(result.err.find("-0 failed (400)"), std::string::npos)
      << "the first prompt's choice ran on:\n"
      << result.err;
}

TEST_F(BatchCommandTest, ResumesWithOnlyWhatIsMissing) {
  const auto in = write("in.jsonl", mixed_batch());
  const auto full = dir_ / "full.jsonl";
  ASSERT_EQ(batch(in, full).exit_code, 0);
  // As an interrupted run leaves it: three lines, and a fourth cut off while being written.
  std::istringstream lines(contents(full));
  std::string kept, text;
  for (int i = 0; i < 3 && std::getline(lines, text); ++i) kept += text + "\n";
  std::getline(lines, text);
  const auto out = write("out.jsonl", kept + text.substr(0, text.size() / 2));

  const auto result = batch(in, out);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("resuming: 3 of 8 requests already have results"), std::string::npos)
      << result.err;
  // Progress counts the whole batch, the 3 requests earlier runs did among them.
  EXPECT_NE(result.err.find("pipeline batch: 8/8 done"), std::string::npos) << result.err;
  const std::string resumed = contents(out);
  EXPECT_EQ(resumed.substr(0, kept.size()), kept);  // what was done stays as it was
  const auto after = lines_of(out);
  ASSERT_EQ(after.size(), 8u);
  const auto results = by_custom_id(after);
  ASSERT_EQ(results.size(), 8u);  // every request once
  // Greedy answers do not depend on which run produced them.
  for (auto [id, line] : by_custom_id(lines_of(full))) {
    const json& body = results.at(id)["response"]["body"];
    if (line["response"]["status_code"] != 200) continue;
    EXPECT_EQ(body["choices"][0].value("text", ""),
              line["response"]["body"]["choices"][0].value("text", ""))
        << id;
    EXPECT_EQ(body["choices"][0].value("message", json::object()).value("content", ""),
              line["response"]["body"]["choices"][0]
                  .value("message", json::object())
                  .value("content", ""))
        << id;
  }
}

// A request refused for a bad field, fixed in the input: a rerun keeps the error (and says how
// to answer it again), one with --retry-failed answers it, and the output holds one line per
// request.
TEST_F(BatchCommandTest, RetryFailedAnswersAgainTheRequestsWhoseLinesAreErrors) {
  json bad = completion("Once upon a time", 8);
  bad["temperature"] = -1;
  const std::string good_line = request_line("good", "/v1/completions", completion("Hi", 8));
  const auto in = write("in.jsonl", good_line + request_line("fixed", "/v1/completions", bad));
  const auto out = dir_ / "out.jsonl";
  ASSERT_EQ(batch(in, out).exit_code, 0);
  const std::string good_result = by_custom_id(lines_of(out)).at("good").dump();
  EXPECT_EQ(by_custom_id(lines_of(out)).at("fixed")["response"]["status_code"], 400);

  write("in.jsonl",
        good_line + request_line("fixed", "/v1/completions", completion("Once upon a time", 8)));
  const auto kept = batch(in, out);
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_NE(kept.err.find("all 2 requests of " + in.string() + " already have results in " +
                          out.string() + "; 1 of them failed (--retry-failed answers those again)"),
            std::string::npos)
      << kept.err;

  const auto retried = batch(in, out, {"--retry-failed"});
  ASSERT_EQ(retried.exit_code, 0) << retried.err;
  EXPECT_NE(retried.err.find("resuming: 1 of 2 requests already have results; answering again "
                             "the 1 whose results were errors"),
            std::string::npos)
      << retried.err;
  const auto after = lines_of(out);
  ASSERT_EQ(after.size(), 2u);
  const auto results = by_custom_id(after);
  EXPECT_EQ(results.at("good").dump(), good_result);
  EXPECT_EQ(results.at("fixed")["response"]["status_code"], 200);
  EXPECT_EQ(results.at("fixed")["response"]["body"]["usage"]["completion_tokens"], 8);
}

// A --retry-failed run killed between writing the kept lines and renaming them over the output
// left that file (OUT.retry-PID) behind; the next run on the output removes it, and nothing
// else beside it.
TEST_F(BatchCommandTest, ARewriteAKilledRunLeftIsRemovedByTheNext) {
  const auto in = write("in.jsonl", request_line("a", "/v1/completions", completion("Hi", 2)));
  const auto out = dir_ / "out.jsonl";
  const auto left = write("out.jsonl.retry-4242", "{}\n");
  const auto others = {write("out.jsonl.retry-", "x"), write("out.jsonl.retry-12a", "x"),
                       write("other.jsonl.retry-4242", "x")};
  const auto result = batch(in, out);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_FALSE(std::filesystem::exists(left));
  for (const auto& other : others) EXPECT_TRUE(std::filesystem::exists(other)) << other;
}

TEST_F(BatchCommandTest, UsageAndInputErrorsStopBeforeTheModelLoads) {
  auto result = run_pipeline({"batch", config_.string(), "--output", (dir_ / "o").string()});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--input"), std::string::npos) << result.err;
  const auto in = write("in.jsonl", request_line("a", "/v1/completions", completion("x", 4)) +
                                        "{\"custom_id\": \"b\"}\n");
  result = batch(in, dir_ / "out.jsonl");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("in.jsonl:2: method: required"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("engine:"), std::string::npos) << "the model loaded: " << result.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.jsonl"));

  // The input as its own output (a last line with no newline looked like a torn result, and was
  // cut off before any line was checked).
  const std::string text = request_line("a", "/v1/completions", completion("x", 4));
  const auto same = write("same.jsonl", text.substr(0, text.size() - 1));
  result = batch(same, same);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("is the input file"), std::string::npos) << result.err;
  EXPECT_EQ(contents(same), text.substr(0, text.size() - 1));
}

// A model that fails to load ends the run before its first result: the output file it would
// have created is not left behind empty.
TEST_F(BatchCommandTest, ARunThatFailsBeforeItsFirstResultLeavesNoOutputFile) {
  const auto in = write("in.jsonl", request_line("a", "/v1/completions", completion("x", 4)));
  const auto out = dir_ / "out.jsonl";
  const auto result = run_pipeline({"batch", config_.string(), "--input", in.string(), "--output",
                                    out.string(), "--model", (dir_ / "no-model").string()});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("no-model"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

// A loop of symbolic links as the output failed with the standard library's words alone.
TEST_F(BatchCommandTest, AnOutputThatIsALoopOfLinksIsNamed) {
  const auto in = write("in.jsonl", request_line("a", "/v1/completions", completion("Hi", 2)));
  const auto loop = dir_ / "loop";
  std::filesystem::create_symlink(loop, loop);
  const auto result = batch(in, loop);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find(loop.string() + ": cannot open the batch output file: Too many levels"),
            std::string::npos)
      << result.err;
}

// `count` requests that each generate exactly `tokens` tokens, r0, r1, ...
std::string long_requests(int count, int tokens) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    json body = completion(numbered("Once upon a time ", size_t(i)), tokens);
    body["ignore_eos"] = true;
    text += request_line(numbered("r", size_t(i)), "/v1/completions", body);
  }
  return text;
}

// SIGINT once the first results are written: the run stops submitting, writes what is in flight
// and exits 130 with every line whole; the same command then finishes the batch.
TEST_F(BatchCommandTest, SigintLeavesABatchTheSameCommandCompletes) {
  const auto in = write("in.jsonl", long_requests(300, 64));
  const auto out = dir_ / "out.jsonl";
  const std::string command = shell_command(in, out);
  const auto interrupted =
      run_shell(command + " 2>&1 & pid=$!; while [ ! -s " + shell_quoted(out.string()) +
                " ]; do sleep 0.02; done; kill -INT $pid; wait $pid; echo \"exit $?\"");
  EXPECT_NE(interrupted.out.find("exit 130"), std::string::npos) << interrupted.out;
  EXPECT_NE(interrupted.out.find("interrupted: "), std::string::npos) << interrupted.out;
  // The last progress line, once stopped, foresees no time left.
  const size_t last_progress = interrupted.out.rfind(" done, ");
  ASSERT_NE(last_progress, std::string::npos) << interrupted.out;
  EXPECT_EQ(interrupted.out.find(" s left", last_progress), std::string::npos) << interrupted.out;
  const auto partial = lines_of(out);  // every line parses: none was cut
  EXPECT_GT(partial.size(), 0u);
  EXPECT_LT(partial.size(), 300u);
  for (const auto& line : partial) EXPECT_EQ(line["response"]["status_code"], 200);

  const auto finished = batch(in, out);
  ASSERT_EQ(finished.exit_code, 0) << finished.err;
  const auto all = lines_of(out);
  EXPECT_EQ(all.size(), 300u);
  EXPECT_EQ(by_custom_id(all).size(), 300u);
  for (const auto& line : all)
    EXPECT_EQ(line["response"]["body"]["usage"]["completion_tokens"], 64) << line["custom_id"];
}

// SIGHUP (the terminal that started the run closing) stops the run as SIGINT does, rather than
// ending the process with requests in flight.
TEST_F(BatchCommandTest, SighupStopsTheRunAsSigintDoes) {
  const auto in = write("in.jsonl", long_requests(300, 64));
  const auto out = dir_ / "out.jsonl";
  const auto interrupted = run_shell(
      shell_command(in, out) + " 2>&1 & pid=$!; while [ ! -s " + shell_quoted(out.string()) +
      " ]; do sleep 0.02; done; kill -HUP $pid; wait $pid; " + "echo \"exit $?\"");
  EXPECT_NE(interrupted.out.find("SIGHUP received, submitting nothing more"), std::string::npos)
      << interrupted.out;
  EXPECT_NE(interrupted.out.find("exit 130"), std::string::npos) << interrupted.out;
  const auto partial = lines_of(out);  // every line parses: none was cut
  EXPECT_GT(partial.size(), 0u);
  EXPECT_LT(partial.size(), 300u);
}

// Progress piped to a reader that is gone (`2>&1 | head`) does not end the run with SIGPIPE: its
// writes fail, and every result still reaches the output. The reader here exits at once, before
// the batch (started 0.3 s later) writes anything.
TEST_F(BatchCommandTest, AProgressReaderGoneDoesNotEndTheRun) {
  const auto in = write("in.jsonl", long_requests(6, 8));
  const auto out = dir_ / "out.jsonl";
  const auto result = run_shell("exec 3>&1; { sleep 0.3; " + shell_command(in, out) +
                                " 2>&1; echo \"exit $?\" >&3; } | true");
  EXPECT_NE(result.out.find("exit 0"), std::string::npos) << result.out;
  EXPECT_EQ(by_custom_id(lines_of(out)).size(), 6u);
}

// A stop that comes once every request is in flight cuts nothing short when the grace finishes
// them all: the batch is complete, not interrupted (the run said to rerun it for the rest).
TEST_F(BatchCommandTest, AStopTheGraceOutlastsLeavesTheBatchComplete) {
  const auto in = write("in.jsonl", long_requests(4, 200));
  Engine engine(load_serve_config(config_));
  const BatchOutput output(dir_ / "out.jsonl");
  BatchRunner runner(engine, in.string(), output.get());
  std::atomic<bool> stop{false};
  size_t written_at_stop = 0;
  const BatchProgress progress = runner.run(
      read_batch_input(in), stop, std::chrono::milliseconds(1), [&](const BatchProgress& p) {
        if (stop || p.written + p.in_flight < p.total) return;  // not all submitted yet
        written_at_stop = p.written;
        stop = true;
      });
  ASSERT_TRUE(stop);
  EXPECT_LT(written_at_stop, 4u);
  EXPECT_EQ(progress.written, 4u);
  EXPECT_FALSE(progress.interrupted);
}

// A stop while the files are read (seconds, for a large batch; here the input is a pipe with
// nothing in it yet) ended the process without a word: it now ends the run once they are read,
// as any stop does, before the model loads, and leaves no output file behind.
TEST_F(BatchCommandTest, AStopWhileTheFilesAreReadEndsTheRunWithAMessage) {
  const auto in = write("in.jsonl", long_requests(3, 8));
  const auto fifo = dir_ / "fifo", out = dir_ / "out.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // The pipe opened read-write never blocks the writer, whether the batch reads it or is gone.
  // The signal goes once the batch blocks SIGINT (its first step; /proc shows the main thread's
  // mask): a background job of a shell ignores SIGINT, so one sent sooner is lost.
  const auto result = run_shell(
      shell_command(fifo, out) + " 2>&1 & pid=$!; for i in $(seq 400); do grep -q " +
      "'^SigBlk:.*[2367abef]$' /proc/$pid/status && break; sleep 0.025; done; kill -INT $pid; " +
      "sleep 0.3; " + "exec 3<>" + shell_quoted(fifo.string()) + "; cat " +
      shell_quoted(in.string()) + " >&3; exec 3>&-; wait $pid; echo \"exit $?\"");
  EXPECT_NE(result.out.find("SIGINT received, stopping once the files are read"), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("interrupted before any request ran: 0 of 3 requests have results"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("exit 130"), std::string::npos) << result.out;
  EXPECT_FALSE(std::filesystem::exists(out));
}

// A write that fails (here the file-size limit, as a full disk would) ends the run with its
// error, once the requests in flight have ended (their results arrived after the run was gone,
// and the process aborted); what was written is kept for the rerun.
TEST_F(BatchCommandTest, AFailedWriteEndsTheRunWithItsErrorWhileRequestsAreInFlight) {
  const auto in = write("in.jsonl", long_requests(100, 16));
  const auto out = dir_ / "out.jsonl";
  // 4 KiB: a few lines. SIGXFSZ ignored, so a write past the limit fails with EFBIG.
  const auto result =
      run_shell("ulimit -f 4; trap '' XFSZ; " + shell_command(in, out) + " 2>&1; echo \"exit $?\"");
  EXPECT_NE(
      result.out.find(out.string() + ": writing a result failed: File too large; the results "
                                     "written before it are kept: run the same command again"),
      std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("exit 1\n"), std::string::npos) << result.out;

  const auto finished = batch(in, out);
  ASSERT_EQ(finished.exit_code, 0) << finished.err;
  EXPECT_EQ(by_custom_id(lines_of(out)).size(), 100u);
}

// A second SIGINT does not wait for the requests in flight (the grace here would be a minute):
// they fail at once and get no line, every line written is whole, and the same command then
// finishes the batch.
TEST_F(BatchCommandTest, ASecondSigintFailsTheRequestsInFlightAtOnce) {
  const auto in = write("in.jsonl", long_requests(40, 400));
  const auto out = dir_ / "out.jsonl", err = dir_ / "err.txt";
  const std::string command =
      shell_command(in, out) + " --set server.shutdown_grace_s=60 2> " + shell_quoted(err.string());
  // The second signal goes once the first has been taken (two pending SIGINTs would be one).
  const auto interrupted = run_shell(
      command + " & pid=$!; while [ ! -s " + shell_quoted(out.string()) +
      " ]; do sleep 0.02; done; kill -INT $pid; until grep -q received " +
      shell_quoted(err.string()) + "; do sleep 0.02; done; kill -INT $pid; wait $pid; echo " +
      "\"exit $?\"; cat " + shell_quoted(err.string()));
  EXPECT_NE(interrupted.out.find("exit 130"), std::string::npos) << interrupted.out;
  EXPECT_NE(interrupted.out.find("second SIGINT: failing the requests still in flight"),
            std::string::npos)
      << interrupted.out;
  const auto partial = lines_of(out);
  EXPECT_LT(partial.size(), 40u);
  for (const auto& line : partial) EXPECT_EQ(line["response"]["status_code"], 200);

  const auto finished = batch(in, out);
  ASSERT_EQ(finished.exit_code, 0) << finished.err;
  const auto all = lines_of(out);
  EXPECT_EQ(by_custom_id(all).size(), 40u);
  for (const auto& line : all)
    EXPECT_EQ(line["response"]["body"]["usage"]["completion_tokens"], 400) << line["custom_id"];
}

}  // namespace
}  // namespace pipeline
