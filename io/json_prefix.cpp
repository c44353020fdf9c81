#include "io/json_prefix.h"

namespace pipeline {

namespace {

bool is_whitespace(uint8_t byte) {
  return byte == ' ' || byte == '\t' || byte == '\n' || byte == '\r';
}
bool is_digit(uint8_t byte) {
  return byte >= '0' && byte <= '9';
}
bool is_hex(uint8_t byte) {
  return is_digit(byte) || (byte >= 'a' && byte <= 'f') || (byte >= 'A' && byte <= 'F');
}

}  // namespace

bool JsonPrefix::feed(uint8_t byte) {
  switch (mode_) {
    case Mode::String:
      return string_byte(byte);
    case Mode::Escape:
      if (byte == 'u') {
        mode_ = Mode::UnicodeHex;
        pending_ = 4;
        code_ = Code::Plain;
        return true;
      }
      mode_ = Mode::String;
      return byte == '"' || byte == '\\' || byte == '/' || byte == 'b' || byte == 'f' ||
             byte == 'n' || byte == 'r' || byte == 't';
    case Mode::UnicodeHex:
      return unicode_digit(byte);
    case Mode::LowBackslash:
      mode_ = Mode::LowU;
      return byte == '\\';
    case Mode::LowU:
      mode_ = Mode::UnicodeHex;
      pending_ = 4;
      code_ = Code::Low;
      return byte == 'u';
    case Mode::Utf8:
      if (byte < utf8_low_ || byte > utf8_high_) return false;
      utf8_low_ = 0x80;
      utf8_high_ = 0xBF;
      if (--pending_ == 0) mode_ = Mode::String;
      return true;
    case Mode::Literal:
      if (byte != uint8_t(literal_[pending_])) return false;
      if (literal_[++pending_] == '\0') end_value();
      return true;
    case Mode::Minus:
    case Mode::Zero:
    case Mode::Integer:
    case Mode::Point:
    case Mode::Fraction:
    case Mode::ExponentMark:
    case Mode::ExponentSign:
    case Mode::Exponent:
      return number_byte(byte);
    case Mode::Done:
      return false;
    default:
      return structural(byte);
  }
}

bool JsonPrefix::structural(uint8_t byte) {
  // The text begins with its value, as llama.cpp's JSON grammar has it: a client parsing the
  // answer as it streams (the openai SDKs' stream helpers) fails on a first delta of whitespace.
  if (is_whitespace(byte)) return mode_ != Mode::Start && whitespace(byte);
  whitespace_ = 0;
  switch (mode_) {
    case Mode::ObjectFirst:
      if (byte == '}') return close(false);
      [[fallthrough]];
    case Mode::ObjectKey:
      if (byte != '"') return false;
      mode_ = Mode::String;
      key_ = true;
      return true;
    case Mode::Colon:
      if (byte != ':') return false;
      mode_ = Mode::Value;
      return true;
    case Mode::ArrayFirst:
      if (byte == ']') return close(true);
      [[fallthrough]];
    case Mode::Start:
    case Mode::Value:
      return value_start(byte);
    case Mode::AfterValue:
      if (byte == ',') {
        mode_ = in_array() ? Mode::Value : Mode::ObjectKey;
        return true;
      }
      if (byte == ']' || byte == '}') return close(byte == ']');
      return false;
    default:
      return false;
  }
}

bool JsonPrefix::whitespace(uint8_t byte) {
  if (whitespace_ == 0) {
    whitespace_ = byte == '\n' ? 1 : kAfterSpace;
    return byte == '\n' || byte == ' ';
  }
  if (whitespace_ == kAfterSpace || byte == '\n' || byte == '\r') return false;
  return ++whitespace_ <= 1 + kMaxIndent;
}

bool JsonPrefix::value_start(uint8_t byte) {
  switch (byte) {
    case '{':
      return open(false);
    case '[':
      return open(true);
    case '"':
      mode_ = Mode::String;
      key_ = false;
      return true;
    case '-':
      mode_ = Mode::Minus;
      return true;
    case '0':
      mode_ = Mode::Zero;
      return true;
    case 't':
      literal_ = "true";
      break;
    case 'f':
      literal_ = "false";
      break;
    case 'n':
      literal_ = "null";
      break;
    default:
      if (byte < '1' || byte > '9') return false;
      mode_ = Mode::Integer;
      return true;
  }
  mode_ = Mode::Literal;
  pending_ = 1;  // the first letter is this byte
  return true;
}

// Inside a string: any character but controls, as well-formed UTF-8 (no overlong forms, no
// surrogates, nothing past U+10FFFF), with backslash escapes.
bool JsonPrefix::string_byte(uint8_t byte) {
  if (byte == '"') {
    if (key_) {
      mode_ = Mode::Colon;
    } else {
      end_value();
    }
    return true;
  }
  if (byte == '\\') {
    mode_ = Mode::Escape;
    return true;
  }
  if (byte < 0x20) return false;
  if (byte < 0x80) return true;
  utf8_low_ = 0x80;
  utf8_high_ = 0xBF;
  if (byte >= 0xC2 && byte <= 0xDF) {
    pending_ = 1;
  } else if (byte >= 0xE0 && byte <= 0xEF) {
    pending_ = 2;
    if (byte == 0xE0) utf8_low_ = 0xA0;   // overlong below U+0800
    if (byte == 0xED) utf8_high_ = 0x9F;  // surrogates U+D800..U+DFFF
  } else if (byte >= 0xF0 && byte <= 0xF4) {
    pending_ = 3;
    if (byte == 0xF0) utf8_low_ = 0x90;   // overlong below U+10000
    if (byte == 0xF4) utf8_high_ = 0x8F;  // beyond U+10FFFF
  } else {
    return false;  // a continuation byte, C0/C1 (overlong) or F5..FF
  }
  mode_ = Mode::Utf8;
  return true;
}

// A \u escape's digit. Surrogates come in pairs (a high one, D800..DBFF, then a low one,
// DC00..DFFF), as strict parsers require; the first two digits tell which a code is, so a
// prefix accepted here can always be finished.
bool JsonPrefix::unicode_digit(uint8_t byte) {
  if (!is_hex(byte)) return false;
  const bool d = byte == 'd' || byte == 'D';
  const int position = 4 - pending_;  // 0 for the first digit
  if (position == 0) {
    if (code_ == Code::Low && !d) return false;
    if (code_ == Code::Plain && d) code_ = Code::StartsWithD;
  } else if (position == 1 && code_ != Code::Plain) {
    const bool high = (byte >= '8' && byte <= '9') || (byte >= 'a' && byte <= 'b') ||
                      (byte >= 'A' && byte <= 'B');
    const bool low = (byte >= 'c' && byte <= 'f') || (byte >= 'C' && byte <= 'F');
    if (code_ == Code::Low) {
      if (!low) return false;
    } else if (low) {
      return false;  // a low surrogate with no high one before it
    } else if (high) {
      code_ = Code::High;
    } else {
      code_ = Code::Plain;
    }
  }
  if (--pending_ == 0) mode_ = code_ == Code::High ? Mode::LowBackslash : Mode::String;
  return true;
}

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? followed by what may follow a value. A byte
// that cannot extend a number ends it; nothing follows a number that is the whole text.
bool JsonPrefix::number_byte(uint8_t byte) {
  switch (mode_) {
    case Mode::Minus:
      if (!is_digit(byte)) return false;
      mode_ = byte == '0' ? Mode::Zero : Mode::Integer;
      return true;
    case Mode::Zero:
    case Mode::Integer:
      if (is_digit(byte) && mode_ == Mode::Integer) return true;
      if (byte == '.') {
        mode_ = Mode::Point;
        return true;
      }
      break;
    case Mode::Point:
      if (!is_digit(byte)) return false;
      mode_ = Mode::Fraction;
      return true;
    case Mode::Fraction:
      if (is_digit(byte)) return true;
      break;
    case Mode::ExponentMark:
      if (byte == '+' || byte == '-') {
        mode_ = Mode::ExponentSign;
        return true;
      }
      [[fallthrough]];
    case Mode::ExponentSign:
      if (!is_digit(byte)) return false;
      mode_ = Mode::Exponent;
      return true;
    case Mode::Exponent:
      if (is_digit(byte)) return true;
      return end_number(byte);
    default:
      return false;
  }
  // After the integer or fraction part: an exponent, or the end of the number.
  if (byte == 'e' || byte == 'E') {
    mode_ = Mode::ExponentMark;
    return true;
  }
  return end_number(byte);
}

bool JsonPrefix::end_number(uint8_t byte) {
  end_value();
  return mode_ != Mode::Done && structural(byte);
}

bool JsonPrefix::open(bool array) {
  if (depth_ == kMaxDepth) return false;
  const uint64_t bit = uint64_t(1) << depth_;
  open_arrays_ = array ? open_arrays_ | bit : open_arrays_ & ~bit;
  ++depth_;
  mode_ = array ? Mode::ArrayFirst : Mode::ObjectFirst;
  return true;
}

bool JsonPrefix::close(bool array) {
  if (depth_ == 0 || in_array() != array) return false;
  --depth_;
  end_value();
  return true;
}

}  // namespace pipeline
