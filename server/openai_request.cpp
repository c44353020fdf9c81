#include "server/openai_request.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "io/json_integer.h"
#include "model/bad_words.h"
#include "server/foreign_fields.h"
#include "server/guide_fields.h"

namespace pipeline {

using nlohmann::json;

namespace {

std::string type_name(const JsonBody& value) {
  if (value.is_number_integer()) return "an integer";
  // A whole number past 64 bits is read as a double: say so, not that it has a fraction.
  if (value.is_number_float() && std::abs(value.get<double>()) >= 0x1p63 &&
      std::trunc(value.get<double>()) == value.get<double>())
    return "a number beyond 64-bit integers";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_array()) return "an array";
  if (value.is_null()) return "null";  // inside an array: a null field is not given at all
  return "an object";
}

// A message's content: a string, or OpenAI's list of parts when every part is text, joined by
// newlines as vLLM joins them (a prompt sent to either server is the same prompt).
std::string read_content(const JsonBody& message, const std::string& param) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) throw invalid(param, param + " is missing");
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw wrong_type(param, "a string or an array of text parts", *it);
  std::string content;
  for (size_t i = 0; i < it->size(); ++i) {
    const JsonBody& part = (*it)[i];
    const std::string part_param = param + "[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", JsonBody()) != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw invalid(part_param, part_param +
                                    " must be {\"type\": \"text\", \"text\": string}; "
                                    "only text content is supported");
    if (i > 0) content += '\n';
    content += part["text"].get<std::string>();
  }
  return content;
}

// A field's value that asks for nothing: an empty string, list or object.
bool is_empty_value(const JsonBody& value) {
  return value.is_string() ? value.get_ref<const std::string&>().empty()
                           : (value.is_object() || value.is_array()) && value.empty();
}

// An assistant message's tool_calls (or the older function_call): this server has no function
// calling, and a call dropped from the dialog would change what the model reads.
void refuse_calls(const JsonBody& message, const std::string& param) {
  for (const char* name : {"tool_calls", "function_call"}) {
    auto it = message.find(name);
    if (it == message.end() || it->is_null() || (it->is_array() && it->empty())) continue;
    throw invalid(param + "." + name,
                  param + "." + name + " is not supported (no function calling)");
  }
}

// An assistant message that is OpenAI's refusal (content null, refusal its text): the dialog
// holds that text as the assistant's turn.
std::optional<std::string> read_refusal(const JsonBody& message, const std::string& param) {
  auto refusal = message.find("refusal");
  if (refusal == message.end() || refusal->is_null()) return std::nullopt;
  if (!refusal->is_string()) throw wrong_type(param + ".refusal", "a string", *refusal);
  auto content = message.find("content");
  if (content != message.end() && !content->is_null()) return std::nullopt;
  return refusal->get<std::string>();
}

}  // namespace

// ---- The field readers the header shares with the token endpoints.

ApiError invalid(std::string param, std::string message) {
  RequestError error;
  error.http_status = 400;
  error.message = std::move(message);
  error.param = std::move(param);
  return ApiError(std::move(error));
}

