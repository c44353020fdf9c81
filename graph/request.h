// A generation request as it travels through the pipeline, and the sink its results go to.
// The HTTP server and the offline batch runner make Requests; the `emit` stage feeds sinks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "io/chat_template.h"
#include "io/grammar.h"
#include "io/json_schema.h"
#include "io/text_pattern.h"
#include "model/finish_reason.h"
#include "model/sampling.h"

namespace pipeline {

// One token with its logprob, for logprobs.
struct TokenOutput {
  int32_t token = 0;
  std::string text;  // the token's own text (its bytes may be part of a wider character)
  std::optional<float> logprob;  // none only for a prompt's first token: nothing predicts it
  std::vector<TokenLogprob> top;
};

// A sequence's tokens as usage counts them.
struct TokenCounts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // of the prompt's, those the prefix cache held when it was admitted
};

// New text since the last delta, and the tokens that produced it.
struct Delta {
  std::string text;
  std::vector<TokenOutput> tokens;
  // With Request::prompt_logprobs, in a sequence's first delta only: every prompt token, each
  // with the model's logprob of it given the tokens before it.
  std::vector<TokenOutput> prompt;
  // The delta stands for a generated token, even one whose text is held back (a character not
  // finished yet, the possible start of a stop string): a stream sends it as a chunk of empty
  // text, as vLLM does, so that clients see every token arrive. Not an ending token not shown
  // (whose delta, with logprobs asked for, still carries its logprob in `tokens`).
  bool new_token = false;
  // The sequence's counts once the delta's token was generated (it among the completion's), for
  // the usage a stream reports as it goes (vLLM's stream_options.continuous_usage_stats).
  TokenCounts counts;
};

// vLLM's stop_reason: what the client named that ended an answer, the stop string that matched
// or the stop token id generated; none for an end of sequence or a length limit.
using StopReason = std::variant<std::monostate, std::string, int32_t>;

struct Completion {
  FinishReason reason = FinishReason::Stop;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // of the prompt's, those the prefix cache held when it was admitted
  StopReason stop_reason = {};
  // When the model step drew the token that ended it: the end of vLLM's decode and inference
  // phases (the metrics'), before detokenizing and delivery.
  std::chrono::steady_clock::time_point last_token_at = {};

  TokenCounts counts() const { return {prompt_tokens, completion_tokens, cached_tokens}; }
};

// The status of a request whose client left (nginx's "client closed request"): nobody reads it,
// the metrics count it as cancelled.
inline constexpr int kClientGoneStatus = 499;

// An error to report as OpenAI does: {"error": {"message", "type", "param", "code"}}.
struct RequestError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// What each request gets once the engine has failed for good (Engine::failure(), `why`): a 503,
// as for a shutdown, since the server stops and a restarted one can answer it.
inline RequestError engine_failed_error(const std::string& why) {
  return {503, why, "server_error", "", "engine_failed"};
}

// Receives a request's results in order: any number of deltas, then exactly one of
// on_finish or on_error. Calls come from pipeline threads and must not block for long.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void on_delta(Delta delta) = 0;
  virtual void on_finish(const Completion& completion) = 0;
  virtual void on_error(const RequestError& error) = 0;
};

struct Request {
  std::string id;  // chatcmpl-… or cmpl-…
  bool chat = true;
  std::vector<ChatMessage> messages;            // chat requests
  PromptEnd prompt_end = PromptEnd::NewAnswer;  // chat requests: vLLM's continue_final_message
  std::string prompt;                           // text completions
  std::vector<int32_t> prompt_ids;  // a completions prompt given as token ids: used as they are
  // A choice of a list of prompts: its prompt's index in the list, which its refusals name
  // ("prompt[2]: ..."), since the call's one error must say which prompt failed; -1: no list.
  int prompt_index = -1;
  // vLLM's truncate_prompt_tokens: only the prompt's last k tokens (after the chat template or
  // BOS, which may be cut) reach the model; 0: the whole prompt.
  int truncate_prompt_tokens = 0;
  SamplingParams sampling;
  int max_tokens = 0;  // 0: up to the end of the context
  // vLLM's add_special_tokens: a text prompt (not a chat, not token ids) gets BOS first.
  bool add_bos = true;
  // vLLM's priority: with scheduler.policy priority, a lower value is admitted first and
  // preempted last; otherwise always 0.
  int priority = 0;
  // The field the client limited max_tokens with ("max_tokens", "max_completion_tokens"), or
  // empty for the server's default. A prompt that leaves a limit the client gave too little
  // room is refused (400 naming the field), as OpenAI and vLLM refuse it, rather than answered
  // short; a default is capped to the room left.
  std::string max_tokens_param;
  std::vector<std::string> stop;
  // vLLM's stop_token_ids: generating one of these ends the answer ("stop"); like an end of
  // sequence, it adds no text.
  // (sampling.min_tokens also holds back stop strings: one may end only in the text of the
  // tokens after the first min_tokens.)
  std::vector<int32_t> stop_token_ids;
  // vLLM's include_stop_str_in_output: the stop string or stop token id that ended the answer
  // is part of its text.
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  // vLLM's bad_words, as the client wrote them: the tokenize stage finds the token sequences
  // they are banned as (model/bad_words.h) for sampling.bad_word_sequences.
  std::vector<std::string> bad_words;
  // Guided decoding (GuidedDecoding); all three null: free text. At most one is set.
  // response_format json_object or json_schema, guided_json: a JSON value this schema admits.
  std::shared_ptr<const JsonSchema> json_schema;
  // guided_regex, guided_choice: a text this pattern accepts.
  std::shared_ptr<const TextPattern> text_pattern;
  // guided_grammar, structured_outputs grammar, grammar: a text this grammar derives.
  std::shared_ptr<const Grammar> grammar;
  // The parameter that asked for the guide, for its errors ("guided_grammar", ...).
  std::string guide_param;
  // Score the prompt too (echo with logprobs): the first delta carries Delta::prompt, with
  // sampling.top_logprobs alternatives per token. Its prompt is computed whole, not taken from
  // the prefix cache, since cached positions have no logits.
  bool prompt_logprobs = false;
  // Echo with max_tokens 0: the answer is the prompt alone. One token is still generated (the
  // engine samples after every prompt) and dropped, never computed at a position of its own,
  // so the prompt may fill the whole context (lm-eval's loglikelihood windows do).
  bool prompt_only = false;
  std::shared_ptr<RequestSink> sink;
  // Set by Engine::submit when it accepts the request: its sequence's number, which
  // Engine::cancel finds it by. Read on the thread that submitted.
  std::optional<uint64_t> sequence_number;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

}  // namespace pipeline
