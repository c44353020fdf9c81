#include "server/foreign_fields.h"

#include <functional>

#include "server/openai_request.h"

namespace pipeline {
namespace {

using Neutral = std::function<bool(const JsonBody&)>;

struct ForeignField {
  const char* name;
  Neutral neutral;      // whether the value changes nothing
  const char* instead;  // the rest of the 400's message
};

Neutral equals(double neutral) {
  return [neutral](const JsonBody& v) { return v.is_number() && v.get<double>() == neutral; };
}
Neutral negative() {
  return [](const JsonBody& v) { return v.is_number() && v.get<double>() < 0; };
}
Neutral is_false() {
  return [](const JsonBody& v) { return v == false; };
}
Neutral empty() {
  return [](const JsonBody& v) {
    return (v.is_array() || v.is_object() || v.is_string()) && v.empty();
  };
}

// llama.cpp's own sampling fields at its "off" values; those that only tune another (mirostat's
// tau and eta, dry_base, xtc_threshold, ...) change nothing while it is off, and are not listed.
const ForeignField kFields[] = {
    {"n_predict", nullptr, "llama.cpp's name for the answer's length: send max_tokens"},
    {"repeat_penalty", equals(1.0),
     "llama.cpp's name: send repetition_penalty (with repeat_last_n, which is applied as "
     "llama.cpp applies it)"},
    {"n_probs", equals(0.0), "llama.cpp's name: send logprobs"},
    {"json_schema", nullptr,
     "llama.cpp's field: send response_format {\"type\": \"json_schema\", ...} or guided_json"},
    {"typical_p", equals(1.0), ": locally typical sampling is not implemented"},
    {"tfs_z", equals(1.0), ": tail-free sampling is not implemented"},
    {"mirostat", equals(0.0), ": mirostat sampling is not implemented"},
    {"dynatemp_range", equals(0.0), ": dynamic temperature is not implemented"},
    {"dry_multiplier", equals(0.0), ": DRY repetition penalties are not implemented"},
    {"xtc_probability", equals(0.0), ": XTC sampling is not implemented"},
    {"top_n_sigma", negative(), ": top-n-sigma sampling is not implemented"},
    {"min_keep", equals(0.0), ": samplers here keep at least one token, not min_keep"},
    {"penalize_nl", is_false(), ": a newline is penalized as any other token"},
    {"samplers", nullptr,
     ": the order is fixed: penalties, then top_k, temperature, top_p and min_p"},
    {"t_max_predict_ms", equals(0.0), ": answers have no time limit"},
    {"lora", empty(), ": the server has no LoRA adapters"},
    // vLLM's beam search, of which length_penalty and early_stopping are the tuning.
    {"use_beam_search", is_false(), ": beam search is not implemented"},
};

}  // namespace

void refuse_foreign_fields(const JsonBody& body) {
  for (const ForeignField& field : kFields) {
    const JsonBody* value = find_field(body, field.name);
    if (!value || (field.neutral && field.neutral(*value))) continue;
    std::string message = field.name;
    message += " is not supported";
    message += field.instead[0] == ':' ? "" : ": ";
    message += field.instead;
    throw invalid(field.name, message);
  }
}

}  // namespace pipeline
