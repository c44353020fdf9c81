// `pipeline bench-serve`: the serving benchmark (after vLLM's benchmark_serving). Sends N
// streaming completions to a running OpenAI-compatible server, at most C in flight, all
// starting together or arriving as a Poisson process of --request-rate requests a second;
// each request must generate exactly --max-tokens tokens (ignore_eos), so
// every run does the same work. Reports aggregate output tokens/s, request throughput, time to
// first token (TTFT), inter-token latency (ITL: the gaps between a choice's chunks carrying
// output) and each request's own tokens/s. Failed requests are counted and left out of the
// figures, and make the command exit 1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <latch>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/options.h"
#include "model/seconds.h"
#include "server/sse_client.h"

namespace pipeline {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: pipeline bench-serve --url http://HOST:PORT [options]\n"
    "Sends streaming completions to a running server and reports its throughput and latency.\n"
    "  --requests N        requests in all (default 16)\n"
    "  --concurrency C     most requests in flight at once, a thread each (default N, all\n"
    "                      together, up to 1024; at most 1024)\n"
    "  --request-rate R    requests a second, sent at the times of a Poisson process (seeded,\n"
    "                      so every run sends at the same times), as vLLM's benchmark does;\n"
    "                      default: all at once\n"
    "  --max-tokens T      tokens every request generates; ignore_eos makes it exact (1024)\n"
    "  --n N               choices per request, each generating --max-tokens (default 1); a\n"
    "                      request's TTFT is its first choice's first token\n"
    "  --prompt TEXT       the prompt of every request (after the first, a server's prefix\n"
    "                      cache holds it), or\n"
    "  --prompt-tokens P   a prompt of P words 'a' or 'the', P tokens to a LLaMA tokenizer\n"
    "                      (default 32); the first 16 words spell the request's number, so no\n"
    "                      two requests share a cached prefix\n"
    "  --chat              POST /v1/chat/completions (default: /v1/completions)\n"
    "  --model NAME        the model to ask for (default: the first of GET /v1/models)\n"
    "  --temperature X     sampling temperature (default 0: greedy)\n"
    "  --api-key KEY       sent as 'Authorization: Bearer KEY'\n"
    "  --timeout S         longest wait, in seconds, for a connection or the next bytes (300)\n"
    "  --json              print one JSON object instead of a table";

// Requests in flight at once: a thread each (a default of all 40,000 requests failed to start
// its threads and aborted).
constexpr int kMaxConcurrency = 1024;

struct BenchSettings {
  std::string url;
  int requests = 16;
  int concurrency = 16;
  double request_rate = 0;  // requests a second; 0: all at once
  int max_tokens = 1024;
  int choices = 1;           // n
  std::string prompt;        // every request's, or
  int64_t prompt_words = 0;  // words of a prompt of its own per request (prompt_for)
  bool chat = false;
  std::string model;  // empty: ask the server
  double temperature = 0.0;
  SseClientOptions client;
  bool json_output = false;
};

// What one request measured; times in seconds from its send.
struct RequestResult {
  std::string error;  // empty: it succeeded
  double ttft = 0;
  double total = 0;
  std::vector<double> inter_token;  // gaps between a choice's consecutive output chunks
  int prompt_tokens = 0;
  int completion_tokens = 0;
  Clock::time_point sent, finished;
};

BenchSettings settings_from(Options& options) {
  BenchSettings s;
  s.url = options.required("--url");
  if (s.url.ends_with('/')) s.url.pop_back();  // the root; paths are appended with their slash
  s.requests = options.int_value("--requests", s.requests, 1);
  s.concurrency = std::min(
      options.int_value("--concurrency", std::min(s.requests, kMaxConcurrency), 1, kMaxConcurrency),
      s.requests);
  s.request_rate = options.number("--request-rate", 0.0);
  if (options.find("--request-rate") && s.request_rate <= 0)
    throw UsageError("--request-rate must be more than 0 requests a second");
  s.max_tokens = options.int_value("--max-tokens", s.max_tokens, 1);
  s.choices = options.int_value("--n", s.choices, 1);
  const auto prompt = options.find("--prompt");
  const auto prompt_tokens = options.find("--prompt-tokens");
  if (prompt && prompt_tokens) throw UsageError("give --prompt or --prompt-tokens, not both");
  if (prompt) {
    if (prompt->empty()) throw UsageError("--prompt must not be empty");
    s.prompt = *prompt;
  } else {
    s.prompt_words = options.int_value("--prompt-tokens", 32, 1);
  }
  s.chat = options.flag("--chat");
  s.model = options.get("--model", "");
  s.temperature = options.number("--temperature", 0.0);
  if (s.temperature < 0) throw UsageError("--temperature must be 0 or more");
  s.client.api_key = options.get("--api-key", "");
  const int timeout = options.int_value("--timeout", 300, 1);
  s.client.connect_timeout = std::chrono::seconds(timeout);
  s.client.read_timeout = std::chrono::seconds(timeout);
  s.json_output = options.flag("--json");
  return s;
}

const char* endpoint(const BenchSettings& s) {
  return s.chat ? "/v1/chat/completions" : "/v1/completions";
}

// The id of the first model GET /v1/models lists.
std::string served_model(const SseClient& client) {
  const json models = json::parse(client.get("/v1/models"), nullptr, /*allow_exceptions=*/false);
  if (!models.is_object() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id"))
    throw std::runtime_error("GET " + client.url() +
                             "/v1/models does not list a model with an id; name one with --model");
  return models["data"][0]["id"].get<std::string>();
}

// Request `number`'s prompt. "a" and "the" are one token each to a LLaMA sentencepiece
// vocabulary; the server adds BOS (and, for chat, its template), and the usage chunks report the
// exact count. The first 16 words spell the number in binary: prompts that share a first block
// would be served from the server's prefix cache, and the benchmark would measure the cache.
std::string prompt_for(const BenchSettings& s, int number) {
  if (s.prompt_words == 0) return s.prompt;
  std::string prompt;
  for (int64_t i = 0; i < s.prompt_words; ++i) {
    if (i > 0) prompt += ' ';
    prompt += i < 16 && (number >> i) & 1 ? "the" : "a";
  }
  return prompt;
}

json request_body(const BenchSettings& s, int number) {
  json body = {{"model", s.model},
               {"max_tokens", s.max_tokens},
               {"n", s.choices},
               {"temperature", s.temperature},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  const std::string prompt = prompt_for(s, number);
  if (s.chat)
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  else
    body["prompt"] = prompt;
  return body;
}

// The indices of a chunk's choices that add generated output: text, or the empty string a
// server sends for a token whose text it holds back (a character not finished yet, a possible
// stop string's start). Not the chat stream's opening {"role": "assistant"} chunk, nor a finish
// chunk.
std::vector<int> choices_with_output(const json& chunk) {
  std::vector<int> indices;
  if (!chunk.contains("choices") || !chunk["choices"].is_array()) return indices;
  for (const json& choice : chunk["choices"]) {
    if (choice.contains("finish_reason") && !choice["finish_reason"].is_null()) continue;
    const bool text = choice.contains("text") && choice["text"].is_string();
    const bool delta = choice.contains("delta") && choice["delta"].is_object() &&
                       !choice["delta"].contains("role") && choice["delta"].contains("content");
    if (text || delta) indices.push_back(choice.value("index", 0));
  }
  return indices;
}

// Reads one request's stream: every chunk's arrival, the usage chunk, the closing [DONE].
// Throws on anything a conforming stream would not send.
class StreamMeter {
 public:
  explicit StreamMeter(RequestResult& result) : result_(result) {}

  void on_event(std::string_view data) {
    const Clock::time_point now = Clock::now();
    if (done_) throw SseClientError("an event after data: [DONE]");
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    const json chunk = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (!chunk.is_object())
      throw SseClientError("an event's data is not a JSON object: " + std::string(data));
    if (chunk.contains("error"))
      throw SseClientError("the server ended the stream with an error: " + chunk["error"].dump());
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      result_.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
      result_.completion_tokens = chunk["usage"].value("completion_tokens", 0);
      has_usage_ = true;
    }
    // The gaps are each choice's own: with n > 1 the choices' tokens of one step arrive
    // microseconds apart, which are no latency between tokens.
    for (const int index : choices_with_output(chunk)) {
      const auto last = last_output_.find(index);
      if (last != last_output_.end())
        result_.inter_token.push_back(seconds_between(last->second, now));
      else if (index == 0)
        result_.ttft = seconds_between(result_.sent, now);
      last_output_[index] = now;
    }
  }

  // After the stream closed.
  void check_complete() const {
    if (!done_) throw SseClientError("the stream closed without data: [DONE]");
    if (!has_usage_)
      throw SseClientError("the stream has no usage chunk (stream_options.include_usage)");
    if (!last_output_.contains(0))
      throw SseClientError("the stream carried no generated output for choice 0");
  }

 private:
  RequestResult& result_;
  bool done_ = false;
  bool has_usage_ = false;
  std::map<int, Clock::time_point> last_output_;  // by choice index
};

RequestResult run_request(const SseClient& client, const BenchSettings& s,
                          const std::string& body) {
  RequestResult result;
  StreamMeter meter(result);
  result.sent = Clock::now();
  try {
    client.post_stream(endpoint(s), body, [&](std::string_view data) { meter.on_event(data); });
    meter.check_complete();
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  result.finished = Clock::now();
  result.total = seconds_between(result.sent, result.finished);
  return result;
}

// When each request is due, from the start: all at once, or the arrivals of a Poisson process
// of s.request_rate a second (exponential gaps, from a fixed seed as vLLM's benchmark draws
// them, so that runs compare).
std::vector<Clock::duration> send_times(const BenchSettings& s) {
  std::vector<Clock::duration> times(size_t(s.requests), Clock::duration::zero());
  if (s.request_rate <= 0) return times;
  std::mt19937_64 random(0);
  std::exponential_distribution<double> gap(s.request_rate);
  double at = 0;
  for (auto& time : times) {
    time = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at));
    at += gap(random);
  }
  return times;
}

// All requests, at most s.concurrency in flight: one thread each, released together, each
// request sent when it is due (send_times) and a thread is free. Where the system starts fewer
// threads, the concurrency is what it started (s.concurrency says so).
std::vector<RequestResult> run_all(const SseClient& client, BenchSettings& s) {
  std::vector<RequestResult> results(size_t(s.requests));
  const std::vector<Clock::duration> due = send_times(s);
  std::atomic<int> next{0};
  std::latch start(1);
  Clock::time_point started;
  std::vector<std::thread> workers;
  for (int w = 0; w < s.concurrency; ++w) {
    try {
      workers.emplace_back([&] {
        start.wait();
        for (int i; (i = next.fetch_add(1)) < s.requests;) {
          const std::string body = request_body(s, i).dump();  // ready before it is due
          std::this_thread::sleep_until(started + due[size_t(i)]);
          results[size_t(i)] = run_request(client, s, body);
        }
      });
    } catch (const std::system_error& e) {
      if (workers.empty())
        throw std::runtime_error(std::string("cannot start a thread: ") + e.what());
      std::fprintf(stderr,
                   "pipeline bench-serve: warning: %zu of %d request threads started (%s); the "
                   "concurrency is %zu\n",
                   workers.size(), s.concurrency, e.what(), workers.size());
      s.concurrency = int(workers.size());
      break;
    }
  }
  started = Clock::now();
  start.count_down();  // a release: the workers read `started` after it
  for (auto& worker : workers) worker.join();
  return results;
}

// Linear interpolation between the closest ranks (numpy's default); 0 for no values.
double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * double(values.size() - 1);
  const size_t below = size_t(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (rank - double(below)) * (values[above] - values[below]);
}

struct Summary {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double duration = 0;  // first send to last finish
  std::vector<double> ttft, inter_token, request_tokens_per_s;
};

// The figures of the requests that succeeded (at least one).
Summary summarize(const std::vector<RequestResult>& results) {
  Summary sum;
  Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
  for (const RequestResult& r : results) {
    if (!r.error.empty()) continue;
    first = std::min(first, r.sent);
    last = std::max(last, r.finished);
    sum.prompt_tokens += r.prompt_tokens;
    sum.completion_tokens += r.completion_tokens;
    sum.ttft.push_back(r.ttft);
    sum.inter_token.insert(sum.inter_token.end(), r.inter_token.begin(), r.inter_token.end());
    sum.request_tokens_per_s.push_back(r.completion_tokens / r.total);
  }
  sum.duration = seconds_between(first, last);
  return sum;
}

json report_json(const BenchSettings& s, const std::vector<RequestResult>& results,
                 const Summary& sum, size_t failed) {
  Clock::time_point first = results.front().sent;
  for (const RequestResult& r : results) first = std::min(first, r.sent);
  json per_request = json::array();
  for (const RequestResult& r : results) {
    json request = {{"sent_ms", std::chrono::duration<double, std::milli>(r.sent - first).count()}};
    if (r.error.empty())
      request.update({{"ttft_ms", r.ttft * 1e3},
                      {"total_ms", r.total * 1e3},
                      {"prompt_tokens", r.prompt_tokens},
                      {"completion_tokens", r.completion_tokens}});
    else
      request["error"] = r.error;
    per_request.push_back(std::move(request));
  }
  const size_t succeeded = results.size() - failed;
  return {{"url", s.url},
          {"endpoint", endpoint(s)},
          {"model", s.model},
          {"requests", results.size()},
          {"failed", failed},
          {"concurrency", s.concurrency},
          {"request_rate", s.request_rate > 0 ? json(s.request_rate) : json("inf")},
          {"max_tokens", s.max_tokens},
          {"n", s.choices},
          {"prompt_tokens", sum.prompt_tokens},
          {"completion_tokens", sum.completion_tokens},
          {"duration_s", sum.duration},
          {"output_tokens_per_s", double(sum.completion_tokens) / sum.duration},
          {"requests_per_s", double(succeeded) / sum.duration},
          {"ttft_ms",
           {{"median", percentile(sum.ttft, 50) * 1e3}, {"p99", percentile(sum.ttft, 99) * 1e3}}},
          {"itl_ms",
           {{"median", percentile(sum.inter_token, 50) * 1e3},
            {"p99", percentile(sum.inter_token, 99) * 1e3},
            {"max", percentile(sum.inter_token, 100) * 1e3}}},
          {"request_tokens_per_s", {{"median", percentile(sum.request_tokens_per_s, 50)}}},
          {"per_request", per_request}};
}

void print_table(const json& report) {
  const auto row = [](const char* name, const std::string& value) {
    std::printf("  %-28s %s\n", name, value.c_str());
  };
  const auto fixed = [](double x, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, x);
    return std::string(text);
  };
  std::printf("pipeline bench-serve: %s%s, model %s\n", report["url"].get<std::string>().c_str(),
              report["endpoint"].get<std::string>().c_str(),
              report["model"].get<std::string>().c_str());
  row("requests / concurrency", std::to_string(report["requests"].get<int>()) + " / " +
                                    std::to_string(report["concurrency"].get<int>()));
  if (report["failed"].get<size_t>() > 0)
    row("failed (not in the figures)", std::to_string(report["failed"].get<size_t>()));
  row("request rate", report["request_rate"].is_number()
                          ? fixed(report["request_rate"], 2) + " req/s (Poisson)"
                          : "all at once");
  row("max tokens per choice / n", std::to_string(report["max_tokens"].get<int>()) + " / " +
                                       std::to_string(report["n"].get<int>()));
  row("prompt tokens (all)", std::to_string(report["prompt_tokens"].get<int64_t>()));
  row("completion tokens (all)", std::to_string(report["completion_tokens"].get<int64_t>()));
  row("duration", fixed(report["duration_s"], 3) + " s");
  row("output throughput", fixed(report["output_tokens_per_s"], 1) + " tok/s");
  row("request throughput", fixed(report["requests_per_s"], 3) + " req/s");
  row("TTFT median / p99",
      fixed(report["ttft_ms"]["median"], 1) + " / " + fixed(report["ttft_ms"]["p99"], 1) + " ms");
  row("ITL median / p99 / max", fixed(report["itl_ms"]["median"], 2) + " / " +
                                    fixed(report["itl_ms"]["p99"], 2) + " / " +
                                    fixed(report["itl_ms"]["max"], 2) + " ms");
  row("per-request tok/s median", fixed(report["request_tokens_per_s"]["median"], 1));
}

