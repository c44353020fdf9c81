// OpenAI's responses, without any networking: pipeline results (Delta, Completion,
// RequestError) to OpenAI's response objects and server-sent-event chunks, for a request
// server/openai_request.h parsed.
//
// Choices made here (OpenAI's, or vLLM's where OpenAI has none):
// - an echoed prompt's logprobs come first, the first token's null (nothing predicts it), their
//   text_offsets counted in the prompt;
// - text_offset counts characters (Unicode code points, as Python does), not bytes, of the text
//   as returned (a byte outside a well-formed character is the U+FFFD it shows there); a
//   completions token's top_logprobs hold the token itself besides its alternatives;
// - completion chunks carry vLLM's stop_reason throughout, chat chunks at their end;
// - an impossible logprob is -9999, not a non-JSON -infinity;
// - with stream_options.include_usage, every chunk has "usage": null but the last; with vLLM's
//   continuous_usage_stats too, each has its choice's usage so far instead, as vLLM counts it:
//   its prompt's tokens and the tokens the choice generated so far (not the call's sum), and,
//   as the last chunk counts them, the prompt's cached tokens (the least of its choices' so far);
// - members come in the order OpenAI writes them (id, object, created, model, choices, usage),
//   and a completions token's top_logprobs from the likeliest down.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/request.h"
#include "io/utf8.h"
#include "server/openai_request.h"

namespace pipeline {

// A response as JSON whose objects keep their members in the order they were added.
using ResponseJson = nlohmann::ordered_json;

// The "object" a whole (not streamed) answer names itself by: a chat completion's, or a text
// completion's.
const char* answer_object(bool chat);

// {"error": {"message", "type", "param", "code"}}, empty strings as null.
ResponseJson error_body(const RequestError& error);

// One server-sent event carrying `payload`, and the stream's last event.
std::string sse_event(const ResponseJson& payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Serialises a response; invalid UTF-8 (a token that is part of a character) becomes U+FFFD.
std::string to_json_text(const ResponseJson& value);

// A token's text as OpenAI reports it in logprobs: the "▁" word marker as a space, a
// byte-fallback piece as its byte.
using TokenTextFn = std::function<std::string(int32_t token)>;

// Builds the response objects of one API call: the chunks of a stream, or the whole answer
// from the deltas collected with append(). Choices are numbered from 0.
class ResponseBuilder {
 public:
  // `token_text` names the top-logprob alternatives (a Delta carries only their ids).
  ResponseBuilder(const ParsedRequest& parsed, std::string model, TokenTextFn token_text);

  // Streaming. A chat stream opens with role_chunk() for each choice; each choice ends with
  // its finish_chunk(), and the stream with usage_chunk() when include_usage, then kSseDone.
  // A delta that shows() nothing (no new token, text or logprobs, or a prompt_only answer's
  // token after the echo) needs no chunk. With continuous usage a chunk counts the tokens of
  // its delta or completion; a role chunk, sent before any token, those of count_prompt().
  ResponseJson role_chunk(int choice = 0) const;
  // The prompt counts (tokens, cache hits) of `choice`'s prompt, as an event of it reports them.
  void count_prompt(const TokenCounts& counts, int choice = 0);
  bool shows(const Delta& delta, int choice = 0) const;
  ResponseJson delta_chunk(const Delta& delta, int choice = 0);
  ResponseJson finish_chunk(const Completion& completion, int choice = 0);
  ResponseJson usage_chunk(std::span<const Completion> choices) const;

  // Non-streaming: collect every delta, then build chat.completion or text_completion from
  // every choice's completion.
  void append(const Delta& delta, int choice = 0);
  ResponseJson whole_response(std::span<const Completion> choices) const;

 private:
  // A choice's answer so far (non-streaming) and its place in the text (completions logprobs).
  struct ChoiceText {
    std::string text;
    ResponseJson logprobs;
    std::string prompt;               // echo: its prompt's text
    bool echo_due = false;            // echo: the prompt is not sent yet
    CharacterOffsets answer_offsets;  // where each token starts in prompt+text
    int completion_tokens = 0;        // continuous usage: those its chunks counted so far
  };
  // Continuous usage: what the chunks so far counted of a prompt.
  struct PromptCounts {
    int tokens = 0;
    std::optional<int> cached;  // the least cache hits any of its choices reported
  };

  ResponseJson chunk_envelope() const;
  // A stream chunk of one choice's entry, with the usage include_usage asks for.
  ResponseJson choice_chunk(ResponseJson entry, int choice) const;
  void count(const TokenCounts& counts, int choice);
  ResponseJson usage_so_far(int choice) const;
  ResponseJson usage(std::span<const Completion> choices) const;
  ResponseJson usage_json(TokenCounts counts) const;
  FinishReason shown_reason(FinishReason reason) const;
  ResponseJson shown_stop_reason(const Completion& completion) const;
  // The text a delta adds to the answer: the echoed prompt first, if due (and then no longer).
  std::string take_text(const Delta& delta, ChoiceText& choice) const;
  ResponseJson logprobs(const Delta& delta, ChoiceText& choice) const;
  ResponseJson chat_logprobs(const std::vector<TokenOutput>& tokens) const;
  ResponseJson completion_logprobs(const Delta& delta, ChoiceText& choice) const;

  std::string id_;
  bool chat_;
  bool logprobs_;
  bool include_usage_;
  bool continuous_usage_;
  bool prompt_only_;
  int64_t created_;
  std::string model_;
  TokenTextFn token_text_;
  int per_prompt_;
  std::vector<ChoiceText> choices_;
  std::vector<PromptCounts> prompt_counts_;
};

}  // namespace pipeline
