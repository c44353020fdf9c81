// UTF-8 at the byte level, for code that walks text by characters without decoding it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pipeline {

// A byte that continues a character (10xxxxxx) rather than starting one.
inline bool is_continuation_byte(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

enum class Utf8Status { Complete, Incomplete, Invalid };

// Whether `bytes` (not empty) start with a well-formed UTF-8 character (Unicode table 3-7: no
// overlong forms, no surrogates, nothing above U+10FFFF), with its length when Complete. These
// are the characters sentencepiece's decoder accepts; any other byte becomes one U+FFFD.
Utf8Status leading_character(std::string_view bytes, size_t& length);

// `bytes` with every byte outside a well-formed character as U+FFFD, as sentencepiece decodes
// them.
std::string replacing_invalid_utf8(std::string_view bytes);

// Where each piece of a text that arrives in pieces of bytes (an answer's tokens) starts, in the
// characters of the text IncrementalDecoder makes of them (OpenAI's text_offset counts as
// Python's len does): a well-formed character counts in the piece of its first byte, and every
// other byte is a U+FFFD of its own. A piece of no text (a control token's, a padding id's) ends
// an unfinished character, as it ends IncrementalDecoder's run of byte pieces.
class CharacterOffsets {
 public:
  explicit CharacterOffsets(size_t start = 0) : count_(start) {}

  // Where `piece` starts; what follows starts after it.
  size_t add(std::string_view piece);

 private:
  size_t count_;            // characters so far, an unfinished one included
  std::string unfinished_;  // the first bytes of a character the next piece may finish
};

}  // namespace pipeline
