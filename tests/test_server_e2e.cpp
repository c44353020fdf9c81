// End to end: the real `pipeline run` on the tiny real model stories260K (CPU), spoken to over
// HTTP. Greedy answers must be the same however they are asked for: streamed or whole, alone
// or among many, with a roomy or a tight KV pool, and equal to `pipeline generate`.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "io/chat_template.h"
#include "io/grammar.h"
#include "io/grammar_prefix.h"
#include "io/json_schema.h"
#include "io/schema_prefix.h"
#include "io/tokenizer.h"
#include "tests/support/command.h"
#include "tests/support/server_process.h"
#include "tests/support/shared_data.h"
#include "tests/support/stories_tokenizer.h"

namespace pipeline {
namespace {

using nlohmann::json;
using testing::ServerProcess;
using testing::stories_config;
using Clock = std::chrono::steady_clock;

const char* kModel = "stories260K";

// ---- HTTP helpers

// cpp-httplib is an uninstrumented shared library whose client builds function-local static
// regexes on first use. ThreadSanitizer cannot see the guard that publishes them, so when a
// process's first request runs on a background thread while the main thread sends another,
// the main thread's reads of the regex are reported as a race. One request on the main thread
// before any test starts builds them first (a test run alone, such as the shutdown tests,
// otherwise starts with a background stream beside a metrics poll).
class HttpClientStatics : public ::testing::Environment {
 public:
  void SetUp() override {
    httplib::Server server;
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    const int port = server.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port, 0);
    std::thread listener([&] { server.listen_after_bind(); });
    httplib::Client client("127.0.0.1", port);
    const httplib::Result result = client.Get("/");
    server.stop();
    listener.join();
    ASSERT_TRUE(result && result->status == 200) << "the warm-up request to an in-process server";
  }
};
const ::testing::Environment* const kHttpClientStatics =
    ::testing::AddGlobalTestEnvironment(new HttpClientStatics);

struct Reply {
  int status = 0;
  json body;
  std::string raw;
  httplib::Headers headers;
};

Reply send(int port, const std::string& method, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {}) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  httplib::Result result = method == "POST"
                               ? client.Post(path.c_str(), headers, body, "application/json")
                               : client.Get(path.c_str(), headers);
  if (!result)
    throw std::runtime_error(method + " " + path + ": " + httplib::to_string(result.error()));
  Reply reply{result->status, json(), result->body, result->headers};
  reply.body = json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  return reply;
}

// (Bodies keep their objects' order, as a client writes them: a JSON schema's properties.)
Reply post(int port, const std::string& path, const nlohmann::ordered_json& body) {
  return send(port, "POST", path, body.dump());
}

// A streamed answer: its events in order, when each arrived, and the text they add up to.
struct Stream {
  int status = 0;
  std::string content_type;
  std::string raw;
  std::vector<json> events;  // every `data:` payload but [DONE]
  std::vector<Clock::time_point> event_times;
  bool done = false;  // ended with data: [DONE]
  std::string text;
  std::string finish_reason;
  json stop_reason;                         // the finishing chunk's (vLLM's stop_reason)
  std::map<int, std::string> choice_texts;  // by choice index
  std::map<int, std::string> choice_finish_reasons;
  Clock::time_point first_content_time{};
};

void parse_events(Stream& stream, std::string& pending, Clock::time_point now) {
  for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
    const std::string event = pending.substr(0, end);
    pending.erase(0, end + 2);
    if (event == ": keep-alive") continue;  // a comment, which says only that the stream lives
    ASSERT_EQ(event.rfind("data: ", 0), 0u) << "not an SSE data event: " << event;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      stream.done = true;
      continue;
    }
    json payload = json::parse(data);
    for (const json& choice : payload.value("choices", json::array())) {
      std::string piece = choice.contains("delta") ? choice["delta"].value("content", "")
                                                   : choice.value("text", "");
      if (!piece.empty() && stream.first_content_time == Clock::time_point{})
        stream.first_content_time = now;
      stream.text += piece;
      stream.choice_texts[choice["index"].get<int>()] += piece;
      if (!choice["finish_reason"].is_null()) {
        stream.finish_reason = choice["finish_reason"];
        stream.stop_reason = choice.at("stop_reason");
        stream.choice_finish_reasons[choice["index"].get<int>()] = choice["finish_reason"];
      }
    }
    stream.events.push_back(std::move(payload));
    stream.event_times.push_back(now);
  }
}

// Posts a streaming request and parses its events as the bytes come in, keeping each event's
// arrival time; an error answer keeps its raw JSON body.
Stream post_stream(int port, const std::string& path, nlohmann::ordered_json body) {
  body["stream"] = true;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  Stream stream;
  std::string pending;
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  request.response_handler = [&](const httplib::Response& response) {
    stream.status = response.status;
    stream.content_type = response.get_header_value("Content-Type");
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    stream.raw.append(data, size);
    if (stream.status == 200) {
      pending.append(data, size);
      parse_events(stream, pending, Clock::now());
    }
    return true;
  };
  httplib::Result result = client.send(request);
  if (!result) throw std::runtime_error("POST " + path + ": " + httplib::to_string(result.error()));
  return stream;
}

std::string chat_text(const Reply& reply) {
  return reply.body["choices"][0]["message"]["content"].get<std::string>();
}

json chat_body(const std::string& user, int max_tokens) {
  return {{"model", kModel},
          {"messages", {{{"role", "user"}, {"content", user}}}},
          {"temperature", 0},
          {"max_tokens", max_tokens}};
}

json with(json body, const std::string& key, json value) {
  body[key] = std::move(value);
  return body;
}

json completion_body(const std::string& prompt, int max_tokens) {
  return {{"model", kModel}, {"prompt", prompt}, {"temperature", 0}, {"max_tokens", max_tokens}};
}

// The value of one unlabelled Prometheus sample.
double metric(int port, const std::string& name) {
  const std::string text = send(port, "GET", "/metrics", "").raw;
  const std::regex line("(^|\n)" + name + " ([-+0-9.eE]+|NaN|[+-]Inf)");
  std::smatch match;
  if (!std::regex_search(text, match, line))
    throw std::runtime_error("metric " + name + " not in /metrics:\n" + text);
  return std::stod(match[2].str());
}

// The KV blocks in use, once every sequence's are released (or 10 s have passed). A sequence's
// blocks go back at the scheduler's next step after its ending, which its client may see first.
double kv_blocks_used_when_settled(int port) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (metric(port, "pipeline_kv_blocks_used") != 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return metric(port, "pipeline_kv_blocks_used");
}

// A story opening per index, so concurrent requests differ.
std::string story_prompt(int i) {
  static const char* kStarts[] = {"Once upon a time", "The little dog",  "Lily wanted to",
                                  "One day, a bird",  "Tom and his mom", "The sun was",
                                  "A big red ball",   "In the park,"};
  return std::string(kStarts[i % 8]) + (i >= 8 ? " and then" : "");
}

// ---- `pipeline generate`, the reference for greedy text

json generate_reference(const std::string& prompt, int max_tokens) {
  const auto result = pipeline::testing::run_pipeline(
      {"generate", "--model", pipeline::testing::shared_path("models/stories260K").string(),
       "--device", "cpu", "--temperature", "0", "--json", "--max-tokens",
       std::to_string(max_tokens), "--prompt", prompt});
  if (result.exit_code != 0) throw std::runtime_error("pipeline generate failed: " + result.err);
  return json::parse(result.out);
}

// ---- One shared server for most tests (batch window 200 ms, the default)

class ServerE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess(stories_config("scheduler:\n  window_ms: 200\n  max_batch: 16\n"));
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }

  static ServerProcess* server_;
};

ServerProcess* ServerE2E::server_ = nullptr;

TEST_F(ServerE2E, GreedyCompletionEqualsPipelineGenerate) {
  const std::string prompt = "Once upon a time";
  const json reference = generate_reference(prompt, 40);
  const Reply whole = post(port(), "/v1/completions", completion_body(prompt, 40));
  ASSERT_EQ(whole.status, 200) << whole.raw;
  EXPECT_EQ(whole.body["object"], "text_completion");
  EXPECT_EQ(whole.body["model"], kModel);
  EXPECT_EQ(whole.body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(whole.body["choices"][0]["text"], reference["text"]);
  EXPECT_EQ(whole.body["choices"][0]["finish_reason"], reference["finish_reason"]);
  EXPECT_EQ(whole.body["usage"]["prompt_tokens"], reference["prompt_ids"].size());
  EXPECT_EQ(whole.body["usage"]["completion_tokens"], reference["generated_ids"].size());

  const Stream stream = post_stream(port(), "/v1/completions", completion_body(prompt, 40));
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_EQ(stream.content_type, "text/event-stream");
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.text, reference["text"]);
  EXPECT_EQ(stream.finish_reason, reference["finish_reason"]);
  for (const json& event : stream.events) EXPECT_EQ(event["object"], "text_completion");
}

TEST_F(ServerE2E, ChatStreamingAndWholeAnswersAreIdentical) {
  const json body = chat_body("Tell me a story about a cat.", 48);
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  EXPECT_EQ(whole.body["object"], "chat.completion");
  EXPECT_EQ(whole.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_FALSE(chat_text(whole).empty());
  const int completion_tokens = whole.body["usage"]["completion_tokens"];
  EXPECT_GT(completion_tokens, 0);
  EXPECT_LE(completion_tokens, 48);

  json streamed_body = body;
  streamed_body["stream_options"] = {{"include_usage", true}};
  const Stream stream = post_stream(port(), "/v1/chat/completions", streamed_body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.text, chat_text(whole));
  EXPECT_EQ(stream.finish_reason, whole.body["choices"][0]["finish_reason"]);
  ASSERT_GE(stream.events.size(), 3u);
  EXPECT_EQ(stream.events.front()["choices"][0]["delta"]["role"], "assistant");
  const json& usage_chunk = stream.events.back();
  EXPECT_EQ(usage_chunk["choices"], json::array());
  for (const char* key : {"prompt_tokens", "completion_tokens", "total_tokens"})
    EXPECT_EQ(usage_chunk["usage"][key], whole.body["usage"][key]) << key;
  // The whole answer's request left the prompt in the prefix cache (if an earlier test had not):
  // every full block before its last token came from there.
  const int prompt_tokens = whole.body["usage"]["prompt_tokens"];
  const int cached = usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_EQ(cached, (prompt_tokens - 1) / 16 * 16);
  EXPECT_LE(whole.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), cached);
  for (const json& event : stream.events) {
    EXPECT_EQ(event["object"], "chat.completion.chunk");
    EXPECT_EQ(event["id"], stream.events.front()["id"]);
  }
}

// vLLM's continuous_usage_stats: each chunk carries its choice's usage so far, the role chunks
// none of its tokens, each token's chunk one more, the finishing chunk the choice's count (with
// an end of sequence that has no chunk); the last chunk is the call's usage, as without it.
TEST_F(ServerE2E, ContinuousUsageStatsCountEachChoicesTokensChunkByChunk) {
  const json body = with(chat_body("Tell me a story.", 12), "n", 2);
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  json streamed = body;
  streamed["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  const Stream stream = post_stream(port(), "/v1/chat/completions", streamed);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  ASSERT_TRUE(stream.done);
  ASSERT_GE(stream.events.size(), 5u);
  const json& last = stream.events.back();
  EXPECT_EQ(last["choices"], json::array());
  EXPECT_EQ(last["usage"]["prompt_tokens"], whole.body["usage"]["prompt_tokens"]);
  EXPECT_EQ(last["usage"]["completion_tokens"], whole.body["usage"]["completion_tokens"]);
  const int prompt_tokens = last["usage"]["prompt_tokens"];
  std::map<int, int> shown;  // by choice, its token chunks so far
  int finished_tokens = 0;
  for (size_t i = 0; i + 1 < stream.events.size(); ++i) {
    SCOPED_TRACE(stream.events[i].dump());
    const json& choice = stream.events[i]["choices"].at(0);
    const json& usage = stream.events[i].at("usage");
    const int completion_tokens = usage["completion_tokens"];
    EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
    EXPECT_EQ(usage["total_tokens"], prompt_tokens + completion_tokens);
    int& so_far = shown[choice["index"].get<int>()];
    if (choice["delta"].contains("role")) {
      EXPECT_EQ(completion_tokens, 0);
    } else if (choice["finish_reason"].is_null()) {
      EXPECT_EQ(completion_tokens, ++so_far);
    } else {
      EXPECT_GE(completion_tokens, so_far);
      EXPECT_LE(completion_tokens, so_far + 1);
      finished_tokens += completion_tokens;
    }
  }
  EXPECT_EQ(finished_tokens, last["usage"]["completion_tokens"]);
  // Once every choice has counted the prompt, its cached tokens are the last chunk's.
  EXPECT_EQ(stream.events[stream.events.size() - 2]["usage"]["prompt_tokens_details"],
            last["usage"]["prompt_tokens_details"]);
}

// Choice i of a seeded call with n choices draws with seed + i: a one-choice call with that seed
// is its reference, whole or streamed.
TEST_F(ServerE2E, NChoicesAreSampledApartAndEachStreamsUnderItsIndex) {
  json body = with(with(completion_body("Once upon a time", 24), "temperature", 1.0), "seed", 11);
  const Reply three = post(port(), "/v1/completions", with(body, "n", 3));
  ASSERT_EQ(three.status, 200) << three.raw;
  ASSERT_EQ(three.body["choices"].size(), 3u);
  int completion_tokens = 0;
  std::set<std::string> texts;
  std::vector<Reply> alone;
  for (int i = 0; i < 3; ++i) {
    alone.push_back(post(port(), "/v1/completions", with(body, "seed", 11 + i)));
    const json& choice = three.body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["text"], alone[i].body["choices"][0]["text"]) << "choice " << i;
    EXPECT_EQ(choice["finish_reason"], alone[i].body["choices"][0]["finish_reason"]);
    completion_tokens += alone[i].body["usage"]["completion_tokens"].get<int>();
    texts.insert(choice["text"].get<std::string>());
  }
  EXPECT_EQ(texts.size(), 3u) << "the choices should differ";
  EXPECT_EQ(three.body["usage"]["prompt_tokens"], alone[0].body["usage"]["prompt_tokens"]);
  EXPECT_EQ(three.body["usage"]["completion_tokens"], completion_tokens);

  json streamed = with(body, "n", 3);
  streamed["stream_options"] = {{"include_usage", true}};
  const Stream stream = post_stream(port(), "/v1/completions", streamed);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_TRUE(stream.done);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(stream.choice_texts.at(i), three.body["choices"][i]["text"]) << "choice " << i;
    EXPECT_EQ(stream.choice_finish_reasons.at(i), three.body["choices"][i]["finish_reason"]);
  }
  EXPECT_EQ(stream.events.back()["usage"], three.body["usage"]);

  // A chat stream opens with the assistant's role for every choice.
  const Stream chat =
      post_stream(port(), "/v1/chat/completions", with(chat_body("Tell me a story.", 8), "n", 2));
  ASSERT_EQ(chat.status, 200) << chat.raw;
  ASSERT_GE(chat.events.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(chat.events[size_t(i)]["choices"][0]["index"], i);
    EXPECT_EQ(chat.events[size_t(i)]["choices"][0]["delta"]["role"], "assistant");
  }
  EXPECT_EQ(chat.choice_texts.at(0), chat.choice_texts.at(1)) << "greedy choices are alike";
}

