#include "io/prompt_text.h"

#include <stdexcept>

namespace pipeline {
namespace {

int32_t eos_of(const Tokenizer& tokenizer) {
  if (tokenizer.eos_id() < 0)
    throw std::runtime_error("the prompt ends a turn with EOS but the tokenizer has no EOS piece");
  return tokenizer.eos_id();
}

}  // namespace

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const PromptText& prompt) {
  std::vector<int32_t> ids;
  for (const PromptSegment& segment : prompt) {
    const std::vector<int32_t> encoded = tokenizer.encode(segment.text, segment.bos_before);
    ids.insert(ids.end(), encoded.begin(), encoded.end());
    if (segment.eos_after) ids.push_back(eos_of(tokenizer));
  }
  return ids;
}

// Segments from the last back, each giving what is still missing from its own end, until
// `keep` ids are found; then the pieces are put back in order.
std::vector<int32_t> encode_prompt_end(const Tokenizer& tokenizer, const PromptText& prompt,
                                       size_t keep) {
  std::vector<std::vector<int32_t>> ends;  // the last segment's first
  size_t found = 0;
  for (auto segment = prompt.rbegin(); segment != prompt.rend() && found < keep; ++segment) {
    std::vector<int32_t> end;
    if (segment->eos_after) end.push_back(eos_of(tokenizer));
    if (found + end.size() < keep) {
      std::vector<int32_t> encoded =
          tokenizer.encode_last(segment->text, segment->bos_before, keep - found - end.size());
      end.insert(end.begin(), encoded.begin(), encoded.end());
    }
    found += end.size();
    ends.push_back(std::move(end));
  }
  std::vector<int32_t> ids;
  ids.reserve(found);
  for (auto end = ends.rbegin(); end != ends.rend(); ++end)
    ids.insert(ids.end(), end->begin(), end->end());
  return ids;
}

size_t min_prompt_tokens(const Tokenizer& tokenizer, const PromptText& prompt) {
  size_t tokens = 0;
  for (const PromptSegment& segment : prompt)
    tokens += tokenizer.min_tokens(segment.text) + segment.bos_before + segment.eos_after;
  return tokens;
}

}  // namespace pipeline
