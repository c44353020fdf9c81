// What an answer held to a Grammar has written so far: the parses of it that can still go on,
// each a stack of nodes (the calls open, each frame where its caller goes on; on top the
// character the parse takes next), and the bytes of a character begun. Characters are code
// points and the answer is fed bytes: a character's first bytes keep only the parses whose next
// character can begin so, and a byte that makes no UTF-8 is refused.
//
// Guided decoding copies a state per byte it tries, for every token, so the state is one flat
// vector (a parse that calls a rule last hands its frame over rather than keep one, so
// right-recursive and repeated rules do not grow it), parses are kept each once, the work space
// for following a character belongs to the thread rather than to each copy, and each thread
// remembers what its recent steps made of a state (the mask meets the same few states again and
// again, for every token that begins alike).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "io/grammar.h"

namespace pipeline {

class GrammarPrefix {
 public:
  // Parses followed at once at most. Past it (a grammar ambiguous enough to keep this many ways
  // of reading one text apart) feed() throws GrammarError rather than let the state grow.
  static constexpr size_t kMaxParses = 64;
  // Nodes visited in following one character at most, the same way: a grammar whose choices
  // nest many ways of writing nothing could otherwise take exponential time on one byte.
  static constexpr size_t kMaxSteps = 100000;

  // The state before any text. Throws GrammarError where the grammar's start passes the limits.
  explicit GrammarPrefix(const Grammar& grammar);

  // Whether `byte` continues a prefix of a text the grammar derives; on false this state is no
  // longer meaningful (try bytes on a copy). Throws GrammarError past kMaxParses or kMaxSteps.
  bool feed(uint8_t byte);
  bool feed(std::string_view bytes) {
    for (char c : bytes)
      if (!feed(uint8_t(c))) return false;
    return true;
  }
  // The text written is one the grammar derives, whole.
  bool complete() const { return remaining_ == 0 && complete_; }

 private:
  bool take(uint32_t code);
  void follow(uint32_t code);
  bool narrow();

  const Grammar* grammar_;
  // The parses one after another, each its frame count n then n nodes, the bottom first and the
  // top (a Char node) last; a parse with n = 0 has written all of root's text.
  std::vector<uint32_t> parses_;
  uint64_t hash_ = 0;      // of parses_, kept so that a step the thread remembers costs no pass
  uint32_t code_ = 0;      // the bits of the character begun
  uint8_t length_ = 0;     // its UTF-8 length
  uint8_t remaining_ = 0;  // the bytes it still needs
  bool complete_ = false;  // a parse has n = 0
};

}  // namespace pipeline