TEST_F(ServerE2E, AListOfPromptsIsAnsweredPromptByPrompt) {
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  json body = completion_body(prompts[0], 16);
  body["prompt"] = prompts;
  body["n"] = 2;
  const Reply all = post(port(), "/v1/completions", body);
  ASSERT_EQ(all.status, 200) << all.raw;
  ASSERT_EQ(all.body["choices"].size(), 4u);
  int prompt_tokens = 0;
  for (size_t p = 0; p < 2; ++p) {
    const Reply alone = post(port(), "/v1/completions", completion_body(prompts[p], 16));
    prompt_tokens += alone.body["usage"]["prompt_tokens"].get<int>();
    for (size_t j = 0; j < 2; ++j) {
      const json& choice = all.body["choices"][p * 2 + j];
      EXPECT_EQ(choice["index"], p * 2 + j);
      EXPECT_EQ(choice["text"], alone.body["choices"][0]["text"]) << "prompt " << p;
    }
  }
  EXPECT_EQ(all.body["usage"]["prompt_tokens"], prompt_tokens);

  const Stream stream = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(stream.choice_texts.at(i), all.body["choices"][i]["text"]) << "choice " << i;

  // One prompt of the list too long for the context: the call's error names which. The other
  // prompt's choices end with that error too: failed, not counted as cancelled by a client.
  std::string too_long;
  for (int i = 0; i < 300; ++i) too_long += "Once upon a time ";
  body["prompt"] = {prompts[0], too_long};
  body["max_tokens"] = 400;
  body["ignore_eos"] = true;
  const double cancelled = metric(port(), "pipeline_requests_cancelled_total");
  const double failed = metric(port(), "pipeline_requests_failed_total");
  const Reply refused = post(port(), "/v1/completions", body);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "prompt");
  EXPECT_EQ(
      refused.body["error"]["message"].get<std::string>().rfind("prompt[1]: the prompt is ", 0), 0u)
      << refused.raw;
  EXPECT_EQ(metric(port(), "pipeline_requests_failed_total") - failed, 4);
  EXPECT_EQ(metric(port(), "pipeline_requests_cancelled_total"), cancelled);
}

TEST_F(ServerE2E, APromptOfTokenIdsIsAnsweredAsItsText) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  json body = completion_body(prompts[0], 16);
  body["prompt"] = tokenizer.encode(prompts[0], true);
  const Reply by_ids = post(port(), "/v1/completions", body);
  ASSERT_EQ(by_ids.status, 200) << by_ids.raw;
  const Reply by_text = post(port(), "/v1/completions", completion_body(prompts[0], 16));
  EXPECT_EQ(by_ids.body["choices"][0]["text"], by_text.body["choices"][0]["text"]);
  EXPECT_EQ(by_ids.body["usage"]["prompt_tokens"], by_text.body["usage"]["prompt_tokens"]);

  body["prompt"] = {tokenizer.encode(prompts[0], true), tokenizer.encode(prompts[1], true)};
  const Reply both = post(port(), "/v1/completions", body);
  ASSERT_EQ(both.status, 200) << both.raw;
  ASSERT_EQ(both.body["choices"].size(), 2u);
  const Reply second = post(port(), "/v1/completions", completion_body(prompts[1], 16));
  EXPECT_EQ(both.body["choices"][1]["text"], second.body["choices"][0]["text"]);

  // vLLM's add_special_tokens false: the text's own tokens, without BOS, as /tokenize gives them.
  json bare = completion_body(prompts[0], 16);
  bare["add_special_tokens"] = false;
  const Reply without_bos = post(port(), "/v1/completions", bare);
  ASSERT_EQ(without_bos.status, 200) << without_bos.raw;
  body["prompt"] = tokenizer.encode(prompts[0], false);
  const Reply by_bare_ids = post(port(), "/v1/completions", body);
  EXPECT_EQ(without_bos.body["choices"][0]["text"], by_bare_ids.body["choices"][0]["text"]);
  EXPECT_EQ(without_bos.body["usage"]["prompt_tokens"],
            by_ids.body["usage"]["prompt_tokens"].get<int>() - 1);
  bare["prompt"] = "";
  const Reply nothing = post(port(), "/v1/completions", bare);
  EXPECT_EQ(nothing.status, 400) << nothing.raw;
  EXPECT_EQ(nothing.body["error"]["param"], "prompt");
}

// /tokenize gives the tokens the completion endpoints feed the model (their usage counts them),
// and /detokenize spells them back.
TEST_F(ServerE2E, TokenizeGivesThePromptTokensOfTheCompletionEndpoints) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  const std::string prompt = "Once upon a time";
  const Reply tokenized = post(
      port(), "/tokenize", {{"model", kModel}, {"prompt", prompt}, {"return_token_strs", true}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.raw;
  EXPECT_EQ(tokenized.body["tokens"], json(tokenizer.encode(prompt, /*add_bos=*/true)));
  EXPECT_EQ(tokenized.body["max_model_len"], 512);  // stories260K's context
  EXPECT_EQ(tokenized.body["token_strs"].size(), tokenized.body["tokens"].size());
  const Reply completion = post(port(), "/v1/completions", completion_body(prompt, 2));
  ASSERT_EQ(completion.status, 200) << completion.raw;
  EXPECT_EQ(tokenized.body["count"], completion.body["usage"]["prompt_tokens"]);

  const json chat = chat_body("Tell me a story about a cat.", 2);
  const Reply chat_tokens =
      post(port(), "/tokenize", {{"model", kModel}, {"messages", chat["messages"]}});
  ASSERT_EQ(chat_tokens.status, 200) << chat_tokens.raw;
  EXPECT_EQ(chat_tokens.body["tokens"],
            json(apply_chat_template(tokenizer, ChatTemplate::Llama2,
                                     {{"user", "Tell me a story about a cat."}})));
  const Reply chat_answer = post(port(), "/v1/chat/completions", chat);
  ASSERT_EQ(chat_answer.status, 200) << chat_answer.raw;
  EXPECT_EQ(chat_tokens.body["count"], chat_answer.body["usage"]["prompt_tokens"]);

  const Reply detokenized =
      post(port(), "/detokenize", {{"model", kModel}, {"tokens", tokenized.body["tokens"]}});
  ASSERT_EQ(detokenized.status, 200) << detokenized.raw;
  EXPECT_EQ(detokenized.body, json({{"prompt", prompt}}));

  // Counted in /metrics under their own routes, like every other answer.
  const std::string metrics = send(port(), "GET", "/metrics", "").raw;
  for (const char* route : {"/tokenize", "/detokenize"})
    EXPECT_NE(metrics.find("pipeline_http_requests_total{route=\"" + std::string(route) +
                           "\",status=\"200\"}"),
              std::string::npos)
        << metrics;
}

// vLLM's continue_final_message: the answer continues the assistant's last message, as a
// completion of the same tokens does; streamed or not.
TEST_F(ServerE2E, AChatAnswerContinuesTheFinalAssistantMessageWhenAsked) {
  json chat = chat_body("Tell me a story.", 12);
  chat["messages"].push_back({{"role", "assistant"}, {"content", "Once upon a time, a little"}});
  chat["continue_final_message"] = true;
  chat["add_generation_prompt"] = false;
  const Reply tokens = post(port(), "/tokenize",
                            {{"model", kModel},
                             {"messages", chat["messages"]},
                             {"continue_final_message", true},
                             {"add_generation_prompt", false}});
  ASSERT_EQ(tokens.status, 200) << tokens.raw;
  const Reply same = post(port(), "/v1/completions",
                          with(completion_body("", 12), "prompt", tokens.body["tokens"]));
  ASSERT_EQ(same.status, 200) << same.raw;
  const std::string expected = same.body["choices"][0]["text"];
  ASSERT_FALSE(expected.empty());
  const Reply whole = post(port(), "/v1/chat/completions", chat);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  EXPECT_EQ(chat_text(whole), expected);
  EXPECT_EQ(whole.body["usage"]["prompt_tokens"], tokens.body["count"]);
  EXPECT_EQ(post_stream(port(), "/v1/chat/completions", chat).text, expected);

  // Without it, a dialog may not end with the assistant; and both ends at once are refused.
  chat.erase("continue_final_message");
  EXPECT_EQ(post(port(), "/v1/chat/completions", chat).status, 400);
  chat["continue_final_message"] = true;
  chat["add_generation_prompt"] = true;
  const Reply both = post(port(), "/v1/chat/completions", chat);
  EXPECT_EQ(both.status, 400);
  EXPECT_EQ(both.body["error"]["param"], "continue_final_message") << both.raw;
}

// vLLM's truncate_prompt_tokens: a prompt beyond the context is answered from its last tokens.
TEST_F(ServerE2E, TruncatePromptTokensAnswersAPromptBeyondTheContext) {
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "the cat ";
  const json body = completion_body(prompt, 4);
  EXPECT_EQ(post(port(), "/v1/completions", body).status, 400);
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json truncated = std::string(path) == "/v1/completions" ? body : chat_body(prompt, 4);
    truncated["truncate_prompt_tokens"] = 200;
    const Reply reply = post(port(), path, truncated);
    ASSERT_EQ(reply.status, 200) << path << ": " << reply.raw;
    EXPECT_EQ(reply.body["usage"]["prompt_tokens"], 200) << path;
  }
}

// lm-eval's loglikelihood requests: prompts of token ids, echo, logprobs 1, one new token. Each
// choice's logprobs list its prompt's tokens (the first with null: nothing predicts it) and the
// new token, which is the one a plain request generates, with the same logprob.
TEST_F(ServerE2E, EchoScoresThePromptAsLoglikelihoodEvaluationsAskIt) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  json body = with(with(completion_body(prompts[0], 1), "echo", true), "logprobs", 1);
  body["prompt"] = {tokenizer.encode(prompts[0], true), tokenizer.encode(prompts[1], true)};
  const Reply scored = post(port(), "/v1/completions", body);
  ASSERT_EQ(scored.status, 200) << scored.raw;
  ASSERT_EQ(scored.body["choices"].size(), 2u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    const Reply plain =
        post(port(), "/v1/completions", with(completion_body(prompts[i], 1), "logprobs", 1));
    ASSERT_EQ(plain.status, 200) << plain.raw;
    const json& choice = scored.body["choices"][i];
    EXPECT_EQ(choice["text"], prompts[i] + plain.body["choices"][0]["text"].get<std::string>());
    const json& logprobs = choice["logprobs"];
    const size_t prompt_tokens = tokenizer.encode(prompts[i], true).size();
    ASSERT_EQ(logprobs["tokens"].size(), prompt_tokens + 1);
    EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
    EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
    for (size_t t = 1; t < prompt_tokens; ++t) {
      const double logprob = logprobs["token_logprobs"][t];
      EXPECT_LT(logprob, 0.0);
      // The likeliest token and the prompt's own (one entry when they are the same), as
      // lm-eval reads them to tell whether the prompt is the greedy continuation.
      const json& top = logprobs["top_logprobs"][t];
      ASSERT_TRUE(top.size() == 1 || top.size() == 2) << top.dump();
      ASSERT_TRUE(top.contains(logprobs["tokens"][t].get<std::string>())) << top.dump();
      EXPECT_NEAR(top[logprobs["tokens"][t].get<std::string>()].get<double>(), logprob, 1e-6);
      for (const auto& [text, alternative] : top.items())
        EXPECT_GE(alternative.get<double>(), logprob);
      EXPECT_LE(logprobs["text_offset"][t - 1], logprobs["text_offset"][t]);
    }
    const json& answer = plain.body["choices"][0]["logprobs"];
    EXPECT_EQ(logprobs["tokens"].back(), answer["tokens"][0]);
    EXPECT_NEAR(logprobs["token_logprobs"].back().get<double>(),
                answer["token_logprobs"][0].get<double>(), 1e-4);
    EXPECT_EQ(logprobs["text_offset"].back(), prompts[i].size());
  }
  EXPECT_EQ(scored.body["usage"]["prompt_tokens"],
            tokenizer.encode(prompts[0], true).size() + tokenizer.encode(prompts[1], true).size());
}

