// Recognises, a byte at a time, the beginnings of one JSON text (RFC 8259): its syntax, which
// SchemaPrefix holds to a schema. JSON mode asks it of every token the sampler considers, so it
// holds no heap memory: a copy is a few bytes, and trying a token's bytes on a copy leaves the
// original as it was.
#pragma once

#include <cstdint>
#include <string_view>

namespace pipeline {

class JsonPrefix {
 public:
  // Containers nest at most this deep (the open ones are kept as bits of one word).
  static constexpr int kMaxDepth = 64;
  // No whitespace comes before the value or after it; between tokens, whitespace is one space,
  // or a newline and at most this many spaces or tabs (as llama.cpp's JSON grammar has it). A
  // model left free to write whitespace tends to write nothing else until max_tokens, the
  // failure JSON modes are known for; this still fits the indentation of a pretty-printed
  // object.
  static constexpr int kMaxIndent = 20;

  // Whether `byte` continues a prefix of a JSON text; on false this state is no longer
  // meaningful (try bytes on a copy).
  bool feed(uint8_t byte);
  bool feed(std::string_view bytes) {
    for (char c : bytes)
      if (!feed(uint8_t(c))) return false;
    return true;
  }
  // The text is a whole value: nothing more may follow, except digits after a number that is
  // the whole text.
  bool complete() const { return mode_ == Mode::Done || (depth_ == 0 && number_may_end()); }

  // Where the last byte left the text, for SchemaPrefix to follow its values.
  // Containers open.
  int depth() const { return depth_; }
  // Inside a string, its quotes included; in_key(): one that is an object's key.
  bool in_string() const { return mode_ >= Mode::String && mode_ <= Mode::Utf8; }
  bool in_key() const { return key_ && in_string(); }
  // Inside a string, between two characters (no escape or UTF-8 sequence begun).
  bool between_characters() const { return mode_ == Mode::String; }
  // Inside a number. A number ends at the byte after it, so that byte leaves this false.
  bool in_number() const { return mode_ >= Mode::Minus && mode_ <= Mode::Exponent; }
  // Inside true, false or null.
  bool in_literal() const { return mode_ == Mode::Literal; }

 private:
  // in_string() and in_number() read ranges of this order.
  enum class Mode : uint8_t {
    Start,         // before the value
    ObjectFirst,   // after '{': a key or '}'
    ObjectKey,     // after ',' in an object: a key
    Colon,         // after a key
    Value,         // after ':', or ',' in an array
    ArrayFirst,    // after '[': a value or ']'
    AfterValue,    // after a value in a container: ',' or the container's closing bracket
    String,        // inside a string (key_ says which kind)
    Escape,        // after a backslash
    UnicodeHex,    // \u: pending_ hex digits to go (code_ says what they may spell)
    LowBackslash,  // after a high surrogate's \uD800..\uDBFF: its low surrogate's backslash
    LowU,          // ... and its u
    Utf8,          // pending_ continuation bytes to go, the next within [utf8_low_, utf8_high_]
    Minus,         // a number's '-'
    Zero,          // a number's leading 0
    Integer,       // a number's integer digits after the first (non-zero) one
    Point,         // a number's '.'
    Fraction,      // a number's fraction digits
    ExponentMark,  // a number's 'e' or 'E'
    ExponentSign,  // a number's exponent sign
    Exponent,      // a number's exponent digits
    Literal,       // true, false or null: literal_[pending_] is the next byte
    Done,          // the value has ended
  };

  bool structural(uint8_t byte);  // the modes between tokens: whitespace, brackets, separators
  bool whitespace(uint8_t byte);
  bool value_start(uint8_t byte);
  bool string_byte(uint8_t byte);
  bool unicode_digit(uint8_t byte);
  bool number_byte(uint8_t byte);
  bool end_number(uint8_t byte);  // `byte` cannot extend the number: it ends it
  bool number_may_end() const {
    return mode_ == Mode::Zero || mode_ == Mode::Integer || mode_ == Mode::Fraction ||
           mode_ == Mode::Exponent;
  }
  bool open(bool array);
  bool close(bool array);
  void end_value() { mode_ = depth_ == 0 ? Mode::Done : Mode::AfterValue; }
  bool in_array() const { return (open_arrays_ >> (depth_ - 1)) & 1; }

  Mode mode_ = Mode::Start;
  bool key_ = false;   // the string being read is an object key
  uint8_t depth_ = 0;  // containers open
  // The whitespace run so far: none (0), a space (kAfterSpace), or a newline and n - 1
  // spaces or tabs (n).
  static constexpr uint8_t kAfterSpace = 0xFF;
  uint8_t whitespace_ = 0;
  uint8_t pending_ = 0;  // UnicodeHex, Utf8, Literal: see Mode
  // UnicodeHex: what the \u escape spells, as far as its digits tell: a code point that pairs
  // with nothing, one starting with D (a surrogate if its second digit is 8..F), a high
  // surrogate (D8..DB: a low one must follow), or the low surrogate a high one asks for.
  enum class Code : uint8_t { Plain, StartsWithD, High, Low } code_ = Code::Plain;
  uint8_t utf8_low_ = 0;      // Utf8: the next byte's range (the first continuation byte of a
  uint8_t utf8_high_ = 0;     // three- or four-byte character has a narrower one)
  const char* literal_ = "";  // Literal: "true", "false" or "null"
  uint64_t open_arrays_ = 0;  // bit d: the container at depth d + 1 is an array
};

}  // namespace pipeline