// The field, or nullptr when it is absent or null (clients send null for "not given").
const JsonBody* find_field(const JsonBody& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError wrong_type(const std::string& param, const char* expected, const JsonBody& value) {
  return invalid(param, "Invalid type for '" + param + "': expected " + expected + ", but got " +
                            type_name(value) + " instead.");
}

bool read_bool(const JsonBody& body, const char* name, bool fallback) {
  const JsonBody* value = find_field(body, name);
  if (!value) return fallback;
  if (!value->is_boolean()) throw wrong_type(name, "a boolean", *value);
  return value->get<bool>();
}

bool read_add_special_tokens(const JsonBody& body, bool chat) {
  const bool add = read_bool(body, "add_special_tokens", !chat);
  if (add && chat)
    throw invalid("add_special_tokens",
                  "add_special_tokens must be false with messages: the chat template places BOS "
                  "itself");
  return add;
}

void check_model(const JsonBody& body, const ServedModel& model) {
  const JsonBody* value = find_field(body, "model");
  if (!value) return;  // as in vLLM: the model served
  if (!value->is_string()) throw wrong_type("model", "a string", *value);
  const auto& name = value->get_ref<const std::string&>();
  if (name == model.name) return;
  RequestError error;
  error.http_status = 404;
  error.message =
      "The model '" + name + "' does not exist; this server serves '" + model.name + "'.";
  error.param = "model";
  error.code = "model_not_found";
  throw ApiError(std::move(error));
}

std::vector<ChatMessage> read_messages(const JsonBody& body) {
  const JsonBody* value = find_field(body, "messages");
  if (!value) throw invalid("messages", "you must provide a messages parameter");
  if (!value->is_array()) throw wrong_type("messages", "an array", *value);
  if (value->empty()) throw invalid("messages", "messages must hold at least one message");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < value->size(); ++i) {
    const JsonBody& item = (*value)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!item.is_object()) throw wrong_type(param, "an object", item);
    auto role = item.find("role");
    if (role == item.end() || !role->is_string())
      throw invalid(param + ".role", param + ".role must be a string");
    const auto& role_name = role->get_ref<const std::string&>();
    if (!is_chat_role(role_name))
      throw invalid(param + ".role", "unsupported role '" + role_name + "' in " + param +
                                         " (system, developer, user and assistant are supported)");
    if (role_name == "assistant") {
      refuse_calls(item, param);
      if (auto refusal = read_refusal(item, param)) {
        messages.push_back({role_name, std::move(*refusal)});
        continue;
      }
    }
    messages.push_back({role_name, read_content(item, param + ".content")});
  }
  return messages;
}

void refuse_other_chat_templates(const JsonBody& body) {
  // vLLM's per-request Jinja template: the server applies the one its config names.
  if (const JsonBody* value = find_field(body, "chat_template"); value && !is_empty_value(*value))
    throw invalid("chat_template",
                  "chat_template is not supported (the server applies its configured chat "
                  "template)");
  // Its variables: neither template reads any, so an object changes nothing (as in vLLM).
  if (const JsonBody* value = find_field(body, "chat_template_kwargs");
      value && !value->is_object())
    throw wrong_type("chat_template_kwargs", "an object", *value);
}

// add_generation_prompt asks for the template's opening of the assistant's turn after the last
// message. Neither of our templates has one: a LLaMA-2 prompt ends with "[/INST]", where the
// answer begins, either way (and the raw template adds nothing), so false changes nothing. It
// is read so that a value that is not a boolean is refused, and so that it is not given with
// continue_final_message, which ends the prompt inside the assistant's turn instead.
PromptEnd read_prompt_end(const JsonBody& body) {
  const bool generation_prompt = read_bool(body, "add_generation_prompt", true);
  if (!read_bool(body, "continue_final_message", false)) return PromptEnd::NewAnswer;
  if (generation_prompt)
    throw invalid("continue_final_message",
                  "continue_final_message and add_generation_prompt cannot both be true: set "
                  "add_generation_prompt to false to continue the final message");
  return PromptEnd::ContinueFinalMessage;
}

std::vector<int32_t> read_token_ids(const JsonBody& ids, const Tokenizer& tokenizer,
                                    const std::string& param, const char* expected) {
  std::vector<int32_t> tokens;
  for (const JsonBody& id : ids) {
    const std::optional<int64_t> token = id.is_number_integer() ? json_int64(id) : std::nullopt;
    if (!token) throw wrong_type(param, expected, id);
    if (*token < 0 || *token >= tokenizer.vocab_size())
      throw invalid(param, "token id " + std::to_string(*token) + " is outside the vocabulary of " +
                               std::to_string(tokenizer.vocab_size()) + " tokens");
    tokens.push_back(int32_t(*token));
  }
  return tokens;
}

