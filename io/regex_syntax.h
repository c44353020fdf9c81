// guided_regex's regular expressions, parsed into a tree over sets of Unicode code points, which
// TextPattern compiles into an automaton over bytes. The syntax is Python's `re` (what vLLM's
// guided_regex takes) without what no finite automaton holds: backreferences, lookarounds,
// anchors other than a leading ^ and a trailing $, and inline flags are refused with the place
// they stand, never ignored.
//
// Held: literals (any UTF-8 text), `.` (any character but a newline), classes `[...]` and
// `[^...]` with ranges, `\d \w \s` and `\D \W \S` (ASCII: [0-9], [A-Za-z0-9_], [ \t\n\r\f\v]),
// the escapes `\n \t \r \f \v \a \xHH \uHHHH \UHHHHHHHH`, octal ones as Python reads them
// (`\0` and up to two more octal digits, or three octal digits; in a class any octal digit
// begins one), and a backslash before any other punctuation, groups `(...)`, `(?:...)`,
// `(?P<name>...)` and JavaScript's `(?<name>...)` (each name an identifier, once), alternation
// `|`, and the quantifiers `* + ? {n} {n,} {,m} {n,m} {,}`, each also lazy (`*?`: a lazy
// quantifier admits the same texts, and only the texts matter here). A `{` that does not begin
// a quantifier is a literal, as in Python. The pattern matches the whole answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "io/code_points.h"

namespace pipeline {

class RegexSyntaxError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct RegexNode {
  enum class Kind : uint8_t {
    Set,          // one character from `ranges`
    Concat,       // `children` one after another (none: the empty text)
    Alternation,  // one of `children`
    Repeat,       // `children[0]` min..max times
  };
  static constexpr int kUnbounded = -1;

  Kind kind = Kind::Concat;
  std::vector<CodePointRange> ranges;  // Set: sorted, disjoint, not adjacent
  std::vector<int> children;           // indices into RegexTree::nodes
  int min = 0;
  int max = 0;  // Repeat: kUnbounded for * and +
};

struct RegexTree {
  std::vector<RegexNode> nodes;
  int root = 0;
};

// A count in {n,m} may not exceed this: each repetition is a copy of the repeated automaton.
inline constexpr int kMaxRegexRepeat = 1000;
// Groups may nest at most this deep.
inline constexpr int kMaxRegexDepth = 200;

// Throws RegexSyntaxError naming the position (in characters) of what it refuses.
RegexTree parse_regex(std::string_view pattern);

// The tree of exactly these texts (guided_choice): an alternation of literals.
RegexTree literal_alternatives(std::span<const std::string> texts);

}  // namespace pipeline
