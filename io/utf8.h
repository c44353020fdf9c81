// UTF-8 at the byte level, for code that walks text by characters without decoding it.
#pragma once

namespace pipeline {

// A byte that continues a character (10xxxxxx) rather than starting one.
inline bool is_continuation_byte(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

}  // namespace pipeline
