// tokenize: a submitted request → its prompt's token ids (chat template or raw prompt), its
// sampler and its text state, ready for the scheduler. Requests that cannot run are answered
// with a 400 error through emit.
//
// Length policy: a prompt that leaves no room for one generated token (in the model's context
// or in the whole KV pool) is refused, naming both lengths, and so is one that leaves too little
// room for a max_tokens the client gave; a default max_tokens is capped to what the context and
// the pool hold (0: up to that cap).
#pragma once

#include <string>

#include "graph/engine_context.h"
#include "graph/stage_registry.h"

namespace pipeline {

class TokenizeStage : public Stage {
 public:
  static StageInfo info();
  explicit TokenizeStage(EngineContext& context) : ctx_(context) {}
  void operator()(Message message, const Emit& emit) override;

 private:
  // Why a request cannot run, for its 400 answer.
  struct Refusal {
    std::string message;
    std::string param;  // the request field at fault; empty: none in particular
  };
  std::vector<int32_t> prompt_tokens(const Request& req, int answer,
                                     const std::string& prompt_param) const;
  std::vector<int32_t> prompt_ids(const std::vector<int32_t>& ids, int keep) const;
  void check_fits(int64_t n, int answer, const std::string& prompt_param,
                  const std::string& at_least = "") const;
  static void check_room(int prompt, int max_tokens, int context, int64_t pool,
                         const std::string& prompt_param, const std::string& max_tokens_param);
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
