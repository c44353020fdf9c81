// Unicode code points and sets of them, as the guides' syntaxes (guided_regex's regular
// expressions, guided_grammar's GBNF) read their characters and classes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace pipeline {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Code points lo..hi, both included.
struct CodePointRange {
  uint32_t lo;
  uint32_t hi;
};

// Sorted, disjoint and not adjacent.
std::vector<CodePointRange> normalized_ranges(std::vector<CodePointRange> ranges);

// The code points 0..kMaxCodePoint that `ranges` leaves out.
std::vector<CodePointRange> complement_ranges(const std::vector<CodePointRange>& ranges);

// One UTF-8 character from `text` at `*at`, which it moves past it; nullopt if the bytes there
// are not one (overlong forms, surrogates and code points past kMaxCodePoint are not).
std::optional<uint32_t> decode_utf8(std::string_view text, size_t* at);

}  // namespace pipeline