namespace {

// A JSON number as float; beyond float's range it becomes an infinity (a plain conversion would
// be undefined), which the range checks then refuse.
float to_float(double value) {
  if (value > std::numeric_limits<float>::max()) return std::numeric_limits<float>::infinity();
  if (value < -std::numeric_limits<float>::max()) return -std::numeric_limits<float>::infinity();
  return float(value);
}

float read_float(const JsonBody& body, const char* name, float fallback) {
  const JsonBody* value = find_field(body, name);
  if (!value) return fallback;
  if (!value->is_number()) throw wrong_type(name, "a number", *value);
  return to_float(value->get<double>());
}

// An integer field within [min, max]; `fallback` when it is not given.
int read_int(const JsonBody& body, const char* name, int fallback, int min, int max) {
  const JsonBody* value = find_field(body, name);
  if (!value) return fallback;
  if (!value->is_number_integer()) throw wrong_type(name, "an integer", *value);
  const std::optional<int64_t> number = json_int64(*value);
  if (!number || *number < min || *number > max)
    throw invalid(name, "'" + std::string(name) + "' must be between " + std::to_string(min) +
                            " and " + std::to_string(max) + ", got " + value->dump() + ".");
  return static_cast<int>(*number);
}

std::optional<uint64_t> read_seed(const JsonBody& body, std::optional<uint64_t> fallback) {
  const JsonBody* value = find_field(body, "seed");
  if (!value) return fallback;
  if (!value->is_number_integer()) throw wrong_type("seed", "an integer", *value);
  // A negative seed is as good a seed as any: keep its bits.
  return value->is_number_unsigned() ? value->get<uint64_t>()
                                     : static_cast<uint64_t>(value->get<int64_t>());
}

// OpenAI fields this server does not implement: refused where they would change the answer (a
// client must not get an answer it did not ask for), accepted at their neutral value.
void refuse_unsupported(Endpoint endpoint, const JsonBody& body) {
  auto refuse_unless = [&](const char* name, auto&& neutral, const std::string& why) {
    const JsonBody* value = find_field(body, name);
    if (value && !neutral(*value))
      throw invalid(name, std::string(name) + " is not supported" + why);
  };
  auto no_call = [](const JsonBody& v) { return v == "none" || v == "auto"; };
  auto text_only = [](const JsonBody& v) {
    return v.is_array() &&
           std::all_of(v.begin(), v.end(), [](const JsonBody& m) { return m == "text"; });
  };
  refuse_unless("suffix", is_empty_value, "");
  refuse_unless("tools", is_empty_value, " (no function calling)");
  refuse_unless("functions", is_empty_value, " (no function calling)");
  refuse_unless("tool_choice", no_call, " (no function calling)");
  refuse_unless("function_call", no_call, " (no function calling)");
  // OpenAI's audio output: this server answers in text alone.
  refuse_unless("modalities", text_only, " beyond [\"text\"] (no audio output)");
  refuse_unless("audio", is_empty_value, " (no audio output)");
  refuse_other_chat_templates(body);
  if (endpoint == Endpoint::Completions && find_field(body, "top_logprobs"))
    throw invalid("top_logprobs",
                  "top_logprobs is a chat parameter; /v1/completions takes the number of "
                  "alternatives in logprobs");
}

// best_of: sampling more sequences than are returned, to return the likeliest, is not
// implemented; best_of equal to n (every sequence returned) is what n does alone.
void check_best_of(const JsonBody& body, int choices) {
  const int best_of = read_int(body, "best_of", choices, 1, INT_MAX);
  if (best_of < choices)
    throw invalid("best_of", "best_of must be at least n (" + std::to_string(choices) + "), got " +
                                 std::to_string(best_of));
  if (best_of > choices) throw invalid("best_of", "best_of > n is not supported");
}

std::string random_id(std::string_view prefix) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

constexpr const char* kPromptForms =
    "a string, a list of strings, a list of token ids or a list of lists of token ids";

// A prompt of token ids: each within the tokenizer's vocabulary; its text is theirs, decoded.
void read_prompt_ids(const JsonBody& ids, const ServedModel& model, ParsedRequest& parsed) {
  if (!model.tokenizer) throw invalid("prompt", "prompts of token ids are not taken here");
  if (ids.empty()) throw invalid("prompt", "a prompt of token ids is empty");
  std::vector<int32_t> tokens = read_token_ids(ids, *model.tokenizer, "prompt", kPromptForms);
  parsed.prompts.push_back(model.tokenizer->decode(tokens));
  parsed.prompt_ids.push_back(std::move(tokens));
}

// OpenAI's four forms of a completions prompt.
void read_prompts(const JsonBody& body, const ServedModel& model, ParsedRequest& parsed) {
  const JsonBody* value = find_field(body, "prompt");
  if (!value) throw invalid("prompt", "you must provide a prompt parameter");
  if (value->is_string()) {
    parsed.prompts = {value->get<std::string>()};
    parsed.prompt_ids = {{}};
    return;
  }
  if (!value->is_array()) throw wrong_type("prompt", kPromptForms, *value);
  if (value->empty()) throw invalid("prompt", "the list of prompts is empty");
  if ((*value)[0].is_number()) return read_prompt_ids(*value, model, parsed);
  for (const JsonBody& item : *value) {
    try {
      if (item.is_string()) {
        parsed.prompts.push_back(item.get<std::string>());
        parsed.prompt_ids.emplace_back();
      } else if (item.is_array()) {
        read_prompt_ids(item, model, parsed);
      } else {
        throw wrong_type("prompt", kPromptForms, item);
      }
    } catch (const ApiError& e) {
      // Named as the tokenize stage names a refused prompt of a list: prompt[p].
      RequestError error = e.error();
      error.message = "prompt[" + std::to_string(parsed.prompts.size()) + "]: " + error.message;
      throw ApiError(error);
    }
  }
}

std::vector<std::string> read_stop(const JsonBody& body) {
  const JsonBody* value = find_field(body, "stop");
  if (!value) return {};
  std::vector<std::string> stop;
  if (value->is_string()) {
    stop.push_back(value->get<std::string>());
  } else if (value->is_array()) {
    if (value->size() > 4) throw invalid("stop", "stop holds at most 4 sequences");
    for (const JsonBody& item : *value) {
      if (!item.is_string()) throw wrong_type("stop", "a string or an array of strings", item);
      stop.push_back(item.get<std::string>());
    }
  } else {
    throw wrong_type("stop", "a string or an array of strings", *value);
  }
  for (const auto& s : stop)
    if (s.empty()) throw invalid("stop", "stop sequences must not be empty");
  return stop;
}

// An array of token ids at `name`, of at most `limit` (the tokenize stage checks them against
// the model's vocabulary).
std::vector<int32_t> read_token_ids(const JsonBody& body, const char* name, size_t limit) {
  const JsonBody* value = find_field(body, name);
  if (!value) return {};
  if (!value->is_array()) throw wrong_type(name, "an array of token ids", *value);
  if (value->size() > limit)
    throw invalid(name, std::string(name) + " holds at most " + std::to_string(limit) + " ids");
  std::vector<int32_t> ids;
  for (const JsonBody& id : *value) {
    const std::optional<int64_t> token = id.is_number_integer() ? json_int64(id) : std::nullopt;
    if (!token) throw wrong_type(name, "an array of token ids", id);
    if (*token < 0 || *token > INT32_MAX)
      throw invalid(name, "token id " + std::to_string(*token) + " is not a token id");
    ids.push_back(int32_t(*token));
  }
  return ids;
}

// vLLM's stop_token_ids.
std::vector<int32_t> read_stop_token_ids(const JsonBody& body) {
  return read_token_ids(body, "stop_token_ids", 64);
}

// vLLM's allowed_token_ids: only these may be drawn. Given, it may not be empty, as in vLLM.
std::vector<int32_t> read_allowed_token_ids(const JsonBody& body) {
  std::vector<int32_t> ids = read_token_ids(body, "allowed_token_ids", size_t(1) << 20);
  if (find_field(body, "allowed_token_ids") && ids.empty())
    throw invalid("allowed_token_ids", "allowed_token_ids may not be empty");
  return ids;
}

// vLLM's bad_words: an array of words (the tokenize stage finds their token sequences), each
// with some text after the leading whitespace vLLM strips: a word without has no tokens to ban.
// At most kMaxBadWords of kMaxBadWordBytes together, so that n choices finding theirs cost
// little. An empty array is not given.
std::vector<std::string> read_bad_words(const JsonBody& body) {
  const JsonBody* value = find_field(body, "bad_words");
  if (!value) return {};
  if (!value->is_array()) throw wrong_type("bad_words", "an array of strings", *value);
  if (value->size() > kMaxBadWords)
    throw invalid("bad_words",
                  "bad_words holds at most " + std::to_string(kMaxBadWords) + " words");
  std::vector<std::string> words;
  size_t bytes = 0;
  for (const JsonBody& word : *value) {
    if (!word.is_string()) throw wrong_type("bad_words", "an array of strings", word);
    const std::string& text = word.get_ref<const std::string&>();
    if (strip_leading_whitespace(text).empty())
      throw invalid("bad_words",
                    "bad_words may not hold an empty word, or one of whitespace alone");
    bytes += text.size();
    words.push_back(text);
  }
  if (bytes > kMaxBadWordBytes)
    throw invalid("bad_words", "bad_words holds " + std::to_string(bytes) + " bytes, more than " +
                                   std::to_string(kMaxBadWordBytes));
  return words;
}

// What a parameter that would keep an answer guided by `guide` (one of guides_asked()'s params)
// from ending gets.
ApiError not_with_guide(const JsonBody& body, const std::string& param, const std::string& guide) {
  std::string named = guide;  // response_format with its type: "response_format json_object"
  if (guide == "response_format")
    if (const JsonBody* type = find_field(*find_field(body, "response_format"), "type");
        type && type->is_string())
      named += " " + type->get<std::string>();
  return invalid(param, param + " cannot be combined with " + named +
                            " (guided decoding): the answer ends when the text it is held to "
                            "is whole");
}

// vLLM's min_tokens: at most max_tokens.
int read_min_tokens(const JsonBody& body, const Request& request) {
  const int min_tokens = read_int(body, "min_tokens", 0, 0, INT_MAX);
  if (min_tokens > request.max_tokens)
    throw invalid("min_tokens",
                  "min_tokens (" + std::to_string(min_tokens) + ") must be at most " +
                      (request.max_tokens_param.empty() ? std::string("the default max_tokens")
                                                        : request.max_tokens_param) +
                      " (" + std::to_string(request.max_tokens) + ")");
  return min_tokens;
}

ResponseOptions read_response_options(const JsonBody& body) {
  ResponseOptions options;
  options.stream = read_bool(body, "stream", false);
  if (const JsonBody* stream_options = find_field(body, "stream_options")) {
    if (!stream_options->is_object())
      throw wrong_type("stream_options", "an object", *stream_options);
    if (!options.stream)
      throw invalid("stream_options", "stream_options is only allowed when stream is true");
    options.include_usage = read_bool(*stream_options, "include_usage", false);
    options.continuous_usage =
        read_bool(*stream_options, "continuous_usage_stats", false) && options.include_usage;
  }
  return options;
}

// Chat: logprobs is a boolean and top_logprobs the number of alternatives (0..20).
// Completions: logprobs is itself the number of alternatives (0..20, vLLM's default limit; OpenAI
// stops at 5).
void read_logprobs(Endpoint endpoint, const JsonBody& body, Request& request) {
  if (endpoint == Endpoint::ChatCompletions) {
    request.sampling.logprobs = read_bool(body, "logprobs", false);
    const JsonBody* top = find_field(body, "top_logprobs");
    if (top && !request.sampling.logprobs)
      throw invalid("top_logprobs", "top_logprobs requires logprobs to be true");
    request.sampling.top_logprobs = read_int(body, "top_logprobs", 0, 0, 20);
  } else {
    const JsonBody* value = find_field(body, "logprobs");
    request.sampling.logprobs = value != nullptr;
    request.sampling.top_logprobs = read_int(body, "logprobs", 0, 0, 20);
  }
}

// Range checks live with the sampler (validate()); its messages begin with the field's name,
// which is the API parameter's name except for completions' logprobs.
void check_sampling_ranges(Endpoint endpoint, const SamplingParams& params) {
  const std::string problem = validate(params);
  if (problem.empty()) return;
  std::string param = problem.substr(0, problem.find(' '));
  if (param == "top_logprobs" && endpoint == Endpoint::Completions) param = "logprobs";
  throw invalid(param, problem);
}

// {"token id": bias, ...}: JSON keys are strings, so the ids come as decimal text; two keys for
// one id ("5", "05") are refused rather than one of them winning. The biases' range
// is the sampler's (validate()); the vocabulary's is tokenize's. An empty array is not given.
std::vector<LogitBias> read_logit_bias(const JsonBody& body) {
  const JsonBody* value = find_field(body, "logit_bias");
  if (!value || (value->is_array() && value->empty())) return {};
  if (!value->is_object())
    throw wrong_type("logit_bias", "an object mapping token ids to biases", *value);
  std::map<int32_t, float> by_token;
  for (const auto& [key, bias] : value->items()) {
    int32_t token = -1;
    const char* end = key.data() + key.size();
    const auto parsed = std::from_chars(key.data(), end, token);
    if (key.empty() || key[0] == '-' || parsed.ec != std::errc() || parsed.ptr != end)
      throw invalid("logit_bias", "Invalid key in 'logit_bias': \"" + key +
                                      "\". Keys must be token ids: non-negative integers.");
    if (!bias.is_number()) throw wrong_type("logit_bias", "numbers as biases", bias);
    if (!by_token.emplace(token, to_float(bias.get<double>())).second)
      throw invalid("logit_bias",
                    "'logit_bias' names token " + std::to_string(token) + " more than once.");
  }
  std::vector<LogitBias> biases;
  for (const auto& [token, bias] : by_token) biases.push_back({token, bias});
  return biases;
}

SamplingParams read_sampling(const JsonBody& body, const SamplingParams& defaults) {
  SamplingParams params = defaults;
  params.temperature = read_float(body, "temperature", defaults.temperature);
  params.top_p = read_float(body, "top_p", defaults.top_p);
  params.top_k = read_int(body, "top_k", defaults.top_k, -1, INT_MAX);
  params.min_p = read_float(body, "min_p", defaults.min_p);
  params.repetition_penalty = read_float(body, "repetition_penalty", defaults.repetition_penalty);
  params.repeat_last_n = read_int(body, "repeat_last_n", defaults.repeat_last_n, -1, INT_MAX);
  params.presence_penalty = read_float(body, "presence_penalty", defaults.presence_penalty);
  params.frequency_penalty = read_float(body, "frequency_penalty", defaults.frequency_penalty);
  params.seed = read_seed(body, defaults.seed);
  params.logit_bias = read_logit_bias(body);
  params.allowed_tokens = read_allowed_token_ids(body);
  return params;
}

// max_tokens, or `fallback` (the server's default) when the client names none; 0 only with echo.
void read_max_tokens(Endpoint endpoint, const JsonBody& body, int fallback, bool echo,
                     Request& request) {
  // Chat's newer name wins over the deprecated one when both are given.
  const bool chat_name =
      endpoint == Endpoint::ChatCompletions && find_field(body, "max_completion_tokens");
  const char* name = chat_name ? "max_completion_tokens" : "max_tokens";
  const JsonBody* given = find_field(body, name);
  if (endpoint == Endpoint::Completions && !echo && given && json_int64(*given) == 0)
    throw invalid(name,
                  "'max_tokens' must be at least 1 without echo (with echo, 0 scores the "
                  "prompt alone), got 0.");
  request.max_tokens = read_int(body, name, fallback, echo ? 0 : 1, INT_MAX);
  if (given) request.max_tokens_param = name;
}

// vLLM's priority (lower first), which, as in vLLM, only a server scheduling by priority takes.
int read_priority(const JsonBody& body, const ServedModel& model) {
  const int priority = read_int(body, "priority", 0, INT_MIN, INT_MAX);
  if (priority != 0 && !model.priority_policy)
    throw invalid("priority",
                  "priority scheduling is not enabled: the server schedules in arrival order "
                  "(scheduler.policy fcfs), so priority must be 0");
  return priority;
}

// Completions' echo (chat has none: a 400 rather than an answer without it).
bool read_echo(Endpoint endpoint, const JsonBody& body) {
  const bool echo = read_bool(body, "echo", false);
  if (echo && endpoint == Endpoint::ChatCompletions)
    throw invalid("echo",
                  "echo is not supported on chat completions (continue_final_message continues "
                  "the last assistant message instead)");
  return echo;
}

// vLLM's truncate_prompt_tokens (the tokenize stage checks it against the context). Not with
// echo, which would show a prompt the model did not see.
int read_truncate_prompt_tokens(const JsonBody& body, bool echo) {
  const int keep = read_int(body, "truncate_prompt_tokens", 0, 1, INT_MAX);
  if (keep > 0 && echo)
    throw invalid("truncate_prompt_tokens",
                  "truncate_prompt_tokens cannot be combined with echo: the prompt echoed would "
                  "not be the one the model saw");
  return keep;
}

// The answer starts with the prompt, and with logprobs, the prompt's tokens are scored too.
// With max_tokens 0 the prompt is the whole answer; one token is still generated (the engine
// always samples after a prompt) and dropped, as vLLM does.
void apply_echo(ParsedRequest& parsed) {
  Request& request = *parsed.request;
  parsed.options.echo = true;
  request.prompt_logprobs = request.sampling.logprobs;
  if (request.max_tokens == 0) {
    request.prompt_only = true;
    request.max_tokens = 1;
  }
}
}  // namespace

