#include "server/foreign_fields.h"

#include <functional>
#include <limits>

#include "server/openai_request.h"

namespace pipeline {
namespace {

// Whether a value changes nothing here.
using Neutral = std::function<bool(const JsonBody& value, const SamplingParams& sampling)>;

struct ForeignField {
  const char* name;
  Neutral neutral;      // null: every value changes something
  const char* instead;  // the rest of the 400's message
};

// A number within [lo, hi].
Neutral within(double lo, double hi) {
  return [lo, hi](const JsonBody& v, const SamplingParams&) {
    return v.is_number() && v.get<double>() >= lo && v.get<double>() <= hi;
  };
}
Neutral at_least(double lo) {
  return within(lo, std::numeric_limits<double>::infinity());
}
Neutral at_most(double hi) {
  return within(-std::numeric_limits<double>::infinity(), hi);
}
Neutral is_false() {
  return [](const JsonBody& v, const SamplingParams&) { return v == false; };
}
Neutral empty() {
  return [](const JsonBody& v, const SamplingParams&) {
    return (v.is_array() || v.is_object() || v.is_string()) && v.empty();
  };
}

// llama.cpp's penalize_nl false (its default) exempts the newline from the penalties; here it is
// penalized as any other token, as with true, so false changes the answer only under a penalty.
Neutral newline_penalized_alike() {
  return [](const JsonBody& v, const SamplingParams& s) {
    const bool penalties =
        s.repetition_penalty != 1.0f || s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f;
    return v == true || (v == false && !penalties);
  };
}

// At the values where llama.cpp skips the sampler. Fields that only tune another (mirostat's
// tau and eta, dry_base, xtc_threshold, ...) change nothing while it is off, and are not listed.
const ForeignField kFields[] = {
    // llama.cpp's
    {"n_predict", nullptr, "llama.cpp's name for the answer's length: send max_tokens"},
    {"repeat_penalty", within(1.0, 1.0),
     "llama.cpp's name: send repetition_penalty (with repeat_last_n: 64 for llama.cpp's "
     "default window; without it the whole history counts, as in vLLM)"},
    {"n_probs", within(0.0, 0.0), "llama.cpp's name: send logprobs"},
    {"typical_p", at_least(1.0), ": locally typical sampling is not implemented"},
    {"tfs_z", at_least(1.0), ": tail-free sampling is not implemented"},
    {"mirostat", within(0.0, 0.0), ": mirostat sampling is not implemented"},
    {"dynatemp_range", at_most(0.0), ": dynamic temperature is not implemented"},
    {"dry_multiplier", within(0.0, 0.0), ": DRY repetition penalties are not implemented"},
    {"xtc_probability", within(0.0, 0.0), ": XTC sampling is not implemented"},
    {"top_n_sigma", at_most(0.0), ": top-n-sigma sampling is not implemented"},
    {"min_keep", within(0.0, 1.0), ": samplers here keep at least one token, not min_keep"},
    {"penalize_nl", newline_penalized_alike(),
     ": repetition, presence and frequency penalties weigh a newline as any other token"},
    {"samplers", nullptr,
     ": the order is fixed: penalties, then top_k, temperature, top_p and min_p"},
    {"t_max_predict_ms", within(0.0, 0.0), ": answers have no time limit"},
    {"n_indent", within(0.0, 0.0), ": answers have no minimum indentation"},
    {"lora", empty(), ": the server has no LoRA adapters"},
    {"return_tokens", is_false(), ": send logprobs for the answer's tokens"},
    {"post_sampling_probs", is_false(), ": logprobs are the model's own, before sampling"},
    {"response_fields", empty(), ": responses have OpenAI's fields"},
    // vLLM's (length_penalty and early_stopping tune its beam search)
    {"use_beam_search", is_false(), ": beam search is not implemented"},
    {"prompt_logprobs", nullptr,
     ": /v1/completions scores a prompt with echo and logprobs (max_tokens 0 for the prompt "
     "alone)"},
    {"return_tokens_as_token_ids", is_false(), ": logprobs name their tokens by text"},
    {"logits_processors", empty(), ": the server has no logits processors"},
};

}  // namespace

void refuse_foreign_fields(const JsonBody& body, const SamplingParams& sampling) {
  for (const ForeignField& field : kFields) {
    const JsonBody* value = find_field(body, field.name);
    if (!value || (field.neutral && field.neutral(*value, sampling))) continue;
    std::string message = field.name;
    message += " is not supported";
    message += field.instead[0] == ':' ? "" : ": ";
    message += field.instead;
    throw invalid(field.name, message);
  }
}

}  // namespace pipeline
