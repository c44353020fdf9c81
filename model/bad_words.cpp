#include "model/bad_words.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace pipeline {

std::string_view strip_leading_whitespace(std::string_view word) {
  // Python's whitespace: ASCII's six, the four information separators, and Unicode's spaces
  // and line and paragraph separators, in UTF-8.
  static constexpr std::string_view kWhitespace[] = {
      "\t",     "\n",     "\v",     "\f",     "\r",     "\x1c",   "\x1d",   "\x1e",
      "\x1f",   " ",      "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
      "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
      "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  for (;;) {
    const auto space = std::ranges::find_if(
        kWhitespace, [&](std::string_view character) { return word.starts_with(character); });
    if (space == std::end(kWhitespace)) return word;
    word.remove_prefix(space->size());
  }
}

std::vector<std::vector<int32_t>> bad_word_sequences(const Tokenizer& tokenizer,
                                                     std::span<const std::string> words) {
  std::vector<std::vector<int32_t>> sequences;
  size_t tokens = 0;
  for (const std::string& word : words) {
    const std::string_view stripped = strip_leading_whitespace(word);
    std::vector<int32_t> plain = tokenizer.encode(stripped, /*add_bos=*/false);
    if (plain.empty())
      throw std::invalid_argument("bad_words holds \"" + word + "\", which has no tokens");
    // With a space before it: vLLM keeps this spelling only where it begins with a token of its
    // own and is as long, a word-initial token in place of the plain one.
    std::string spaced_text = " ";
    spaced_text.append(stripped);  // (" " + std::string(...) trips GCC 12's -Wrestrict at -O3)
    std::vector<int32_t> spaced = tokenizer.encode(spaced_text, /*add_bos=*/false);
    const bool kept =
        !spaced.empty() && spaced.front() != plain.front() && spaced.size() == plain.size();
    tokens += plain.size() + (kept ? spaced.size() : 0);
    sequences.push_back(std::move(plain));
    if (kept) sequences.push_back(std::move(spaced));
  }
  if (tokens > kMaxBadWordTokens)
    throw std::invalid_argument("bad_words come to " + std::to_string(tokens) +
                                " tokens, more than the " + std::to_string(kMaxBadWordTokens) +
                                " a request may ban");
  return sequences;
}

}  // namespace pipeline