ApiError::ApiError(RequestError error)
    : std::runtime_error(error.message), error_(std::move(error)) {}

JsonBody parse_json_body(std::string_view body) {
  JsonBody value;
  try {
    value = read_json_body(body);
  } catch (const nlohmann::json::other_error&) {
    throw invalid("", "The JSON body of your request nests arrays and objects deeper than " +
                          std::to_string(kMaxJsonDepth) + " levels.");
  } catch (const nlohmann::json::exception&) {  // not JSON, or a number beyond a double
    throw invalid("",
                  "We could not parse the JSON body of your request. The body must be a "
                  "JSON object.");
  }
  if (!value.is_object()) throw invalid("", "The request body must be a JSON object.");
  return value;
}

ServedModel served_model(std::string name, const ServeConfig& config, const Tokenizer& tokenizer) {
  // A call's choices wait in the queue together: more than it holds could never be accepted.
  return {std::move(name), config.sampling, std::min(128, config.server.max_queue), &tokenizer,
          config.scheduler.priority_policy};
}

// Every choice is a request of its own: the queue must hold them all, and each has its own copy
// of its prompt to tokenize.
void check_choices(const ParsedRequest& parsed, const ServedModel& model) {
  if (parsed.choices() > model.max_choices)
    throw invalid("n", "n (" + std::to_string(parsed.per_prompt) + ") times the " +
                           std::to_string(parsed.prompts.size()) + " prompts makes more than " +
                           std::to_string(model.max_choices) + " choices");
  size_t bytes = 0;
  for (const std::string& prompt : parsed.prompts) bytes += prompt.size();
  for (const ChatMessage& message : parsed.request->messages) bytes += message.content.size();
  if (parsed.choices() > 1 && bytes * size_t(parsed.per_prompt) > kMaxRequestBytes)
    throw invalid("n", "n (" + std::to_string(parsed.per_prompt) + ") times the prompts' " +
                           std::to_string(bytes) + " bytes exceeds the " +
                           std::to_string(kMaxRequestBytes >> 20) + " MiB a request may hold");
}

