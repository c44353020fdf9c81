// detokenize: sampled tokens → text deltas, per sequence in generation order (tokens of one
// sequence may arrive from concurrent bodies out of order; TextState puts them back in order).
// Stop strings end a sequence with reason "stop" and are never sent, not even in part (unless
// include_stop_str_in_output asks for them); the scheduler then drops the sequence at its next
// step. A prompt that was scored (echo with
// logprobs) goes out with the first delta.
#pragma once

#include "graph/engine_context.h"
#include "graph/stage_registry.h"

namespace pipeline {

class DetokenizeStage : public Stage {
 public:
  static StageInfo info();
  explicit DetokenizeStage(EngineContext& context) : ctx_(context) {}
  void operator()(Message message, const Emit& emit) override;

 private:
  // One token of `seq`, in order; appends the events it makes to `out`.
  void add_token(const SequencePtr& seq, const GeneratedToken& token, StreamEvents& out) const;
  // A generated token's text for logprobs, given what the decoder made of it.
  std::string logprob_text(int32_t id, const std::string& decoded, bool at_text_start) const;
  // Request::prompt_logprobs: the prompt's tokens with their scores, for the first delta.
  std::vector<TokenOutput> scored_prompt(const TextState& state, const GeneratedToken& token) const;

  EngineContext& ctx_;
};

}  // namespace pipeline
