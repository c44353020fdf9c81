// LLaMA-2's real tokenizer from the shared test data, loaded once, and a model config that
// matches it (its vocabulary, its end of sequence): what guided decoding's tests walk.
#pragma once

#include "io/model_config.h"
#include "io/tokenizer.h"
#include "tests/support/shared_data.h"

namespace pipeline::testing {

inline const Tokenizer& llama2_tokenizer() {
  static const Tokenizer tokenizer(shared_path("models/llama2-tokenizer/tokenizer.model"));
  return tokenizer;
}

// A model whose logits are exactly `tokenizer`'s vocabulary and whose end of sequence is its.
inline LlamaConfig config_for(const Tokenizer& tokenizer) {
  LlamaConfig config;
  config.vocab_size = tokenizer.vocab_size();
  config.eos_token_ids = {tokenizer.eos_id()};
  return config;
}

}  // namespace pipeline::testing
