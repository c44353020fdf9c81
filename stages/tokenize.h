// tokenize: a submitted request → its prompt's token ids (chat template or raw prompt), its
// sampler and its text state, ready for the scheduler. Requests that cannot run are answered
// with a 400 error through emit.
//
// Length policy: a prompt that leaves no room for one generated token (in the model's context
// or in the whole KV pool) is refused, naming both lengths, and so is one that leaves too little
// room for a max_tokens the client gave; a default max_tokens is capped to what the context and
// the pool hold (0: up to that cap).
#pragma once

#include <optional>
#include <string>

#include "graph/engine_context.h"
#include "graph/stage_registry.h"
#include "io/prompt_text.h"

namespace pipeline {

class TokenizeStage : public Stage {
 public:
  static StageInfo info();
  explicit TokenizeStage(EngineContext& context) : ctx_(context) {}
  void operator()(Message message, const Emit& emit) override;

  // The refusal a request gets whatever the load, from what is known before its prompt is
  // encoded: a prompt that a bound on its text (or its token ids) shows cannot fit the context
  // or the KV pool, alone or beside the max_tokens the client gave. The stage refuses these
  // requests too (and more, once it has encoded them); the server asks first when its queue is
  // full, so that a request that can never run is told so (400), not to retry later (503).
  std::optional<RequestError> refusal_before_encoding(const Request& request) const;

 private:
  // Why a request cannot run, for its 400 answer.
  struct Refusal {
    std::string message;
    std::string param;  // the request field at fault; empty: none in particular
  };
  static RequestError refusal_error(const Request& req, const Refusal& refusal);
  std::vector<int32_t> prompt_tokens(const Request& req, int answer,
                                     const std::string& prompt_param) const;
  // The chat template's or the prompt's text, before encoding.
  PromptText prompt_text(const Request& req) const;
  // A lower bound on the tokens `text` encodes to, found without encoding it.
  int64_t min_tokens(const PromptText& text) const;
  // A truncate_prompt_tokens longer than the context or the KV pool is refused.
  void check_truncation(int keep) const;
  std::vector<int32_t> prompt_ids(const std::vector<int32_t>& ids, int keep) const;
  void check_fits(int64_t n, int answer, const std::string& prompt_param,
                  const std::string& at_least = "") const;
  static void check_room(int64_t prompt, int max_tokens, int context, int64_t pool,
                         const std::string& prompt_param, const std::string& max_tokens_param,
                         const std::string& at_least = "");
  // Tokens the whole KV pool holds: no prompt and answer may need more.
  int64_t pool_tokens() const;
  // A token id a parameter names (logit_bias, stop_token_ids) must be in the model's vocabulary.
  void check_in_vocabulary(int32_t token, const char* param) const;
  // The token sequences the request's bad_words are banned as, in `sampling` (its ending
  // tokens filled); refused where they do not fit the cap or leave the first draw no token.
  void resolve_bad_words(const Request& req, SamplingParams& sampling) const;
  // Fills the sequence's prompt, limits, sampler and text state; throws Refusal.
  void prepare(Sequence& seq) const;

  EngineContext& ctx_;
};

}  // namespace pipeline
