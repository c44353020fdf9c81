// vLLM's bad_words: the token sequences a request's words are banned as. The sampler bans a
// sequence's last token wherever the answer so far ends with the rest of it
// (SamplingParams::bad_word_sequences).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer.h"

namespace pipeline {

// What one request may ask for, so that its sequences cost little: vLLM's GPU sampler holds a
// request to 128 bad words of 1024 tokens in all, which bounds the comparisons at every draw.
// The text's cap refuses nothing those tokens could spell (a LLaMA-2 piece spells at most 27
// bytes of text) and bounds the encoding: each choice encodes its words twice, so a call of 128
// choices encodes at most 8 MiB, half the prompt text a call may hold (kMaxRequestBytes).
inline constexpr size_t kMaxBadWords = 128;
inline constexpr size_t kMaxBadWordBytes = 32768;  // the words' text together
inline constexpr size_t kMaxBadWordTokens = 1024;  // their sequences' tokens together

// The word without its leading whitespace, as Python's str.lstrip() takes it off (the
// characters str.isspace() holds for, ASCII or not): vLLM strips each word so.
std::string_view strip_leading_whitespace(std::string_view word);

// Each word's token sequences as vLLM finds them: the stripped word encoded without BOS (as
// Hugging Face's encode without special tokens: both start the text with SentencePiece's
// "▁"), then " " and the stripped word encoded, kept only where its first token differs from
// the first sequence's and it is as long (for LLaMA-2, "dragon" is ▁drag on, and " dragon"
// is ▁ ▁drag on, one token longer, so it is not kept). Throws std::invalid_argument, its message
// for the client, on a word with no tokens or on sequences past kMaxBadWordTokens together.
std::vector<std::vector<int32_t>> bad_word_sequences(const Tokenizer& tokenizer,
                                                     std::span<const std::string> words);

}  // namespace pipeline
