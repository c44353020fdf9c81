// guided_grammar's grammars, in GBNF: the syntax llama.cpp documents in its grammars/README.md
// (and takes as its `grammar` field), which vLLM's xgrammar backend reads too. Parsed into rules
// whose bodies are trees over sets of Unicode code points; Grammar (io/grammar.h) compiles them.
//
// Held, as llama.cpp reads them: rules `name ::= body`, one after another, a name being letters,
// digits and '-'; the start rule `root`; string literals "..." and character classes [...] and
// [^...] with ranges, both with the escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH (a
// code point each; \xHH is U+00HH, not a byte); `.` (any character, a newline too); groups
// ( ... ); alternation |; the quantifiers * + ? {m} {m,} {m,n} (spaces allowed inside the
// braces; llama.cpp takes no {,n}); comments from # to the end of the line. A rule's body ends at
// a newline outside parentheses; after `::=` and `|`, and inside parentheses, newlines are
// spaces. Refused with their line and column, never ignored: llama.cpp's token references
// (<...>: a grammar here is over text), an empty class [] or [^] (llama.cpp reads it as nothing
// at all), a range that runs backwards, escapes naming no character (surrogates, past U+10FFFF),
// a rule defined twice (llama.cpp keeps the later one silently), and text that is not UTF-8.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "io/code_points.h"

namespace pipeline {

class GrammarError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct GrammarExpr {
  enum class Kind : uint8_t {
    Set,          // one character from `ranges`
    Concat,       // `children` one after another (none: the empty text)
    Alternation,  // one of `children`
    Repeat,       // `children[0]` min..max times
    Rule,         // the text rule `rule` derives
  };
  static constexpr int kUnbounded = -1;

  Kind kind = Kind::Concat;
  std::vector<CodePointRange> ranges;  // Set: sorted, disjoint, not adjacent; no surrogates
  std::vector<int> children;           // indices into GrammarSyntax::exprs
  int min = 0;
  int max = 0;   // Repeat: kUnbounded for * and +
  int rule = 0;  // Rule: index into GrammarSyntax::rules
};

struct GrammarRule {
  std::string name;
  int body = -1;  // index into GrammarSyntax::exprs
  // Where it is defined (errors about the rule name the place).
  int line = 0;
  int column = 0;
};

struct GrammarSyntax {
  std::vector<GrammarExpr> exprs;
  std::vector<GrammarRule> rules;
  int root = 0;  // index into rules
};

// A count in {m,n} may not exceed this: each repetition is a copy of what it repeats.
inline constexpr int kMaxGrammarRepeat = 1000;
// Groups and quantifiers may nest at most this deep: parsing and compiling recurse once per level.
inline constexpr int kMaxGrammarNesting = 200;

// Throws GrammarError naming the line and column (both from 1, columns in characters) of what it
// refuses, or the rule a reference names that no definition gives, or the missing root.
GrammarSyntax parse_grammar(std::string_view text);

}  // namespace pipeline
