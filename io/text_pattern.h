// vLLM's guided_regex and guided_choice: the texts an answer may be, as a deterministic automaton
// over its bytes. Guided decoding tries every token's bytes on it at each step it masks, so a
// step is one table lookup, and a state from which no accepted text can be reached is no state
// at all: every prefix the automaton accepts can be finished.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/regex_syntax.h"

namespace pipeline {

class TextPatternError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class TextPattern {
 public:
  // A pattern compiles to at most this many states, each a row of transitions, so a pattern
  // costs at most a few MiB; a pattern past it is refused rather than built.
  static constexpr int kMaxStates = 20000;
  // A regex's text, or its choices' texts together, may be at most this long: what is built
  // from them grows with them, so the refusal comes before any of it.
  static constexpr size_t kMaxTextBytes = 65536;

  // Throws TextPatternError (with the syntax error's position, or the limit passed) on a
  // pattern it cannot hold, or one that matches no text.
  static std::shared_ptr<const TextPattern> from_regex(std::string_view pattern);
  // Exactly one of `texts`, whole. Throws TextPatternError on no texts, texts past
  // kMaxTextBytes together, or text not UTF-8.
  static std::shared_ptr<const TextPattern> from_choices(std::span<const std::string> texts);

  static constexpr int32_t kNoState = -1;
  static constexpr int32_t kStart = 0;
  // The state after `byte` from `state`, or kNoState where no accepted text continues so.
  int32_t next(int32_t state, uint8_t byte) const {
    return transitions_[size_t(state) * size_t(classes_) + byte_class_[byte]];
  }
  // Whether the text that led to `state` is accepted whole.
  bool accepts(int32_t state) const { return accepting_[size_t(state)] != 0; }
  int states() const { return int(accepting_.size()); }

 private:
  explicit TextPattern(const RegexTree& tree);

  // Bytes no transition tells apart share a class, so a state's row has one entry per class.
  uint8_t byte_class_[256] = {};
  int classes_ = 0;
  std::vector<int32_t> transitions_;  // states × classes
  std::vector<uint8_t> accepting_;    // per state
};

// What an answer held to a TextPattern has written so far: one state, small enough to copy
// per byte tried.
class PatternPrefix {
 public:
  explicit PatternPrefix(const TextPattern& pattern) : pattern_(&pattern) {}

  // Whether `byte` continues a prefix of an accepted text; on false this state is no longer
  // meaningful (try bytes on a copy).
  bool feed(uint8_t byte) {
    state_ = pattern_->next(state_, byte);
    return state_ != TextPattern::kNoState;
  }
  bool feed(std::string_view bytes) {
    for (char c : bytes)
      if (!feed(uint8_t(c))) return false;
    return true;
  }
  // The text written is accepted whole.
  bool complete() const { return pattern_->accepts(state_); }

 private:
  const TextPattern* pattern_;
  int32_t state_ = TextPattern::kStart;
};

}  // namespace pipeline
