// vLLM's token utility endpoints, without any networking: POST /tokenize turns a prompt or a
// chat into the token ids the completion endpoints would give the model, POST /detokenize turns
// token ids back into text.
//
//   /tokenize    {"model", "prompt": text, "add_special_tokens": true}
//             or {"model", "messages": [...], "add_generation_prompt": true,
//                 "continue_final_message": false}
//                (either form may add "return_token_strs": true)
//             → {"count": N, "max_model_len": CONTEXT, "tokens": [ids], "token_strs": [texts]}
//   /detokenize  {"model", "tokens": [ids]} → {"prompt": text}
//
// Choices made here (vLLM's behaviour unless said otherwise):
// - `model` is required and must name the served model, as for the completion endpoints (vLLM
//   lets it be left out).
// - /tokenize takes exactly one of `prompt` (a string) and `messages`; both or neither is a 400.
// - A prompt gets BOS first unless add_special_tokens is false, as /v1/completions encodes it.
// - Messages become tokens through the chat template exactly as /v1/chat/completions builds
//   them. The template places BOS itself, so add_special_tokens is false for them (vLLM's
//   default); true, which would add a second BOS no chat request ever gets, is refused.
//   continue_final_message true, with add_generation_prompt false, ends the tokens inside the
//   assistant's last message, as /v1/chat/completions does (read_prompt_end); with
//   add_generation_prompt true it is a 400.
// - token_strs holds each token's text as logprobs show it (Tokenizer::token_text: "▁" as a
//   space, a byte piece as its byte, BOS as ""), where vLLM gives the raw pieces ("▁the", "<s>").
//   It is left out unless return_token_strs is true.
// - /detokenize takes ids of the tokenizer's vocabulary; an empty list decodes to "".
#pragma once

#include "io/chat_template.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace pipeline {

// What /tokenize needs to know of the served model beyond its name and tokenizer.
struct TokenizeSettings {
  ChatTemplate chat_template = ChatTemplate::Llama2;  // the engine's, for `messages`
  int max_model_len = 0;  // Engine::max_model_len(): the context, or the KV cache if smaller
};

// The answers to one request body; `model.tokenizer` must be set. Throws ApiError (400 naming
// the parameter, 404 for an unknown model) on a body they cannot answer.
ResponseJson tokenize_response(const JsonBody& body, const ServedModel& model,
                               const TokenizeSettings& settings);
ResponseJson detokenize_response(const JsonBody& body, const ServedModel& model);

}  // namespace pipeline
