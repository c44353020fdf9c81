// A prompt as the texts it is encoded from, before any is encoded: a text prompt is one, a
// chat template writes one a turn, each after a BOS and (past turns) followed by an EOS. Held as
// text so that its length can be bounded, and a truncated prompt's end encoded, without
// encoding all of it: sentencepiece takes seconds a megabyte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace pipeline {

struct PromptSegment {
  std::string text;
  bool bos_before = true;
  bool eos_after = false;
};

using PromptText = std::vector<PromptSegment>;

// The prompt's token ids: each segment encoded on its own between its BOS and EOS.
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const PromptText& prompt);

// The last `keep` of encode_prompt()'s ids (all when there are fewer), encoding only the end of
// the text they come from (Tokenizer::encode_last). Throws std::invalid_argument where that
// end cannot be found in a segment too long to encode whole.
std::vector<int32_t> encode_prompt_end(const Tokenizer& tokenizer, const PromptText& prompt,
                                       size_t keep);

// A lower bound on encode_prompt()'s length, in one pass over the text (Tokenizer::min_tokens).
size_t min_prompt_tokens(const Tokenizer& tokenizer, const PromptText& prompt);

}  // namespace pipeline