ParsedRequest parse_openai_request(Endpoint endpoint, const JsonBody& body,
                                   const ServedModel& model) {
  if (!body.is_object()) throw invalid("", "The request body must be a JSON object.");
  check_model(body, model);
  ParsedRequest parsed;
  parsed.request = std::make_shared<Request>();
  Request& request = *parsed.request;
  request.chat = endpoint == Endpoint::ChatCompletions;
  request.id = random_id(request.chat ? "chatcmpl-" : "cmpl-");
  parsed.per_prompt = read_int(body, "n", 1, 1, model.max_choices);
  if (request.chat) {
    request.messages = read_messages(body);
    request.prompt_end = read_prompt_end(body);
  } else {
    read_prompts(body, model, parsed);
    request.prompt = parsed.prompts.front();
    request.prompt_ids = parsed.prompt_ids.front();
    check_best_of(body, parsed.per_prompt);
  }
  check_choices(parsed, model);
  refuse_unsupported(endpoint, body);
  parsed.options = read_response_options(body);
  const bool echo = read_echo(endpoint, body);
  request.truncate_prompt_tokens = read_truncate_prompt_tokens(body, echo);
  read_max_tokens(endpoint, body, model.defaults.max_tokens, echo, request);
  request.priority = read_priority(body, model);
  request.add_bos = read_add_special_tokens(body, request.chat);
  request.sampling = read_sampling(body, model.defaults.params);
  refuse_foreign_fields(body, request.sampling);
  read_logprobs(endpoint, body, request);
  check_sampling_ranges(endpoint, request.sampling);
  if (echo) apply_echo(parsed);
  request.stop = read_stop(body);
  request.ignore_eos = read_bool(body, "ignore_eos", false);
  request.bad_words = read_bad_words(body);
  const std::vector<std::string> guides = guides_asked(body);
  if (!guides.empty() && request.ignore_eos) throw not_with_guide(body, "ignore_eos", guides[0]);
  request.stop_token_ids = read_stop_token_ids(body);
  request.include_stop_str_in_output = read_bool(body, "include_stop_str_in_output", false);
  request.sampling.min_tokens = read_min_tokens(body, request);
  if (request.sampling.min_tokens > 0 && !guides.empty())
    throw not_with_guide(body, "min_tokens", guides[0]);
  if (!guides.empty()) read_guide(body, guides[0], request);  // the costly part, last
  return parsed;
}

std::vector<std::shared_ptr<Request>> choice_requests(const ParsedRequest& parsed) {
  if (parsed.choices() == 1) return {parsed.request};
  std::vector<std::shared_ptr<Request>> requests;
  for (int i = 0; i < parsed.choices(); ++i) {
    auto choice = std::make_shared<Request>(*parsed.request);
    choice->id.append("-").append(std::to_string(i));
    if (!parsed.prompts.empty()) {
      const int prompt = i / parsed.per_prompt;
      choice->prompt = parsed.prompts[size_t(prompt)];
      choice->prompt_ids = parsed.prompt_ids[size_t(prompt)];
      if (parsed.prompts.size() > 1) choice->prompt_index = prompt;
    }
    if (choice->sampling.seed) *choice->sampling.seed += uint64_t(i % parsed.per_prompt);
    requests.push_back(std::move(choice));
  }
  return requests;
}

}  // namespace pipeline