// OpenAI's presence and frequency penalties weigh the answer's tokens, not the prompt's: the
// first token is the same with them as without ("." ends the prompt's sentences too).
TEST_F(ServerE2E, PresenceAndFrequencyPenaltiesLeaveThePromptsTokensAlone) {
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball";
  const json plain = completion_body(prompt, 1);
  const Reply reference = post(port(), "/v1/completions", plain);
  ASSERT_EQ(reference.status, 200) << reference.raw;
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    const Reply penalised = post(port(), "/v1/completions", with(plain, penalty, 2.0));
    ASSERT_EQ(penalised.status, 200) << penalised.raw;
    EXPECT_EQ(penalised.body["choices"][0]["text"], reference.body["choices"][0]["text"])
        << penalty;
  }
}

TEST_F(ServerE2E, EchoWithNoNewTokensAnswersThePromptAloneWholeOrStreamed) {
  const json body = with(with(completion_body("Once upon a time", 0), "echo", true), "logprobs", 0);
  const double generated_before = metric(port(), "pipeline_generation_tokens_total");
  const Reply whole = post(port(), "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const json& choice = whole.body["choices"][0];
  EXPECT_EQ(choice["text"], "Once upon a time");
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(choice["logprobs"]["tokens"].size(), whole.body["usage"]["prompt_tokens"]);
  EXPECT_EQ(whole.body["usage"]["completion_tokens"], 0);

  const Stream stream = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_EQ(stream.text, "Once upon a time");
  EXPECT_EQ(stream.finish_reason, "length");
  // The token each drew and dropped is not counted as generated either.
  EXPECT_EQ(metric(port(), "pipeline_generation_tokens_total"), generated_before);

  // Echo with new tokens, streamed: the prompt, then the answer a plain request gets.
  const Reply plain = post(port(), "/v1/completions", completion_body("Once upon a time", 8));
  const Stream echoed = post_stream(port(), "/v1/completions",
                                    with(completion_body("Once upon a time", 8), "echo", true));
  EXPECT_EQ(echoed.text, "Once upon a time" + plain.body["choices"][0]["text"].get<std::string>());
}

// A prompt-only answer computes no position past its prompt, so the prompt may fill the whole
// context (512 tokens here), as lm-eval's loglikelihood windows of max_length tokens do; one
// more token, or an answer asked for, does not fit.
TEST_F(ServerE2E, APromptOnlyEchoMayFillTheWholeContext) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  std::vector<int32_t> window;
  while (window.size() < 513) {
    const auto story =
        tokenizer.encode("Once upon a time, there was a little dog named Max. ", window.empty());
    window.insert(window.end(), story.begin(), story.end());
  }
  window.resize(512);
  const auto scored = [&](const std::vector<int32_t>& prompt, int max_tokens) {
    json body = with(with(completion_body("", max_tokens), "echo", true), "logprobs", 0);
    body["prompt"] = prompt;
    return post(port(), "/v1/completions", body);
  };
  const Reply whole = scored(window, 0);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const json& logprobs = whole.body["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["token_logprobs"].size(), 512u);
  // Causal: the window's first 100 scores are those of its first 100 tokens alone.
  const Reply start = scored({window.begin(), window.begin() + 100}, 0);
  ASSERT_EQ(start.status, 200) << start.raw;
  for (size_t t = 1; t < 100; ++t)
    EXPECT_NEAR(logprobs["token_logprobs"][t].get<double>(),
                start.body["choices"][0]["logprobs"]["token_logprobs"][t].get<double>(), 1e-4)
        << t;

  std::vector<int32_t> longer = window;
  longer.push_back(window[1]);
  EXPECT_EQ(scored(longer, 0).status, 400);
  EXPECT_EQ(scored(window, 1).status, 400);
}

TEST_F(ServerE2E, AStopStringEndsTheAnswerBeforeIt) {
  const std::string full = post(port(), "/v1/completions", completion_body("Once upon a time", 40))
                               .body["choices"][0]["text"];
  const std::string stop = " little";  // stories260K's greedy story has a little girl in it
  ASSERT_NE(full.find(stop), std::string::npos) << full;
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    json body = with(completion_body("Once upon a time", 40), "stop", {stop, "unused"});
    std::string text, finish_reason;
    json stop_reason;
    if (stream) {
      const Stream answer = post_stream(port(), "/v1/completions", body);
      text = answer.text;
      finish_reason = answer.finish_reason;
      stop_reason = answer.stop_reason;
    } else {
      const Reply answer = post(port(), "/v1/completions", body);
      text = answer.body["choices"][0]["text"];
      finish_reason = answer.body["choices"][0]["finish_reason"];
      stop_reason = answer.body["choices"][0]["stop_reason"];
    }
    EXPECT_EQ(text, full.substr(0, full.find(stop)));
    EXPECT_EQ(finish_reason, "stop");
    EXPECT_EQ(stop_reason, stop);  // vLLM's stop_reason: which stop string matched
    // vLLM's include_stop_str_in_output: the answer ends with the stop string instead.
    body["include_stop_str_in_output"] = true;
    const std::string with_stop =
        stream
            ? post_stream(port(), "/v1/completions", body).text
            : post(port(), "/v1/completions", body).body["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(with_stop, full.substr(0, full.find(stop) + stop.size()));
  }
}

// As in vLLM, a stream sends a chunk for every generated token, of empty text when the token's
// text is held back; here a stop string that matches the story from its " little" on for
// several tokens, then not, holds them back. Clients (and bench-serve) count and time tokens by
// chunks.
TEST_F(ServerE2E, EveryGeneratedTokenStreamsAChunkEvenWhileItsTextIsHeldBack) {
  const std::string full = post(port(), "/v1/completions", completion_body("Once upon a time", 40))
                               .body["choices"][0]["text"];
  const size_t start = full.find(" little");
  ASSERT_NE(start, std::string::npos) << full;
  const std::string never_matched = full.substr(start, 20) + "#";
  json body = with(completion_body("Once upon a time", 40), "stop", {never_matched});
  body["stream_options"] = {{"include_usage", true}};
  const Stream answer = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(answer.status, 200) << answer.raw;
  EXPECT_EQ(answer.text, full);
  int token_chunks = 0, empty_chunks = 0;
  for (const json& chunk : answer.events)
    for (const json& choice : chunk["choices"])
      if (choice["finish_reason"].is_null()) {
        ++token_chunks;
        empty_chunks += choice["text"] == "";
      }
  EXPECT_EQ(token_chunks, 40);
  EXPECT_EQ(answer.events.back()["usage"]["completion_tokens"], 40);
  EXPECT_GT(empty_chunks, 1);  // " little" and the words after it, held back
}

TEST_F(ServerE2E, LogprobTokensSpellTheAnswer) {
  json chat = with(chat_body("Tell me a story.", 12), "logprobs", true);
  chat["top_logprobs"] = 3;
  const Reply reply = post(port(), "/v1/chat/completions", chat);
  ASSERT_EQ(reply.status, 200) << reply.raw;
  std::string spelled;
  for (const json& entry : reply.body["choices"][0]["logprobs"]["content"]) {
    spelled += entry["token"].get<std::string>();
    EXPECT_LE(entry["logprob"].get<double>(), 0.0);
    ASSERT_EQ(entry["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(entry["top_logprobs"][0]["logprob"], entry["logprob"]);
  }
  EXPECT_EQ(spelled, chat_text(reply));

  const Reply completion =
      post(port(), "/v1/completions", with(completion_body("Once upon a time", 12), "logprobs", 2));
  ASSERT_EQ(completion.status, 200) << completion.raw;
  const json& logprobs = completion.body["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 12u);
  EXPECT_EQ(logprobs["token_logprobs"].size(), 12u);
  EXPECT_EQ(logprobs["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(logprobs["text_offset"][0], std::string("Once upon a time").size());

  // A prompt of no text: the answer's first word has no leading space, nor has its token.
  for (const json& prompt : {json(""), json::array({1})}) {
    const Reply start = post(port(), "/v1/completions",
                             with(with(completion_body("", 8), "prompt", prompt), "logprobs", 0));
    ASSERT_EQ(start.status, 200) << start.raw;
    const std::string text = start.body["choices"][0]["text"];
    const json& start_logprobs = start.body["choices"][0]["logprobs"];
    std::string tokens;
    for (size_t i = 0; i < start_logprobs["tokens"].size(); ++i) {
      EXPECT_EQ(start_logprobs["text_offset"][i], tokens.size()) << prompt;
      tokens += start_logprobs["tokens"][i].get<std::string>();
    }
    EXPECT_EQ(tokens, text) << prompt;
    ASSERT_FALSE(text.empty()) << prompt;
    EXPECT_NE(text.front(), ' ') << prompt;
  }
}

// vLLM's stop_token_ids end the answer at the token, its text kept; min_tokens holds back every
// ending (end of sequence, stop token ids, stop strings) for its first tokens.
TEST_F(ServerE2E, StopTokenIdsEndTheAnswerAndMinTokensHoldsEveryEndingBack) {
  const std::string prompt = "Once upon a time";
  const json reference = generate_reference(prompt, 30);
  const std::vector<int32_t> ids = reference["generated_ids"];
  const std::string reference_text = reference["text"];
  ASSERT_EQ(ids.size(), 30u);
  const Tokenizer& tokenizer = testing::stories_tokenizer();

  const int32_t stop_id = ids[5];
  const size_t first = size_t(std::find(ids.begin(), ids.end(), stop_id) - ids.begin());
  const Reply stopped = post(port(), "/v1/completions",
                             with(completion_body(prompt, 30), "stop_token_ids", {stop_id}));
  ASSERT_EQ(stopped.status, 200) << stopped.raw;
  const std::string stopped_text = stopped.body["choices"][0]["text"];
  EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped.body["choices"][0]["stop_reason"], stop_id);
  EXPECT_EQ(stopped.body["usage"]["completion_tokens"], first + 1);
  // The text of the tokens before the stop token, without the stop token's own (as in vLLM).
  ASSERT_EQ(reference_text.rfind(stopped_text, 0), 0u) << stopped_text;
  const std::string stop_text = tokenizer.token_text(stop_id);
  EXPECT_EQ(reference_text.compare(stopped_text.size(), stop_text.size(), stop_text), 0)
      << stopped_text << " | " << stop_text;
  // ... and with it, asked for with include_stop_str_in_output.
  const Reply included = post(port(), "/v1/completions",
                              with(with(completion_body(prompt, 30), "stop_token_ids", {stop_id}),
                                   "include_stop_str_in_output", true));
  ASSERT_EQ(included.status, 200) << included.raw;
  EXPECT_EQ(included.body["choices"][0]["text"], stopped_text + stop_text);
  // Streamed, the finishing chunk names it; ignore_eos leaves stop token ids at work.
  const Stream streamed = post_stream(
      port(), "/v1/completions",
      with(with(completion_body(prompt, 30), "stop_token_ids", {stop_id}), "ignore_eos", true));
  ASSERT_EQ(streamed.status, 200) << streamed.raw;
  EXPECT_EQ(streamed.text, stopped_text);
  EXPECT_EQ(streamed.finish_reason, "stop");
  EXPECT_EQ(streamed.stop_reason, stop_id);

  // The end of sequence all but forced: the answer is empty, unless min_tokens holds it back.
  json eager =
      with(completion_body(prompt, 30), "logit_bias", {{std::to_string(tokenizer.eos_id()), 100}});
  const Reply empty = post(port(), "/v1/completions", eager);
  ASSERT_EQ(empty.status, 200) << empty.raw;
  EXPECT_EQ(empty.body["choices"][0]["text"], "");
  EXPECT_EQ(empty.body["usage"]["completion_tokens"], 1);
  // An end of sequence is no stop the client named, even one listed in stop_token_ids.
  EXPECT_TRUE(empty.body["choices"][0].at("stop_reason").is_null());
  const Reply listed =
      post(port(), "/v1/completions", with(eager, "stop_token_ids", {tokenizer.eos_id()}));
  EXPECT_TRUE(listed.body["choices"][0].at("stop_reason").is_null()) << listed.raw;
  eager["min_tokens"] = 5;
  for (const json& stop : {json(), json(" ")}) {
    // A stop string in the first five tokens' text does not count either.
    const Reply five = post(port(), "/v1/completions", with(eager, "stop", stop));
    ASSERT_EQ(five.status, 200) << five.raw;
    const std::string text = five.body["choices"][0]["text"];
    EXPECT_EQ(five.body["usage"]["completion_tokens"], 6);  // five, then the end of sequence
    EXPECT_EQ(five.body["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(reference_text.rfind(text, 0), 0u) << text;
    EXPECT_NE(text.find(' ', 1), std::string::npos) << text;
  }

  // A stop token id is held back as well: the greedy first token cannot end the answer.
  const Reply held =
      post(port(), "/v1/completions",
           with(with(completion_body(prompt, 30), "stop_token_ids", {ids[0]}), "min_tokens", 3));
  ASSERT_EQ(held.status, 200) << held.raw;
  EXPECT_GE(held.body["usage"]["completion_tokens"].get<int>(), 4);
  EXPECT_EQ(
      post(port(), "/v1/completions", with(completion_body(prompt, 30), "stop_token_ids", {100000}))
          .status,
      400);
}

// vLLM's allowed_token_ids: one allowed token is drawn at every step; the end of sequence alone
// ends the answer at once; an id outside the vocabulary, or ending tokens only where min_tokens
// bans them, is a 400 naming the parameter.
TEST_F(ServerE2E, AllowedTokenIdsAreTheOnlyTokensDrawn) {
  const Tokenizer& tokenizer = testing::stories_tokenizer();
  const std::vector<int32_t> ids = tokenizer.encode("cat", false);
  ASSERT_FALSE(ids.empty());
  const int32_t only = ids.back();
  const std::string piece = tokenizer.token_text(only);
  const Reply repeated =
      post(port(), "/v1/completions",
           with(with(completion_body("Once upon a time", 5), "allowed_token_ids", {only}),
                "temperature", 1.0));
  ASSERT_EQ(repeated.status, 200) << repeated.raw;
  std::string expected;
  for (int i = 0; i < 5; ++i) expected += piece;
  EXPECT_EQ(repeated.body["choices"][0]["text"], expected);
  EXPECT_EQ(repeated.body["choices"][0]["finish_reason"], "length");

  const Reply ended = post(port(), "/v1/chat/completions",
                           with(chat_body("Hello", 5), "allowed_token_ids", {tokenizer.eos_id()}));
  ASSERT_EQ(ended.status, 200) << ended.raw;
  EXPECT_EQ(ended.body["choices"][0]["message"]["content"], "");
  EXPECT_EQ(ended.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ended.body["usage"]["completion_tokens"], 1);

  for (const json& body :
       {with(completion_body("Once", 5), "allowed_token_ids", {100000}),
        with(with(completion_body("Once", 5), "allowed_token_ids", {tokenizer.eos_id()}),
             "min_tokens", 2)}) {
    const Reply refused = post(port(), "/v1/completions", body);
    ASSERT_EQ(refused.status, 400) << refused.raw;
    EXPECT_EQ(refused.body["error"]["param"], "allowed_token_ids") << refused.raw;
  }
}

// vLLM's bad_words: "girl" is ▁g ir l to stories260K, and the greedy story has it by its eighth
// token; banned, the story is the same up to its "l", which the model replaces, and never holds
// the three again. Bans that leave the first draw nothing are a 400 naming bad_words; a later
// draw left nothing fails its answer with a 400 too (the request's own bans conflict) rather
// than drawing a banned token.
TEST_F(ServerE2E, BadWordsNeverAppearInTheAnswer) {
  const Tokenizer& tokenizer = testing::stories_tokenizer();
  const std::string prompt = "Once upon a time";
  const json reference = generate_reference(prompt, 30);
  const std::vector<int32_t> ids = reference["generated_ids"];
  const std::vector<int32_t> girl = tokenizer.encode("girl", false);
  ASSERT_EQ(girl.size(), 3u);
  const auto at = std::search(ids.begin(), ids.end(), girl.begin(), girl.end());
  ASSERT_NE(at, ids.end()) << reference["text"];
  const std::vector<int32_t> before(ids.begin(), at + ptrdiff_t(girl.size()) - 1);  // "▁g ir"

  const Reply banned =
      post(port(), "/v1/completions",
           with(with(completion_body(prompt, 30), "bad_words", {"girl"}), "logprobs", 0));
  ASSERT_EQ(banned.status, 200) << banned.raw;
  const std::string text = banned.body["choices"][0]["text"];
  const std::string kept = tokenizer.decode(before);
  EXPECT_EQ(text.rfind(kept, 0), 0u) << text;
  const std::vector<std::string> tokens = banned.body["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 30u);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(tokens[i], tokenizer.token_text(before[i]));
  EXPECT_NE(tokens[before.size()], tokenizer.token_text(girl.back()));
  std::vector<std::string> girl_texts;
  for (int32_t token : girl) girl_texts.push_back(tokenizer.token_text(token));
  EXPECT_EQ(std::search(tokens.begin(), tokens.end(), girl_texts.begin(), girl_texts.end()),
            tokens.end())
      << text;

  // "little" is one token: with it the only one allowed, nothing is left to draw first.
  const std::vector<int32_t> little = tokenizer.encode("little", false);
  ASSERT_EQ(little.size(), 1u);
  const Reply refused = post(
      port(), "/v1/completions",
      with(with(completion_body(prompt, 5), "allowed_token_ids", little), "bad_words", {"little"}));
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "bad_words") << refused.raw;
  // Unless nothing is drawn: the prompt scored alone (echo, max_tokens 0).
  const Reply scored =
      post(port(), "/v1/completions",
           with(with(with(with(completion_body(prompt, 0), "echo", true), "logprobs", 1),
                     "allowed_token_ids", little),
                "bad_words", {"little"}));
  EXPECT_EQ(scored.status, 200) << scored.raw;
  // "little little": the first draw takes it, the second has nothing left.
  const Reply failed = post(port(), "/v1/completions",
                            with(with(completion_body(prompt, 5), "allowed_token_ids", little),
                                 "bad_words", {"little little"}));
  ASSERT_EQ(failed.status, 400) << failed.raw;
  EXPECT_EQ(failed.body["error"]["type"], "invalid_request_error") << failed.raw;
  EXPECT_NE(failed.raw.find("no token can be drawn"), std::string::npos) << failed.raw;
  EXPECT_EQ(post(port(), "/v1/completions", completion_body(prompt, 2)).status, 200);
}

// response_format json_object: every choice is the beginning of a JSON object, whole where it
// ended on its own, streamed or not. The model writes stories, not JSON, so a logit_bias toward
// quotes and closing braces gives its objects a chance to close.
TEST_F(ServerE2E, JsonModeAnswersAreObjectsOrTheirBeginnings) {
  const std::vector<int32_t> ids = testing::stories_tokenizer().encode("a\"}", false);
  ASSERT_EQ(ids.size(), 3u);
  json body = with(chat_body("Tell me about a cat as JSON.", 48), "temperature", 1.0);
  body.update({{"n", 4},
               {"seed", 5},
               {"response_format", {{"type", "json_object"}}},
               {"logit_bias", {{std::to_string(ids[1]), 10}, {std::to_string(ids[2]), 10}}}});
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const Stream stream = post_stream(port(), "/v1/chat/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  int closed = 0;
  for (const json& choice : whole.body["choices"]) {
    const std::string text = choice["message"]["content"];
    SCOPED_TRACE(text);
    SchemaPrefix prefix(*JsonSchema::any_object());
    EXPECT_TRUE(prefix.feed(text));
    const std::string finish_reason = choice["finish_reason"];
    if (finish_reason == "stop") {
      EXPECT_TRUE(prefix.complete());
      EXPECT_TRUE(json::parse(text).is_object());
      ++closed;
    }
    const int index = choice["index"];
    EXPECT_EQ(stream.choice_texts.at(index), text);
    EXPECT_EQ(stream.choice_finish_reasons.at(index), finish_reason);
  }
  EXPECT_GE(closed, 1);
}

// response_format json_schema: every choice is a value the schema admits or its beginning, its
// keys in the order the request lists them (not sorted), streamed or not; a schema the server
// cannot hold answers to is a 400 naming the place in it.
TEST_F(ServerE2E, JsonSchemaAnswersFollowTheSchemaInItsOrder) {
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
      "type": "object",
      "properties": {"name": {"type": "string", "maxLength": 8},
                     "mood": {"enum": ["happy", "sad", "sleepy"]},
                     "legs": {"enum": [2, 4]}},
      "required": ["name", "mood", "legs"]})");
  nlohmann::ordered_json body =
      with(chat_body("Tell me about a cat as JSON.", 64), "temperature", 1.0);
  body["n"] = 4;
  body["seed"] = 9;
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"name", "cat"}, {"schema", schema}}}};
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const Stream stream = post_stream(port(), "/v1/chat/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  const auto compiled = JsonSchema::compile(schema);
  int whole_values = 0;
  for (const json& choice : whole.body["choices"]) {
    const std::string text = choice["message"]["content"];
    SCOPED_TRACE(text);
    SchemaPrefix prefix(*compiled);
    EXPECT_TRUE(prefix.feed(text));
    const std::string finish_reason = choice["finish_reason"];
    if (finish_reason == "stop") {
      EXPECT_TRUE(prefix.complete());
      const auto value = nlohmann::ordered_json::parse(text);
      std::vector<std::string> keys;
      for (const auto& [key, member] : value.items()) keys.push_back(key);
      EXPECT_EQ(keys, (std::vector<std::string>{"name", "mood", "legs"}));
      EXPECT_LE(value["name"].get<std::string>().size(), 8u);
      EXPECT_TRUE(value["legs"] == 2 || value["legs"] == 4);
      ++whole_values;
    }
    const int index = choice["index"];
    EXPECT_EQ(stream.choice_texts.at(index), text);
    EXPECT_EQ(stream.choice_finish_reasons.at(index), finish_reason);
  }
  EXPECT_GE(whole_values, 1);

  body["response_format"]["json_schema"]["schema"]["properties"]["name"]["pattern"] = "^[A-Z]";
  const Reply refused = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "response_format.json_schema.schema");
  EXPECT_NE(refused.body["error"]["message"].get<std::string>().find(
                "at #/properties/name: pattern is not supported"),
            std::string::npos)
      << refused.raw;
}

// vLLM's guided_choice and guided_regex (and structured_outputs.choice): every choice is one of
// the texts, or matches the pattern whole, and ends there, streamed or not, on both endpoints; a
// pattern no automaton holds is a 400 naming guided_regex and the place.
TEST_F(ServerE2E, GuidedChoiceAndRegexAnswersAreTheirTextsWhole) {
  const std::vector<std::string> moods = {"happy", "sad", "sleepy"};
  json chat = with(chat_body("How does the cat feel?", 16), "temperature", 1.0);
  chat.update({{"n", 4}, {"seed", 3}, {"guided_choice", moods}});
  json completion = with(completion_body("Tim had a number:", 16), "temperature", 1.0);
  completion.update({{"n", 4}, {"seed", 4}, {"guided_regex", "[0-9]{3}-[a-z]{2,5}"}});
  // Today's vLLM spells guided_choice as structured_outputs.choice.
  json structured = chat;
  structured.erase("guided_choice");
  structured["structured_outputs"] = {{"choice", moods}};
  const std::regex code("[0-9]{3}-[a-z]{2,5}");
  for (const auto& [path, body] :
       {std::pair{"/v1/chat/completions", chat}, std::pair{"/v1/completions", completion},
        std::pair{"/v1/chat/completions", structured}}) {
    SCOPED_TRACE(path);
    const Reply whole = post(port(), path, body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const Stream stream = post_stream(port(), path, body);
    ASSERT_EQ(stream.status, 200) << stream.raw;
    ASSERT_EQ(whole.body["choices"].size(), 4u);
    for (const json& choice : whole.body["choices"]) {
      const bool chat_choice = choice.contains("message");
      const std::string text = chat_choice ? choice["message"]["content"] : choice["text"];
      SCOPED_TRACE(text);
      if (chat_choice) {
        EXPECT_NE(std::find(moods.begin(), moods.end(), text), moods.end());
      } else {
        EXPECT_TRUE(std::regex_match(text, code));
      }
      EXPECT_EQ(choice["finish_reason"], "stop");
      const int index = choice["index"];
      EXPECT_EQ(stream.choice_texts.at(index), text);
      EXPECT_EQ(stream.choice_finish_reasons.at(index), "stop");
    }
  }

  completion["guided_regex"] = "[0-9]{3}(?=-)";
  const Reply refused = post(port(), "/v1/completions", completion);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "guided_regex");
  EXPECT_NE(refused.body["error"]["message"].get<std::string>().find("at position 8"),
            std::string::npos)
      << refused.raw;
}

// guided_grammar, llama.cpp's grammar and structured_outputs.grammar: greedy and seeded sampled
// answers are texts the grammar derives, whole, streamed or not, on both endpoints; a grammar
// that cannot be held is a 400 naming its parameter and the place.
TEST_F(ServerE2E, GrammarAnswersAreTextsTheGrammarDerives) {
  const std::string grammar =
      "root ::= name \" \" verb \" \" [0-9]{1,2} \".\"\n"
      "name ::= \"Lily\" | \"Tom\" | \"Ben\"\n"
      "verb ::= \"ran\" | \"sat\" | \"ate\"  # one of three\n";
  const auto held = Grammar::from_gbnf(grammar);
  json greedy = with(chat_body("Who went out?", 32), "guided_grammar", grammar);
  json sampled = with(completion_body("Once upon a time", 32), "temperature", 1.0);
  sampled.update({{"n", 3}, {"seed", 5}, {"grammar", grammar}});
  json structured = with(chat_body("Tell me a story.", 32), "temperature", 1.0);
  structured.update({{"n", 2}, {"seed", 6}, {"structured_outputs", {{"grammar", grammar}}}});
  for (const auto& [path, body] :
       {std::pair{"/v1/chat/completions", greedy}, std::pair{"/v1/completions", sampled},
        std::pair{"/v1/chat/completions", structured}}) {
    SCOPED_TRACE(body.dump());
    const Reply whole = post(port(), path, body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const Stream stream = post_stream(port(), path, body);
    ASSERT_EQ(stream.status, 200) << stream.raw;
    ASSERT_EQ(whole.body["choices"].size(), size_t(body.value("n", 1)));
    for (const json& choice : whole.body["choices"]) {
      const std::string text =
          choice.contains("message") ? choice["message"]["content"] : choice["text"];
      SCOPED_TRACE(text);
      GrammarPrefix written(*held);
      EXPECT_TRUE(written.feed(text) && written.complete());
      EXPECT_EQ(choice["finish_reason"], "stop");
      const int index = choice["index"];
      EXPECT_EQ(stream.choice_texts.at(index), text);
      EXPECT_EQ(stream.choice_finish_reasons.at(index), "stop");
    }
  }

  sampled["grammar"] = "root ::= \"a\"\nroot ::= [b-";
  const Reply refused = post(port(), "/v1/completions", sampled);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "grammar");
  EXPECT_NE(refused.body["error"]["message"].get<std::string>().find("at line 2, column 10"),
            std::string::npos)
      << refused.raw;

  // A grammar that grows past what can be followed once the answer has begun (its second
  // character takes more than the step limit) fails that answer with a 400 naming it, and the
  // next grammar answered on the same threads is followed as if it had never been.
  json too_complex = completion_body("Once upon a time", 20);
  too_complex["guided_grammar"] = "root ::= [a-z ] x{200} \"b\"\nx ::= e{200}\ne ::= \"\" | \"\"";
  for (int again = 0; again < 2; ++again) {
    const Reply failed = post(port(), "/v1/completions", too_complex);
    ASSERT_EQ(failed.status, 400) << failed.raw;
    EXPECT_EQ(failed.body["error"]["param"], "guided_grammar") << failed.raw;
    EXPECT_NE(failed.raw.find("too complex to follow"), std::string::npos) << failed.raw;
  }
  json list = completion_body("Once upon a time", 60);
  list["guided_grammar"] = "root ::= ([a-z ] | [a-z ] [a-z ])* \".\"";
  const Reply after = post(port(), "/v1/completions", list);
  ASSERT_EQ(after.status, 200) << after.raw;
  const std::string text = after.body["choices"][0]["text"];
  if (after.body["choices"][0]["finish_reason"] == "stop")
    EXPECT_TRUE(text.find('.') == text.size() - 1) << text;
  else
    EXPECT_EQ(text.find('.'), std::string::npos) << text;
}

// The streams go to a server of their own whose window closes only when all sixteen wait
// (max_batch), so that however slowly they arrive (a loaded machine, a sanitizer build), one
// prefill takes them all; the solo answers come from the shared server, one at a time.
TEST_F(ServerE2E, SixteenConcurrentStreamsArePrefilledTogetherAndMatchTheirSoloAnswers) {
  constexpr int kRequests = 16;
  std::vector<std::string> solo;
  for (int i = 0; i < kRequests; ++i) {
    const Reply reply = post(port(), "/v1/chat/completions", chat_body(story_prompt(i), 24));
    ASSERT_EQ(reply.status, 200) << reply.raw;
    solo.push_back(chat_text(reply));
  }
  ServerProcess batched(stories_config("scheduler:\n  window_ms: 60000\n  max_batch: 16\n"));
  std::vector<std::future<Stream>> streams;
  for (int i = 0; i < kRequests; ++i)
    streams.push_back(std::async(std::launch::async, [&batched, i] {
      return post_stream(batched.port(), "/v1/chat/completions", chat_body(story_prompt(i), 24));
    }));
  for (int i = 0; i < kRequests; ++i) {
    const Stream stream = streams[i].get();
    ASSERT_EQ(stream.status, 200) << stream.raw;
    EXPECT_TRUE(stream.done);
    EXPECT_EQ(stream.text, solo[i]) << "request " << i;
  }
  EXPECT_EQ(metric(batched.port(), "pipeline_prefill_batches_total"), 1);
  EXPECT_EQ(metric(batched.port(), "pipeline_prefill_batch_size_sum"), kRequests);
}

// A raw connection to the server on which `bytes` were sent (a request, or the start of one);
// the caller closes it. A receive_buffer (bytes) shrinks the socket's buffer, for a client
// that stops reading to fill it soon.
int send_raw(int port, const std::string& bytes, int receive_buffer = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  if (receive_buffer > 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      write(fd, bytes.data(), bytes.size()) != ssize_t(bytes.size())) {
    close(fd);
    throw std::runtime_error("cannot send a request to port " + std::to_string(port));
  }
  return fd;
}

// A raw connection on which a POST of `body` to `path` was sent; the caller closes it.
int send_raw_post(int port, const std::string& path, const json& body, int receive_buffer = 0) {
  const std::string payload = body.dump();
  return send_raw(port,
                  "POST " + path +
                      " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Content-Type: application/json\r\nContent-Length: " +
                      std::to_string(payload.size()) + "\r\n\r\n" + payload,
                  receive_buffer);
}

// A raw connection on which a completion request was sent; the caller closes it.
int send_raw_completion(int port, const json& body, int receive_buffer = 0) {
  return send_raw_post(port, "/v1/completions", body, receive_buffer);
}

// What the server sent on a raw connection until the end of an answer's JSON error body ("}}")
// or of the connection.
std::string read_error_answer(int fd) {
  std::string received;
  char buffer[4096];
  for (ssize_t n;
       received.find("}}") == std::string::npos && (n = read(fd, buffer, sizeof buffer)) > 0;)
    received.append(buffer, size_t(n));
  return received;
}

// Everything the server sent on a raw connection until it closed it.
std::string read_to_end(int fd) {
  std::string received;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) received.append(buffer, size_t(n));
  return received;
}

// Opens a streaming request on a raw socket, reads until the first bytes of the body arrived,
// and hangs up.
void stream_then_hang_up(int port, const json& body) {
  const int fd = send_raw_completion(port, body);
  std::string received;
  char buffer[1024];
  while (received.find("data: ") == std::string::npos) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    ASSERT_GT(n, 0) << "the server closed before streaming";
    received.append(buffer, size_t(n));
  }
  ASSERT_NE(received.find("200 OK"), std::string::npos) << received;
  close(fd);
}