// Every failure on stderr (once per distinct message) and how many requests failed; an
// exception when all did, as there are no figures to give.
size_t report_errors(const std::vector<RequestResult>& results) {
  std::vector<std::string> messages;
  size_t failed = 0;
  for (const RequestResult& r : results) {
    if (r.error.empty()) continue;
    ++failed;
    if (std::find(messages.begin(), messages.end(), r.error) == messages.end())
      messages.push_back(r.error);
  }
  for (const std::string& message : messages)
    std::fprintf(stderr, "pipeline bench-serve: %s\n", message.c_str());
  if (failed == results.size())
    throw std::runtime_error("all " + std::to_string(failed) + " requests failed");
  if (failed > 0)
    std::fprintf(stderr,
                 "pipeline bench-serve: %zu of %zu requests failed; the figures are the other "
                 "%zu's\n",
                 failed, results.size(), results.size() - failed);
  return failed;
}

// A request that generated other than --max-tokens tokens did other work than asked (a server
// that ignores ignore_eos, or a context too short): the figures still hold, but say so.
void warn_on_short_answers(const BenchSettings& s, const std::vector<RequestResult>& results) {
  size_t off = 0;
  for (const RequestResult& r : results)
    off += r.error.empty() && r.completion_tokens != s.max_tokens * s.choices;
  if (off > 0)
    std::fprintf(stderr,
                 "pipeline bench-serve: warning: %zu of %zu requests generated other than %d "
                 "tokens\n",
                 off, results.size(), s.max_tokens * s.choices);
}

}  // namespace

int bench_serve_command(int argc, char** argv) {
  Options options(argc, argv, kUsage, {"--chat", "--json"});
  if (options.help()) return 0;
  BenchSettings s = settings_from(options);
  options.finish();

  std::optional<SseClient> client;
  try {
    client.emplace(s.url, s.client);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--url: " + std::string(e.what()));
  }
  if (s.model.empty()) s.model = served_model(*client);

  const std::vector<RequestResult> results = run_all(*client, s);
  const size_t failed = report_errors(results);
  warn_on_short_answers(s, results);
  const json report = report_json(s, results, summarize(results), failed);
  if (s.json_output)
    std::printf("%s\n", report.dump().c_str());
  else
    print_table(report);
  return failed == 0 ? 0 : 1;
}

}  // namespace pipeline
