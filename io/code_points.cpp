#include "io/code_points.h"

#include <algorithm>

namespace pipeline {

std::vector<CodePointRange> normalized_ranges(std::vector<CodePointRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodePointRange& a, const CodePointRange& b) { return a.lo < b.lo; });
  std::vector<CodePointRange> merged;
  for (const CodePointRange& range : ranges) {
    if (!merged.empty() && range.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, range.hi);
    } else {
      merged.push_back(range);
    }
  }
  return merged;
}

std::vector<CodePointRange> complement_ranges(const std::vector<CodePointRange>& ranges) {
  std::vector<CodePointRange> out;
  uint32_t next = 0;
  for (const CodePointRange& range : normalized_ranges(ranges)) {
    if (range.lo > next) out.push_back({next, range.lo - 1});
    next = range.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

std::optional<uint32_t> decode_utf8(std::string_view text, size_t* at) {
  const auto byte = [&](size_t i) { return uint8_t(text[i]); };
  const uint8_t lead = byte(*at);
  int length = lead < 0x80           ? 1
               : (lead >> 5) == 0x6  ? 2
               : (lead >> 4) == 0xE  ? 3
               : (lead >> 3) == 0x1E ? 4
                                     : 0;
  if (length == 0 || *at + size_t(length) > text.size()) return std::nullopt;
  uint32_t code = length == 1 ? lead : uint32_t(lead) & (0x7Fu >> length);
  for (int i = 1; i < length; ++i) {
    if ((byte(*at + size_t(i)) & 0xC0) != 0x80) return std::nullopt;
    code = (code << 6) | (byte(*at + size_t(i)) & 0x3F);
  }
  static constexpr uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kLeast[length] || code > kMaxCodePoint || (code >= 0xD800 && code <= 0xDFFF))
    return std::nullopt;
  *at += size_t(length);
  return code;
}

}  // namespace pipeline
