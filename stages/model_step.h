// The work prefill and decode_step share: one forward pass over a batch, then each sequence
// whose chunk reaches its last token samples its next token with its own Sampler and is marked
// finished on an end-of-sequence id (unless ignore_eos), a stop_token_ids id, or at max_tokens
// (tokenize capped it to the context and the KV pool). A chunk that stops short of that is part of
// a prompt still being prefilled: its logits row is not sampled. A prompt to score
// (Request::prompt_logprobs) has a row per token, and each scores the prompt token after it.
#pragma once

#include <vector>

#include "graph/engine_context.h"
#include "graph/message.h"

namespace pipeline {

// A forward pass that throws fails its sequences (500) and lists them in StepResult::failed,
// except the last `riders`, decoding sequences that rode along a prefill pass: those go to
// StepResult::retry untouched. One that throws RunnerFailure fails them all, riders too, and
// calls ctx.engine_failed. Either way a sequence whose tokens drawn so far end its answer is not
// failed (Sequence::fail_unless_answered: a stop string among them, found by detokenize before
// the scheduler saw, or still to be found). A pass whose sequences have all ended (their clients
// left, or shutdown failed them) is stopped part-way by the runner (ModelRunner::watch_pass) and
// lists them all in StepResult::failed.
StepResult run_model_step(EngineContext& ctx, const std::vector<SequencePtr>& seqs,
                          const Batch& batch, bool prefill, Logits& logits, int riders = 0);

}  // namespace pipeline