// A POST without a body (no Content-Length nor Transfer-Encoding: curl -X POST without -d) is
// refused at once, not once httplib's 5 s read timeout ends, with an OpenAI error body that
// says what is wrong: what the body lacks on a POST route, the method on a GET route.
TEST_F(ServerE2E, APostWithoutABodyIsToldWhatIsMissing) {
  const auto start = Clock::now();
  const auto answer_to_bodyless_post = [&](const std::string& path) {
    const int fd = send_raw(port(), "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    const std::string received = read_error_answer(fd);
    close(fd);
    return received;
  };
  auto health_answer = std::async(std::launch::async, answer_to_bodyless_post, "/health");
  const std::string completions = answer_to_bodyless_post("/v1/completions");
  health_answer.wait();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4)) << "the read timeout was waited out";
  EXPECT_NE(completions.find("HTTP/1.1 400"), std::string::npos) << completions;
  EXPECT_NE(completions.find("needs a body with a Content-Length header"), std::string::npos)
      << completions;
  const std::string health = health_answer.get();
  EXPECT_NE(health.find("HTTP/1.1 405"), std::string::npos) << health;
  EXPECT_NE(health.find("POST is not allowed on /health; use GET."), std::string::npos) << health;
  EXPECT_EQ(post(port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// httplib's own refusals say which limit was passed: a header line of 8 KiB, a URL of 8 KiB, a
// body of 16 MiB (read, so that the connection stays in step, then refused).
TEST_F(ServerE2E, RequestsPastTheProtocolLimitsAreToldWhichLimit) {
  const auto answer_to = [&](const std::string& request) {
    const int fd = send_raw(port(), request);
    const std::string received = read_error_answer(fd);
    close(fd);
    return received;
  };
  const std::string long_header = answer_to(
      "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  EXPECT_TRUE(long_header.starts_with("HTTP/1.1 400")) << long_header.substr(0, 100);
  EXPECT_NE(long_header.find("longer than the 8 KiB a header line may hold"), std::string::npos)
      << long_header;
  const std::string long_url =
      answer_to("GET /" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(long_url.starts_with("HTTP/1.1 414")) << long_url.substr(0, 100);
  EXPECT_NE(long_url.find("URL is longer than the 8 KiB"), std::string::npos) << long_url;
  const size_t too_big = (size_t(16) << 20) + 1;
  const std::string big_body = answer_to(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(too_big) +
      "\r\n\r\n" + std::string(too_big, 'a'));
  EXPECT_TRUE(big_body.starts_with("HTTP/1.1 413")) << big_body.substr(0, 100);
  EXPECT_NE(big_body.find("larger than the 16 MiB a request may hold"), std::string::npos)
      << big_body;
}

// Sends `request`, and 200 ms later a GET /health down the same connection, as a client (or a
// proxy in front) sends its next request; returns everything the server wrote until it closed.
std::string answers_with_a_request_behind(int port, const std::string& request) {
  const int fd = send_raw(port, request);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string next = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)::send(fd, next.data(), next.size(), MSG_NOSIGNAL);
  const std::string received = read_to_end(fd);
  close(fd);
  return received;
}

// A body whose length is unclear (two Content-Lengths that differ, one that is not a number, or
// one beside Transfer-Encoding) is refused, and its connection ends after the answer, which says
// so (Connection: close): bytes sent after it are never read as a next request, as a proxy in
// front might have read them (request smuggling). httplib took the first length, or waited 5 s
// on a length of -1 for a 413.
TEST_F(ServerE2E, ABodyOfUnclearLengthIsRefusedAndItsConnectionEnds) {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  for (const std::string& lengths :
       {std::string("Content-Length: 30\r\nContent-Length: 5\r\n"),
        std::string("Content-Length: -1\r\n"),
        std::string("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n")}) {
    SCOPED_TRACE(lengths);
    const auto start = Clock::now();
    const std::string received = answers_with_a_request_behind(port(), head + lengths + "\r\n");
    EXPECT_TRUE(received.starts_with("HTTP/1.1 400")) << received;
    EXPECT_NE(received.find("body length is unclear"), std::string::npos) << received;
    EXPECT_NE(received.find("\r\nConnection: close\r\n"), std::string::npos) << received;
    EXPECT_EQ(received.find("\"status\""), std::string::npos)
        << "the smuggled /health was answered";
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  }
}

// A body that stops arriving part-way is given up after httplib's 5 s read timeout with a 408
// that says how much came (it was a generic 400), and its connection ends: the rest of the body,
// sent late, is never read as a next request, and the answer says the connection closes.
TEST_F(ServerE2E, ABodyThatStopsArrivingIsA408AndItsConnectionEnds) {
  const int fd = send_raw(port(),
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                          "{\"prompt\":");
  const std::string answer = read_error_answer(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 408")) << answer;
  EXPECT_NE(answer.find("stopped arriving: 10 of its 100 bytes came before"), std::string::npos)
      << answer;
  EXPECT_NE(answer.find("\r\nConnection: close\r\n"), std::string::npos) << answer;
  const std::string late = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)::send(fd, late.data(), late.size(), MSG_NOSIGNAL);
  EXPECT_EQ(read_to_end(fd).find("\"status\""), std::string::npos) << "the late bytes were read";
  close(fd);
}

// A chunked body httplib cannot read (a chunk size that is not a hex number) is refused, and
// its connection ends: the bytes after the bad chunk are never read as a next request.
TEST_F(ServerE2E, AMalformedChunkedBodyIsRefusedAndItsConnectionEnds) {
  for (const std::string& chunks : {std::string("zz\r\n"), std::string("-1\r\n{}\r\n")}) {
    SCOPED_TRACE(chunks);
    const auto start = Clock::now();
    const std::string received = answers_with_a_request_behind(
        port(),
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks);
    EXPECT_TRUE(received.starts_with("HTTP/1.1 400")) << received;
    EXPECT_NE(received.find("\r\nConnection: close\r\n"), std::string::npos) << received;
    EXPECT_EQ(received.find("\"status\""), std::string::npos)
        << "the smuggled /health was answered";
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  }
}

// A request target in absolute form, as some proxies send it on, routes by its path.
TEST_F(ServerE2E, ARequestTargetInAbsoluteFormIsServed) {
  const std::string body = completion_body("Hi", 2).dump();
  const int fd = send_raw(port(), "POST http://127.0.0.1:" + std::to_string(port()) +
                                      "/v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      "Connection: close\r\nContent-Length: " +
                                      std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string received = read_to_end(fd);
  close(fd);
  EXPECT_TRUE(received.starts_with("HTTP/1.1 200")) << received;
  EXPECT_NE(received.find("\"object\":\"text_completion\""), std::string::npos) << received;
}

// A compressed body is refused with 415, not inflated: httplib would inflate it with no bound
// on its size. The body is read as sent, so the connection serves its next request.
TEST_F(ServerE2E, ACompressedBodyIsRefusedWithoutBeingInflated) {
  httplib::Client client("127.0.0.1", port());
  client.set_read_timeout(60);
  client.set_keep_alive(true);
  client.set_compress(true);  // gzip
  const std::string body = completion_body("Hi", 4).dump();
  httplib::Result refused = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 415) << refused->body;
  const json error = json::parse(refused->body)["error"];
  EXPECT_EQ(error["code"], "unsupported_content_encoding");
  EXPECT_NE(error["message"].get<std::string>().find("Content-Encoding 'gzip'"), std::string::npos)
      << error;
  client.set_compress(false);
  httplib::Result answered = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(answered) << httplib::to_string(answered.error());
  EXPECT_EQ(answered->status, 200) << answered->body;
  // Every coding of every Content-Encoding header counts; "identity" in any case is none.
  const httplib::Headers identity_then_gzip = {{"Content-Encoding", "identity"},
                                               {"Content-Encoding", "gzip"}};
  EXPECT_EQ(send(port(), "POST", "/v1/completions", body, identity_then_gzip).status, 415);
  EXPECT_EQ(
      send(port(), "POST", "/v1/completions", body, {{"Content-Encoding", "IDENTITY"}}).status,
      200);
}

// HTTP/1.0 knows no chunked encoding (nginx proxies with it by default, and refuses a chunked
// answer): a stream is the body until the server closes the connection.
TEST_F(ServerE2E, AnHttp10StreamIsNotChunkedAndEndsWithTheConnection) {
  const std::string payload = with(completion_body("Once upon a time", 8), "stream", true).dump();
  const int fd = send_raw(port(),
                          "POST /v1/completions HTTP/1.0\r\nContent-Type: "
                          "application/json\r\nContent-Length: " +
                              std::to_string(payload.size()) + "\r\n\r\n" + payload);
  const std::string received = read_to_end(fd);
  close(fd);
  const size_t body = received.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << received;
  const std::string headers = received.substr(0, body);
  EXPECT_NE(headers.find(" 200 "), std::string::npos) << headers;
  EXPECT_EQ(headers.find("Transfer-Encoding"), std::string::npos) << headers;
  EXPECT_TRUE(received.substr(body + 4).starts_with("data: {")) << received;
  EXPECT_TRUE(received.ends_with("data: [DONE]\n\n")) << received;
}

TEST_F(ServerE2E, AClientThatHangsUpMidStreamFreesItsBlocks) {
  for (int choices : {1, 3}) {
    SCOPED_TRACE("n = " + std::to_string(choices));
    const double failed_before = metric(port(), "pipeline_requests_failed_total");
    const double cancelled_before = metric(port(), "pipeline_requests_cancelled_total");
    const double generated_before = metric(port(), "pipeline_generation_tokens_total");
    json body = completion_body("Once upon a time", 480);
    body["ignore_eos"] = true;
    body["stream"] = true;
    body["n"] = choices;
    stream_then_hang_up(port(), body);

    EXPECT_EQ(kv_blocks_used_when_settled(port()), 0);
    // Every choice was cut short (cancelled), not run to its end.
    EXPECT_EQ(metric(port(), "pipeline_requests_failed_total") - failed_before, choices);
    EXPECT_EQ(metric(port(), "pipeline_requests_cancelled_total") - cancelled_before, choices);
    EXPECT_LT(metric(port(), "pipeline_generation_tokens_total") - generated_before, 480 * choices);
  }
  // And the server goes on serving.
  EXPECT_EQ(post(port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// A whole (not streamed) answer whose client hangs up while its tokens keep coming, each a few
// milliseconds after the last: the socket is asked on a timer, not only when no token came.
TEST_F(ServerE2E, AClientThatHangsUpBeforeAWholeAnswerEndsCancelsIt) {
  const double failed_before = metric(port(), "pipeline_requests_failed_total");
  const double generated_before = metric(port(), "pipeline_generation_tokens_total");
  const int choices = 32;  // 480 tokens each: about 1.5 s on two cores
  json body = completion_body("Once upon a time", 480);
  body["ignore_eos"] = true;
  body["n"] = choices;
  const int fd = send_raw_completion(port(), body);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  close(fd);

  EXPECT_EQ(kv_blocks_used_when_settled(port()), 0);
  EXPECT_EQ(metric(port(), "pipeline_requests_failed_total") - failed_before, choices);
  EXPECT_LT(metric(port(), "pipeline_generation_tokens_total") - generated_before, 480 * choices);
  EXPECT_EQ(post(port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// A client that leaves while its request waits in the batch window, streaming or not: the
// request is cancelled and never prefilled, rather than computed for nobody.
TEST(ServerE2EClientLeaves, ARequestWhoseClientLeftBeforeItsAnswerIsNeverRun) {
  ServerProcess server(stories_config("scheduler:\n  window_ms: 1500\n  max_batch: 16\n"));
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "whole answer");
    const double failed_before = metric(server.port(), "pipeline_requests_failed_total");
    const double prefills_before = metric(server.port(), "pipeline_prefill_batches_total");
    json body = completion_body("Once upon a time", 64);
    body["stream"] = stream;
    const int fd = send_raw_completion(server.port(), body);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    close(fd);
    // The window closes 1.5 s after the arrival; the scheduler drops the request then.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (metric(server.port(), "pipeline_requests_failed_total") == failed_before &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(metric(server.port(), "pipeline_requests_failed_total") - failed_before, 1);
    EXPECT_EQ(metric(server.port(), "pipeline_prefill_batches_total"), prefills_before);
  }
  EXPECT_EQ(post(server.port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// A stream still waiting for its first token after server.sse_keepalive_s sends its 200
// headers then, and an SSE comment after each interval of silence, so that a proxy that ends
// silent connections (nginx: 60 s) keeps it; the answer then streams as usual. A refusal, which
// comes sooner, keeps its own status. Here the batch window holds the first token for 3.5 s.
TEST(ServerE2EKeepAlive, AStreamWaitingForItsFirstTokenStartsAndSaysItIsAlive) {
  ServerProcess server(stories_config("  sse_keepalive_s: 1\nscheduler:\n  window_ms: 3500\n"));
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completion");
    json body = chat ? chat_body("Hi", 8) : completion_body("Once upon a time", 8);
    body["stream"] = true;
    const auto start = Clock::now();
    const int fd =
        send_raw_post(server.port(), chat ? "/v1/chat/completions" : "/v1/completions", body);
    std::string received;
    std::optional<Clock::duration> headers_after, comment_after, data_after;
    char buffer[4096];
    for (ssize_t n; received.find("data: [DONE]") == std::string::npos &&
                    (n = read(fd, buffer, sizeof buffer)) > 0;) {
      received.append(buffer, size_t(n));
      const auto now = Clock::now() - start;
      if (!headers_after && received.find("\r\n\r\n") != std::string::npos) headers_after = now;
      if (!comment_after && received.find("\n: keep-alive\n\n") != std::string::npos)
        comment_after = now;
      if (!data_after && received.find("data: {") != std::string::npos) data_after = now;
    }
    close(fd);
    EXPECT_TRUE(received.starts_with("HTTP/1.1 200")) << received;
    ASSERT_TRUE(headers_after && comment_after && data_after) << received;
    EXPECT_LT(*headers_after, std::chrono::milliseconds(2500)) << "the headers waited for a token";
    EXPECT_LT(*comment_after, *data_after) << received;
    EXPECT_GT(*data_after, std::chrono::seconds(3)) << "the window did not hold the first token";
    EXPECT_NE(received.find("data: [DONE]"), std::string::npos) << received;
  }
  // Comments and all, a client reads the stream as before; a refusal keeps its 400.
  const Stream stream =
      post_stream(server.port(), "/v1/completions", completion_body("Once upon a time", 8));
  EXPECT_EQ(stream.status, 200);
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.finish_reason, "length");
  std::string too_long;
  for (int i = 0; i < 300; ++i) too_long += "Once upon a time ";
  EXPECT_EQ(post_stream(server.port(), "/v1/completions", completion_body(too_long, 8)).status,
            400);
}

struct BadCall {
  std::string method;
  std::string path;
  std::string body;
  int status;
  std::string param;  // the error body's param; empty: null
  std::string code;   // the error body's code; empty: null
  std::string message_part;
};

TEST_F(ServerE2E, EachBadInputGetsItsStatusAndBodyAndTheServerKeepsServing) {
  const std::string too_long = [] {
    std::string text;
    for (int i = 0; i < 300; ++i) text += "Once upon a time ";
    return text;
  }();
  const json good = chat_body("Hello", 8);
  const std::vector<BadCall> calls = {
      {"POST", "/v1/chat/completions", "{\"model\": ", 400, "", "", "JSON"},
      {"POST", "/v1/chat/completions", "[1, 2]", 400, "", "", "JSON object"},
      {"POST", "/v1/chat/completions",
       json{{"model", "gpt-4"}, {"messages", good["messages"]}}.dump(), 404, "model",
       "model_not_found", "gpt-4"},
      {"POST", "/v1/chat/completions", with(good, "n", 1000).dump(), 400, "n", "",
       "'n' must be between 1 and"},
      {"POST", "/v1/chat/completions", with(good, "temperature", 5).dump(), 400, "temperature", "",
       "temperature"},
      {"POST", "/v1/chat/completions", with(good, "messages", "hi").dump(), 400, "messages", "",
       "array"},
      {"POST", "/v1/chat/completions", with(good, "echo", true).dump(), 400, "echo", "", "echo"},
      {"POST", "/v1/completions", completion_body("x", 600).dump(), 400, "max_tokens", "",
       "maximum context length is 512 tokens"},
      {"POST", "/v1/completions", completion_body(too_long, 4).dump(), 400, "prompt", "", "512"},
      {"POST", "/v1/completions", with(completion_body(too_long, 4), "stream", true).dump(), 400,
       "prompt", "", "512"},
      {"POST", "/v1/chat/completions",
       with(good, "messages", {{{"role", "assistant"}, {"content", "x"}}}).dump(), 400,
       "messages[0].role", "", "alternate"},
      {"GET", "/v1/chat/completions", "", 405, "", "method_not_allowed", "POST"},
      {"POST", "/v1/models", "{}", 405, "", "method_not_allowed", "GET"},
      {"GET", "/v1/nothing-here", "", 404, "", "unknown_url", "/v1/nothing-here"},
      {"GET", "/v1/models/gpt-4", "", 404, "", "model_not_found", "gpt-4"},
      {"GET", "/v1/models/", "", 404, "", "unknown_url", "/v1/models/"},
      {"POST", "/v1/chat/completions", with(good, "logit_bias", {{"600", 5}}).dump(), 400,
       "logit_bias", "", "vocabulary has 512 tokens"},
      {"POST", "/v1/chat/completions", with(good, "stop_token_ids", {600}).dump(), 400,
       "stop_token_ids", "", "stop_token_ids names token 600 but the vocabulary has 512 tokens"},
      {"POST", "/tokenize", "[1, 2]", 400, "", "", "JSON object"},
      {"POST", "/tokenize", json{{"model", "gpt-4"}, {"prompt", "Hi"}}.dump(), 404, "model",
       "model_not_found", "gpt-4"},
      {"POST", "/tokenize",
       json{{"model", kModel}, {"prompt", "Hi"}, {"messages", good["messages"]}}.dump(), 400,
       "prompt", "", "not both"},
      {"POST", "/tokenize",
       json{{"model", kModel}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}}.dump(), 400,
       "messages[0].role", "", "tool"},
      {"POST", "/detokenize", json{{"model", kModel}, {"tokens", {1, 512}}}.dump(), 400, "tokens",
       "", "outside the vocabulary of 512"},
      {"POST", "/detokenize", json{{"model", kModel}, {"tokens", {1, -3}}}.dump(), 400, "tokens",
       "", "token id -3"},
      {"POST", "/detokenize", json{{"model", kModel}, {"tokens", {1, 2.5}}}.dump(), 400, "tokens",
       "", "array of token ids"},
      {"GET", "/tokenize", "", 405, "", "method_not_allowed", "POST"},
      {"GET", "/detokenize", "", 405, "", "method_not_allowed", "POST"},
  };
  for (const BadCall& call : calls) {
    SCOPED_TRACE(call.method + " " + call.path + " " + call.body.substr(0, 200));
    const Reply reply = send(port(), call.method, call.path, call.body);
    EXPECT_EQ(reply.status, call.status) << reply.raw;
    ASSERT_TRUE(reply.body.is_object()) << reply.raw;
    const json& error = reply.body["error"];
    ASSERT_TRUE(error.is_object()) << reply.raw;
    EXPECT_TRUE(error["message"].is_string());
    EXPECT_TRUE(error["type"].is_string());
    EXPECT_EQ(error["param"], call.param.empty() ? json() : json(call.param));
    EXPECT_EQ(error["code"], call.code.empty() ? json() : json(call.code));
    EXPECT_NE(error["message"].get<std::string>().find(call.message_part), std::string::npos)
        << error["message"];
    if (call.status == 405) {
      const auto allow = reply.headers.find("Allow");
      ASSERT_NE(allow, reply.headers.end()) << reply.raw;
      EXPECT_EQ(allow->second, call.message_part);
    }
    const Reply after = post(port(), "/v1/chat/completions", good);
    EXPECT_EQ(after.status, 200) << after.raw;
  }
}

TEST_F(ServerE2E, ModelsHealthAndMetrics) {
  const Reply models = send(port(), "GET", "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  ASSERT_EQ(models.body["data"].size(), 1u);
  EXPECT_EQ(models.body["data"][0]["id"], kModel);
  EXPECT_EQ(models.body["data"][0]["object"], "model");
  EXPECT_EQ(models.body["data"][0]["max_model_len"], 512);  // vLLM's: the model's context
  EXPECT_EQ(send(port(), "GET", std::string("/v1/models/") + kModel, "").body["id"], kModel);
  const Reply health = send(port(), "GET", "/health", "");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["status"], "ok");
  EXPECT_EQ(send(port(), "GET", "/no/such/route", "").status, 404);
  // Each answer is counted before it is written, so this read finds both.
  const std::string metrics = send(port(), "GET", "/metrics", "").raw;
  EXPECT_NE(metrics.find("pipeline_kv_blocks_used"), std::string::npos);
  EXPECT_NE(metrics.find("pipeline_http_requests_total{route=\"/health\",status=\"200\"}"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("pipeline_http_requests_total{route=\"other\",status=\"404\"}"),
            std::string::npos)
      << metrics;
}

// ---- Servers of their own

TEST(ServerE2EContinuousBatching, ANewcomerGetsItsFirstTokenWhileOthersAreStillDecoding) {
  // A short batch window, so that the newcomer's wait is short beside the others' decoding.
  ServerProcess server(stories_config("scheduler:\n  window_ms: 10\n"));
  const int port = server.port();
  // Long runs: ignore_eos keeps them going for max_tokens.
  constexpr int kLong = 4;
  auto long_body = [](int i) {
    json body = completion_body(story_prompt(i), 480);
    body["ignore_eos"] = true;
    return body;
  };
  const std::string newcomer_solo =
      post(port, "/v1/completions", completion_body("The cat sat", 8)).body["choices"][0]["text"];
  std::vector<std::string> long_solo;
  for (int i = 0; i < kLong; ++i)
    long_solo.push_back(post(port, "/v1/completions", long_body(i)).body["choices"][0]["text"]);

  std::vector<std::future<Stream>> running;
  for (int i = 0; i < kLong; ++i)
    running.push_back(std::async(
        std::launch::async, [&, i] { return post_stream(port, "/v1/completions", long_body(i)); }));
  // Once they decode (some tokens are out), the newcomer arrives.
  const auto decoding_deadline = Clock::now() + std::chrono::seconds(20);
  while (metric(port, "pipeline_running_sequences") < kLong && Clock::now() < decoding_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const Stream newcomer = post_stream(port, "/v1/completions", completion_body("The cat sat", 8));
  ASSERT_EQ(newcomer.status, 200) << newcomer.raw;
  EXPECT_EQ(newcomer.text, newcomer_solo);

  Clock::time_point first_long_end = Clock::time_point::max();
  for (int i = 0; i < kLong; ++i) {
    const Stream stream = running[i].get();
    ASSERT_EQ(stream.status, 200) << stream.raw;
    EXPECT_EQ(stream.text, long_solo[i]) << "long request " << i;
    first_long_end = std::min(first_long_end, stream.event_times.back());
  }
  EXPECT_LT(newcomer.first_content_time, first_long_end)
      << "the newcomer waited for the running requests to finish";
}

TEST(ServerE2ESmallKvPool, EveryRequestCompletesAsItWouldAlone) {
  // 24 blocks of 16 tokens: one request fits, eight at once do not (preemption and recompute).
  ServerProcess server(stories_config("scheduler:\n  window_ms: 50\n  kv_cache_blocks: 24\n"));
  constexpr int kRequests = 8;
  auto body = [](int i) {
    json b = completion_body(story_prompt(i), 120);
    b["ignore_eos"] = true;
    return b;
  };
  std::vector<std::string> solo;
  for (int i = 0; i < kRequests; ++i) {
    const Reply reply = post(server.port(), "/v1/completions", body(i));
    ASSERT_EQ(reply.status, 200) << reply.raw;
    solo.push_back(reply.body["choices"][0]["text"]);
  }
  std::vector<std::future<Stream>> streams;
  for (int i = 0; i < kRequests; ++i)
    streams.push_back(std::async(std::launch::async, [&, i] {
      return post_stream(server.port(), "/v1/completions", body(i));
    }));
  for (int i = 0; i < kRequests; ++i) {
    const Stream stream = streams[i].get();
    ASSERT_EQ(stream.status, 200) << stream.raw;
    EXPECT_TRUE(stream.done);
    EXPECT_EQ(stream.finish_reason, "length");
    EXPECT_EQ(stream.text, solo[i]) << "request " << i;
  }
  EXPECT_GT(metric(server.port(), "pipeline_preemptions_total"), 0) << "the pool was not tight";
  // 24 blocks of 16 hold 384 tokens, fewer than stories260K's 512: said at the start.
  EXPECT_NE(server.stderr_text().find("warning: the KV cache holds 384 tokens, fewer than the "
                                      "model's context of 512"),
            std::string::npos)
      << server.stderr_text();
  EXPECT_EQ(kv_blocks_used_when_settled(server.port()), 0);
  EXPECT_EQ(server.terminate(std::chrono::seconds(20)), 0) << server.stderr_text();
}

bool can_listen_on_ipv6_loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return bound;
}

// The address printed is one a client can use: an IPv6 host in brackets (it was http://::1:PORT).
TEST(ServerE2EHost, AnIpv6HostIsPrintedInBracketsAndServes) {
  if (!can_listen_on_ipv6_loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  ServerProcess server(stories_config(), {"--host", "::1"});
  EXPECT_NE(server.stderr_text().find("listening on http://[::1]:" + std::to_string(server.port())),
            std::string::npos)
      << server.stderr_text();
  httplib::Client client("::1", server.port());
  const auto health = client.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
}

// As vLLM's --api-key: the /v1 routes need it; /health, /metrics and the token routes do not.
TEST(ServerE2EApiKey, EveryV1RouteNeedsTheKey) {
  ServerProcess server(stories_config("  api_key: sesame\n"));
  const httplib::Headers right = {{"Authorization", "Bearer sesame"}};
  const httplib::Headers wrong = {{"Authorization", "Bearer nope"}};
  const std::string body = chat_body("Hi", 4).dump();
  for (const auto& headers : {httplib::Headers{}, wrong}) {
    for (const auto& [method, path] :
         std::vector<std::pair<std::string, std::string>>{{"POST", "/v1/chat/completions"},
                                                          {"POST", "/v1/completions"},
                                                          {"GET", "/v1/models"},
                                                          {"GET", "/v1/models/stories260K"},
                                                          {"GET", "/v1/nowhere"}}) {
      const Reply reply = send(server.port(), method, path, body, headers);
      EXPECT_EQ(reply.status, 401) << method << " " << path;
      EXPECT_EQ(reply.body["error"]["code"], "invalid_api_key");
    }
  }
  EXPECT_EQ(send(server.port(), "GET", "/health", "").status, 200);
  EXPECT_EQ(send(server.port(), "GET", "/metrics", "").status, 200);
  const std::string text = json{{"model", kModel}, {"prompt", "Hi"}}.dump();
  EXPECT_EQ(send(server.port(), "POST", "/tokenize", text).status, 200);
  EXPECT_EQ(send(server.port(), "POST", "/v1/chat/completions", body, right).status, 200);
  EXPECT_EQ(send(server.port(), "GET", "/v1/models", "", right).status, 200);
  // The scheme's case does not matter (RFC 7235); the key's does.
  EXPECT_EQ(
      send(server.port(), "GET", "/v1/models", "", {{"Authorization", "bearer sesame"}}).status,
      200);
  EXPECT_EQ(
      send(server.port(), "GET", "/v1/models", "", {{"Authorization", "Bearer SESAME"}}).status,
      401);
  const std::string tokens = json{{"model", kModel}, {"tokens", {1, 2}}}.dump();
  EXPECT_EQ(send(server.port(), "POST", "/detokenize", tokens, right).status, 200);
}

// A refused request's body is read before the refusal is answered: left unread, its bytes were
// taken for the next requests on the connection, so a body could carry a request of its own
// past the key (here /health requests, whose answers would come before the models list).
TEST(ServerE2EApiKey, ARefusedBodyIsReadNotTakenForTheNextRequest) {
  ServerProcess server(stories_config("  api_key: sesame\n"));
  std::string smuggled = "ZZZZZZ";
  while (smuggled.size() < 20000) smuggled += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const int fd = send_raw(server.port(),
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          "application/json\r\nContent-Length: " +
                              std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
  const std::string refused = read_error_answer(fd);
  EXPECT_NE(refused.find("HTTP/1.1 401"), std::string::npos) << refused;
  const std::string next =
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(write(fd, next.data(), next.size()), ssize_t(next.size()));
  const std::string received = read_to_end(fd);
  close(fd);
  EXPECT_TRUE(received.starts_with("HTTP/1.1 200")) << received.substr(0, 300);
  EXPECT_NE(received.find("\"object\":\"list\""), std::string::npos) << received.substr(0, 300);
  EXPECT_EQ(received.find("\"status\":\"ok\""), std::string::npos) << received.substr(0, 300);
}

// A header of an answer, "" when it has none.
std::string header_of(const Reply& reply, const std::string& name) {
  const auto it = reply.headers.find(name);
  return it == reply.headers.end() ? "" : it->second;
}

// CORS, as vLLM answers it: a browser's preflight (OPTIONS naming the origin and method) from
// a listed origin is answered without the API key, which it never carries, and every answer to
// that origin names it, errors too, so that the page can read them. Other origins get no CORS
// header, and their preflight a 400.
TEST(ServerE2ECors, ListedOriginsMayCallFromABrowserAndOthersMayNot) {
  ServerProcess server(stories_config(
      "  api_key: sesame\n  allowed_origins: [https://chat.example.com, https://b.example]\n"));
  httplib::Client client("127.0.0.1", server.port());
  const std::string page = "https://chat.example.com";
  const auto preflight = [&](const std::string& origin) {
    return client.Options("/v1/chat/completions",
                          {{"Origin", origin},
                           {"Access-Control-Request-Method", "POST"},
                           {"Access-Control-Request-Headers", "authorization, content-type"}});
  };
  const httplib::Result allowed = preflight(page);
  ASSERT_TRUE(allowed) << httplib::to_string(allowed.error());
  EXPECT_EQ(allowed->status, 204) << allowed->body;
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), page);
  EXPECT_EQ(allowed->get_header_value("Vary"), "Origin");
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Methods"), "GET, POST, OPTIONS");
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Headers"),
            "authorization, content-type");

  const httplib::Result refused = preflight("https://evil.example");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "cors_origin_not_allowed");
  EXPECT_FALSE(refused->has_header("Access-Control-Allow-Origin"));

  const std::string body = completion_body("Hi", 2).dump();
  const Reply answered = send(server.port(), "POST", "/v1/completions", body,
                              {{"Origin", page}, {"Authorization", "Bearer sesame"}});
  EXPECT_EQ(answered.status, 200) << answered.raw;
  EXPECT_EQ(header_of(answered, "Access-Control-Allow-Origin"), page);
  const Reply no_key = send(server.port(), "POST", "/v1/completions", body, {{"Origin", page}});
  EXPECT_EQ(no_key.status, 401);
  EXPECT_EQ(header_of(no_key, "Access-Control-Allow-Origin"), page);
  const Reply other =
      send(server.port(), "GET", "/health", "", {{"Origin", "https://evil.example"}});
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(header_of(other, "Access-Control-Allow-Origin"), "");
}

// By default any origin may call ("*"); with server.allowed_origins [] no answer has a CORS
// header and a preflight is an OPTIONS like any other (405).
TEST(ServerE2ECors, AnyOriginByDefaultNoneWhenTheListIsEmpty) {
  const httplib::Headers preflight{{"Origin", "https://a.example"},
                                   {"Access-Control-Request-Method", "POST"}};
  {
    ServerProcess server(stories_config());
    const Reply models =
        send(server.port(), "GET", "/v1/models", "", {{"Origin", "https://a.example"}});
    EXPECT_EQ(header_of(models, "Access-Control-Allow-Origin"), "*");
    const httplib::Result answer =
        httplib::Client("127.0.0.1", server.port()).Options("/v1/completions", preflight);
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->status, 204);
    EXPECT_EQ(answer->get_header_value("Access-Control-Allow-Origin"), "*");
  }
  ServerProcess server(stories_config("  allowed_origins: []\n"));
  const httplib::Result answer =
      httplib::Client("127.0.0.1", server.port()).Options("/v1/completions", preflight);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 405);
  EXPECT_FALSE(answer->has_header("Access-Control-Allow-Origin"));
}

// More requests at once than any fixed pool of connection threads would serve: every one the
// queue can hold reaches the engine at once (a window holds them all), none waits unseen for
// a thread, and all complete.
TEST(ServerE2EQueueFull, EveryRequestTheQueueCanHoldReachesTheEngine) {
  ServerProcess server(
      stories_config("  max_queue: 120\nscheduler:\n  window_ms: 3000\n  max_batch: 128\n"));
  constexpr int kRequests = 100;
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < kRequests; ++i)
    replies.push_back(std::async(std::launch::async, [&, i] {
      return post(server.port(), "/v1/completions", completion_body(story_prompt(i), 4));
    }));
  const auto deadline = Clock::now() + std::chrono::milliseconds(2500);
  while (metric(server.port(), "pipeline_requests_added_total") < kRequests &&
         Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(metric(server.port(), "pipeline_requests_added_total"), kRequests);
  EXPECT_EQ(metric(server.port(), "pipeline_prefill_batches_total"), 0) << "the window closed";
  for (auto& future : replies) EXPECT_EQ(future.get().status, 200);
}

TEST(ServerE2EQueueFull, RequestsBeyondTheQueueGet503AndTheOthersComplete) {
  // The batch window holds the first two in the waiting queue while the rest arrive.
  ServerProcess server(stories_config("  max_queue: 2\nscheduler:\n  window_ms: 1000\n"));
  constexpr int kRequests = 6;
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < kRequests; ++i)
    replies.push_back(std::async(std::launch::async, [&, i] {
      return post(server.port(), "/v1/completions", completion_body(story_prompt(i), 4));
    }));
  int accepted = 0;
  for (auto& future : replies) {
    const Reply reply = future.get();
    if (reply.status == 200) {
      ++accepted;
      continue;
    }
    EXPECT_EQ(reply.status, 503) << reply.raw;
    EXPECT_EQ(reply.body["error"]["code"], "queue_full") << reply.raw;
    const auto retry_after = reply.headers.find("Retry-After");
    ASSERT_NE(retry_after, reply.headers.end()) << "no Retry-After";
    EXPECT_EQ(retry_after->second, "1");
  }
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(post(server.port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// With the queue full, a request that can never run (its max_tokens, or its prompt's token
// ids, past the context) is still told so with its 400, not a 503 that invites a retry.
TEST(ServerE2EQueueFull, ARequestThatCanNeverFitGets400EvenWithTheQueueFull) {
  ServerProcess server(stories_config("  max_queue: 1\nscheduler:\n  window_ms: 3000\n"));
  auto waiting = std::async(std::launch::async, [&] {
    return post(server.port(), "/v1/completions", completion_body("Once upon a time", 4));
  });
  for (const auto until = Clock::now() + std::chrono::seconds(5);
       metric(server.port(), "pipeline_waiting_sequences") < 1 && Clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const Reply full = post(server.port(), "/v1/completions", completion_body("Hi", 4));
  EXPECT_EQ(full.status, 503) << full.raw;
  const Reply too_many = post(server.port(), "/v1/completions", completion_body("Hi", 5000));
  EXPECT_EQ(too_many.status, 400) << too_many.raw;
  EXPECT_EQ(too_many.body["error"]["param"], "max_tokens") << too_many.raw;
  EXPECT_NE(too_many.raw.find("maximum context length is 512 tokens. However, you requested at "
                              "least 5002 tokens (at least 2 in the prompt"),
            std::string::npos)
      << too_many.raw;
  const Reply long_ids = post(server.port(), "/v1/completions",
                              with(completion_body("", 4), "prompt", std::vector<int>(600, 300)));
  EXPECT_EQ(long_ids.status, 400) << long_ids.raw;
  EXPECT_EQ(long_ids.body["error"]["param"], "prompt") << long_ids.raw;
  EXPECT_EQ(waiting.get().status, 200);
}

// A client may keep its connection for as many requests as it likes, as with vLLM's uvicorn;
// httplib's default closed it after 5.
TEST_F(ServerE2E, AKeptAliveConnectionServesRequestAfterRequest) {
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const int fd = send_raw(port(), health);
  for (int i = 1; i <= 12; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    std::string answer;
    char buffer[1024];
    for (ssize_t n; answer.find("{\"status\":\"ok\"}") == std::string::npos &&
                    (n = read(fd, buffer, sizeof buffer)) > 0;)
      answer.append(buffer, size_t(n));
    ASSERT_TRUE(answer.starts_with("HTTP/1.1 200")) << answer;
    ASSERT_NE(answer.find("{\"status\":\"ok\"}"), std::string::npos) << answer;
    EXPECT_EQ(answer.find("Connection: close"), std::string::npos) << answer;
    if (i < 12) {
      ASSERT_EQ(write(fd, health.data(), health.size()), ssize_t(health.size()));
    }
  }
  close(fd);
}

// The server has a connection thread for each request the engine may hold and 16 more (here
// 2 + 4 + 16). Clients that hold them all without a request to answer (sending a request a
// header line every `period`, or keeping a connection open between requests, as client pools
// do) must not shut a new client out: its /health is answered while they hold on, within
// `within`.
void expect_health_answered_beside_slow_clients(std::chrono::milliseconds period,
                                                std::chrono::seconds within) {
  ServerProcess server(stories_config("  max_queue: 4\nscheduler:\n  max_num_seqs: 2\n"));
  constexpr int kThreads = 2 + 4 + 16;
  std::vector<int> slow;
  for (int i = 0; i < kThreads; ++i)
    slow.push_back(send_raw(server.port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  std::atomic<bool> answered{false};
  std::thread trickle([&] {
    const std::string line = "X-Slow: 1\r\n";
    const auto end = Clock::now() + 2 * within;
    while (!answered && Clock::now() < end) {
      for (auto next = Clock::now() + period; !answered && Clock::now() < next;)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      // MSG_NOSIGNAL: the server may have closed the connection.
      for (int fd : slow) ::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // each holds a thread by now
  const auto start = Clock::now();
  std::string answer, failed;  // errors are caught, so that the trickling thread is joined
  try {
    // Connected first and its request sent later, as a client may: the server's scans for
    // slow clients meet the connection before its bytes, while it waits for a thread.
    const int fd = send_raw(server.port(), "");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string request =
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) != ssize_t(request.size()))
      failed = "the request could not be sent";
    answer = read_to_end(fd);
    close(fd);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  const auto waited = Clock::now() - start;
  answered = true;
  trickle.join();
  for (int fd : slow) close(fd);
  EXPECT_EQ(failed, "");
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 200")) << "the /health connection was cut: " << answer;
  EXPECT_LT(waited, within) << "the slow clients kept every thread";
}

// A header line a second: each connection is quiet for longer than a request's bytes take.
TEST(ServerE2EConnections, ClientsHoldingEveryThreadWithoutARequestDoNotShutOthersOut) {
  expect_health_answered_beside_slow_clients(std::chrono::milliseconds(1000),
                                             std::chrono::seconds(5));
}

// A header line every 100 ms: never quiet, but sending one request for longer than the server
// lets a connection hold a thread while others wait (5 s).
TEST(ServerE2EConnections, ClientsTricklingRequestsIntoEveryThreadDoNotShutOthersOut) {
  expect_health_answered_beside_slow_clients(std::chrono::milliseconds(100),
                                             std::chrono::seconds(10));
}

// A stream of 400 tokens, and SIGTERM once the server's `metric_name` reaches `at_least`; the
// server must exit 0.
Stream stream_through_sigterm(ServerProcess& server, const std::string& metric_name,
                              double at_least) {
  json body = completion_body("Once upon a time", 400);
  body["ignore_eos"] = true;
  auto in_flight = std::async(std::launch::async,
                              [&] { return post_stream(server.port(), "/v1/completions", body); });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (metric(server.port(), metric_name) < at_least && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(server.terminate(std::chrono::seconds(30)), 0) << server.stderr_text();
  return in_flight.get();
}

// A second server on a port already served fails at once, before it loads the model: loading
// first, a large model's second copy could take the memory the running server needs.
TEST(ServerE2EStartup, ASecondServerOnAPortInUseStopsBeforeLoadingTheModel) {
  ServerProcess first(stories_config());
  const auto dir = testing::make_temp_dir("second-server");
  std::ofstream(dir / "serve.yaml") << stories_config();
  const testing::CommandResult second =
      testing::run_pipeline({"run", (dir / "serve.yaml").string(), "--port",
                             std::to_string(first.port()), "--device", "cpu"});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("cannot listen on 127.0.0.1:" + std::to_string(first.port()) +
                            ": Address already in use"),
            std::string::npos)
      << second.err;
  EXPECT_EQ(second.err.find("engine: model"), std::string::npos) << "it loaded the model first";
  httplib::Client client("127.0.0.1", first.port());
  const auto health = client.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
}

// A host that is no address of this machine's, or no address at all, is refused before the
// model loads, saying which, with a fixed port or with any free one (--port 0).
TEST(ServerE2EStartup, AHostItCannotListenOnStopsBeforeLoadingTheModel) {
  const auto dir = testing::make_temp_dir("bad-host");
  std::ofstream(dir / "serve.yaml") << stories_config();
  const std::pair<std::string, std::string> hosts[] = {
      {"no such host!", "the host does not resolve to an address"},
      {"192.0.2.1", "Cannot assign requested address"}};  // TEST-NET-1: nobody's
  for (const std::string port : {"0", "18231"}) {
    for (const auto& [host, why] : hosts) {
      const testing::CommandResult result = testing::run_pipeline(
          {"run", (dir / "serve.yaml").string(), "--host", host, "--port", port});
      EXPECT_EQ(result.exit_code, 1);
      EXPECT_NE(result.err.find("cannot listen on " + host + ":" + port + ": " + why),
                std::string::npos)
          << result.err;
      EXPECT_EQ(result.err.find("engine: model"), std::string::npos) << "it loaded the model";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(ServerE2EShutdown, SigtermFinishesTheStreamInFlightAndExitsZero) {
  ServerProcess server(stories_config("scheduler:\n  window_ms: 0\n"));
  const Stream stream = stream_through_sigterm(server, "pipeline_running_sequences", 1);
  EXPECT_EQ(stream.status, 200);
  EXPECT_TRUE(stream.done) << stream.raw.substr(stream.raw.size() > 500 ? stream.raw.size() - 500
                                                                        : 0);
  EXPECT_EQ(stream.finish_reason, "length");
}

// With no grace, a stream already under way ends with an error event (503, shutting down)
// followed by [DONE], as a stream that finishes ends with its finish chunk and [DONE].
TEST(ServerE2EShutdown, AStreamCutOffByTheShutdownEndsWithItsErrorAndDone) {
  ServerProcess server(stories_config("  shutdown_grace_s: 0\nscheduler:\n  window_ms: 0\n"));
  const Stream stream = stream_through_sigterm(server, "pipeline_generation_tokens_total", 20);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.finish_reason, "") << "the stream finished before the shutdown";
  const json& last = stream.events.back();
  ASSERT_TRUE(last.contains("error")) << last.dump();
  EXPECT_EQ(last["error"]["message"], "server shutting down");
  EXPECT_EQ(last["error"]["code"], "shutting_down");
  EXPECT_TRUE(stream.done) << stream.raw.substr(stream.raw.size() > 500 ? stream.raw.size() - 500
                                                                        : 0);
}

// A client that keeps its connection open between requests (as HTTP client libraries' pools
// do) does not hold the exit back for the keep-alive timeout (5 s).
TEST(ServerE2EShutdown, AnIdleKeepAliveConnectionDoesNotDelayTheExit) {
  ServerProcess server(stories_config(""));
  httplib::Client client("127.0.0.1", server.port());
  client.set_keep_alive(true);
  const httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health && health->status == 200);
  const auto start = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(20)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(3500)) << server.stderr_text();
}

// A client still sending its request's body (a byte a second) when the server is told to stop
// does not hold the exit back: its request would only be refused, and it is cut off.
TEST(ServerE2EShutdown, AClientStillSendingItsBodyDoesNotHoldTheExit) {
  ServerProcess server(stories_config("  shutdown_grace_s: 1\n"));
  const int fd = send_raw(server.port(),
                          "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                          "{\"prompt\": \"");
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done.load() && send(fd, "a", 1, MSG_NOSIGNAL) == 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(30)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(8)) << server.stderr_text();
  done.store(true);
  trickle.join();
  close(fd);
}

// Streams whose clients stopped reading (their socket buffers full) do not hold the exit long
// past the grace: once the engine ended every request, their last chunks get a second, then
// their connections are cut. Each write to them would otherwise wait out httplib's 5 s timeout.
TEST(ServerE2EShutdown, StreamsWhoseClientsStoppedReadingDoNotHoldTheExitPastTheGrace) {
  ServerProcess server(
      stories_config("  shutdown_grace_s: 1\nscheduler:\n  window_ms: 50\n  max_batch: 16\n  "
                     "max_num_seqs: 16\n"));
  json body = completion_body("Once upon a time", 480);
  body["ignore_eos"] = true;
  body["stream"] = true;
  body["n"] = 16;
  body["temperature"] = 1.0;
  std::vector<int> clients;
  for (int i = 0; i < 4; ++i)
    clients.push_back(send_raw_completion(server.port(), body, /*receive_buffer=*/2048));
  // Long enough for their answers to fill the sockets' buffers.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto start = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(30)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(4500)) << server.stderr_text();
  for (const int fd : clients) close(fd);
}

// A second SIGTERM ends the grace at once: a request still in flight (here 128 choices of 400
// tokens, one at a time, seconds of work) fails with a 503 and the server exits 0 without
// waiting the grace out.
TEST(ServerE2EShutdown, ASecondSigtermFailsWhatIsStillInFlightAtOnce) {
  ServerProcess server(stories_config(
      "  shutdown_grace_s: 60\nscheduler:\n  window_ms: 30000\n  max_num_seqs: 1\n"));
  json body = completion_body("Once upon a time", 400);
  body["n"] = 128;
  body["ignore_eos"] = true;
  auto waiting =
      std::async(std::launch::async, [&] { return post(server.port(), "/v1/completions", body); });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (metric(server.port(), "pipeline_waiting_sequences") < 1 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server.signal(SIGTERM);
  ASSERT_TRUE(server.stderr_shows("SIGTERM received", std::chrono::seconds(10)))
      << server.stderr_text();
  const auto second = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(20)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - second, std::chrono::seconds(10));
  const Reply reply = waiting.get();
  EXPECT_EQ(reply.status, 503) << reply.raw;
  EXPECT_EQ(reply.body["error"]["message"], "server shutting down") << reply.raw;
  EXPECT_TRUE(server.stderr_text().find("second SIGTERM") != std::string::npos)
      << server.stderr_text();
}

}  // namespace
}  // namespace pipeline
