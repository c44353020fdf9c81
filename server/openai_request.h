// OpenAI's requests, without any networking: the bodies of POST /v1/chat/completions and
// POST /v1/completions to a validated Request (server/openai_response.h shapes the answers).
//
// Choices made here (OpenAI's behaviour unless said otherwise):
// - `model` is required and must be the served model's name; any other name is a 404
//   model_not_found. There is no "default" alias, so a client never silently talks to a model
//   it did not name.
// - n choices are n sequences of the same prompt, sampled independently; a completions prompt
//   may be a list of strings, each with its n choices (prompt p's choice j is choice p * n + j,
//   as OpenAI numbers them, and a seeded request's draws with seed + j), and a prompt may be
//   given as token ids (used as they are: no BOS is added); best_of, if given, must equal n:
//   anything else is a 400 that names the parameter.
// - echo (completions) puts the prompt before the answer; with logprobs, the prompt's tokens come
//   first in them, the first with a null logprob (nothing predicts it), their text_offsets
//   counted in the prompt (the space SentencePiece marks a first word with is not in the
//   prompt, so it counts for nothing). max_tokens 0 is allowed with echo: the prompt alone, with
//   finish_reason "length" and no completion tokens, as vLLM answers it.
// - null stands for "not given"; unknown fields (user, metadata, ...) are ignored.
// - response_format json_object or json_schema (or llama.cpp's json_object with a schema, or
//   vLLM's guided_json) holds the answer to a JSON value (GuidedDecoding); a schema the compiler
//   cannot hold an answer to (io/json_schema.h) is a 400 naming the place in the schema, not a
//   schema ignored. vLLM's guided_regex and guided_choice hold it to a TextPattern; a pattern it
//   cannot hold (io/regex_syntax.h) is a 400 naming the position. guided_grammar (and
//   llama.cpp's grammar) holds it to a GBNF Grammar. vLLM's structured_outputs (json,
//   json_object, regex, choice, grammar) asks for the same. One guide per request.
// - Parameters beyond OpenAI's (top_k, min_p, repetition_penalty, ignore_eos, ...) follow
//   vLLM's; repeat_last_n, llama.cpp's, limits repetition_penalty to the last tokens.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "graph/request.h"
#include "graph/serve_config.h"
#include "io/tokenizer.h"
#include "server/json_body.h"

namespace pipeline {

// A request the API refuses; carries the status and the OpenAI error body's fields.
class ApiError : public std::runtime_error {
 public:
  explicit ApiError(RequestError error);
  const RequestError& error() const { return error_; }

 private:
  RequestError error_;
};

enum class Endpoint { ChatCompletions, Completions };

// What the server must know about the model it serves to validate a request.
struct ServedModel {
  std::string name;
  SamplingDefaults defaults;  // for parameters a request leaves out
  int max_choices = 128;      // n at most (OpenAI's limit, or fewer: what the queue can hold)
  // Reads prompts given as token ids (their range, their text); without it they are refused.
  const Tokenizer* tokenizer = nullptr;
  // scheduler.policy is priority: a request's priority is read; otherwise only 0 is taken.
  bool priority_policy = false;
};

// The model as a server with `config` serves it under `name`, with its tokenizer.
ServedModel served_model(std::string name, const ServeConfig& config, const Tokenizer& tokenizer);

// How the answer is delivered; the rest of the request is in Request.
struct ResponseOptions {
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  // vLLM's stream_options.continuous_usage_stats, which, as in vLLM, takes include_usage too:
  // every chunk with its choice's usage so far (alone it changes nothing).
  bool continuous_usage = false;
  bool echo = false;  // completions: the prompt before the answer
};

struct ParsedRequest {
  // id, messages or the first prompt, sampling, limits; no sink yet.
  std::shared_ptr<Request> request;
  ResponseOptions options;
  std::vector<std::string> prompts;  // completions: every prompt of the list (one at least)
  // Per prompt, its token ids when it was given as ids (its text above is theirs, decoded).
  std::vector<std::vector<int32_t>> prompt_ids;
  int per_prompt = 1;  // n: choices of each prompt

  int choices() const { return int(std::max<size_t>(prompts.size(), 1)) * per_prompt; }
};

// The engine requests of a parsed call, one per choice (no sinks yet): the request itself for a
// single choice; else copies named <id>-<i> in the logs, choice i with its prompt (and its index
// in a list of several) and, if the request is seeded, its prompt's choice j with seed + j.
std::vector<std::shared_ptr<Request>> choice_requests(const ParsedRequest& parsed);

// The largest request body the server reads. A call's n choices together hold at most this much
// prompt text, so that n does not multiply what one request may cost.
inline constexpr size_t kMaxRequestBytes = size_t(16) << 20;

// The body as JSON; throws ApiError 400 when it is not a JSON object.
JsonBody parse_json_body(std::string_view body);

// Validates one request body. Throws ApiError (400 naming the parameter, 404 for an unknown
// model) on anything it cannot serve exactly as asked.
ParsedRequest parse_openai_request(Endpoint endpoint, const JsonBody& body,
                                   const ServedModel& model);

// ---- Field readers, shared with the token endpoints (server/token_endpoints.h) so that their
// errors read exactly as the completion endpoints' do. A field that is null is not given.

// A 400 invalid_request_error naming `param` (empty: the body as a whole).
ApiError invalid(std::string param, std::string message);
// A 400 "Invalid type for 'param': expected <expected>, but got <value's type> instead."
ApiError wrong_type(const std::string& param, const char* expected, const JsonBody& value);
// The field, or nullptr when it is absent or null.
const JsonBody* find_field(const JsonBody& body, const char* name);
// A boolean field; `fallback` when it is not given.
bool read_bool(const JsonBody& body, const char* name, bool fallback);
// vLLM's add_special_tokens: whether a text prompt gets BOS first (default true). With messages
// (`chat`) it must be false, its default there: the chat template places BOS itself.
bool read_add_special_tokens(const JsonBody& body, bool chat);
// `model`, when given, must name the served model: 404 model_not_found for any other name.
void check_model(const JsonBody& body, const ServedModel& model);
// `messages`: at least one, each a system (or developer), user or assistant message with text
// content (an assistant's refusal, its content null, as its text), and no tool calls.
std::vector<ChatMessage> read_messages(const JsonBody& body);
// vLLM's chat_template (refused unless empty: the server applies its configured one) and
// chat_template_kwargs (an object, which no template reads).
void refuse_other_chat_templates(const JsonBody& body);
// Where a chat prompt ends, from vLLM's continue_final_message and add_generation_prompt.
PromptEnd read_prompt_end(const JsonBody& body);
// The integers of the array `ids`, each a token of the tokenizer's vocabulary; the errors name
// `param`, and `expected` says which forms it takes.
std::vector<int32_t> read_token_ids(const JsonBody& ids, const Tokenizer& tokenizer,
                                    const std::string& param, const char* expected);

}  // namespace pipeline
