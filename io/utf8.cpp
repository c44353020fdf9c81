#include "io/utf8.h"

namespace pipeline {

Utf8Status leading_character(std::string_view bytes, size_t& length) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(0);
  // The range of the second byte depends on the lead; later bytes are 0x80..0xBF.
  unsigned char second_low = 0x80, second_high = 0xBF;
  if (lead < 0x80) {
    length = 1;
    return Utf8Status::Complete;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;
  } else {
    return Utf8Status::Invalid;
  }
  for (size_t i = 1; i < length && i < bytes.size(); ++i) {
    const unsigned char low = i == 1 ? second_low : 0x80;
    const unsigned char high = i == 1 ? second_high : 0xBF;
    if (byte(i) < low || byte(i) > high) return Utf8Status::Invalid;
  }
  return bytes.size() < length ? Utf8Status::Incomplete : Utf8Status::Complete;
}

std::string replacing_invalid_utf8(std::string_view bytes) {
  std::string text;
  while (!bytes.empty()) {
    size_t length = 0;
    if (leading_character(bytes, length) == Utf8Status::Complete) {
      text += bytes.substr(0, length);
      bytes.remove_prefix(length);
    } else {
      text += kReplacementCharacter;
      bytes.remove_prefix(1);
    }
  }
  return text;
}

size_t CharacterOffsets::add(std::string_view piece) {
  if (piece.empty() && !unfinished_.empty()) {
    // A piece of no text (a control token) ends a run of byte pieces: the unfinished
    // character's bytes after the first are a U+FFFD each, as is the first.
    count_ += unfinished_.size() - 1;
    unfinished_.clear();
    return count_;
  }
  const std::string bytes = unfinished_ + std::string(piece);
  size_t at = 0;  // the first byte not counted yet
  if (!unfinished_.empty()) {
    size_t length = 0;
    switch (leading_character(bytes, length)) {
      case Utf8Status::Complete:
        at = length;
        break;
      case Utf8Status::Incomplete:
        unfinished_ = bytes;
        return count_;
      case Utf8Status::Invalid:
        // Never finished: its bytes after the first are a U+FFFD each, as is the first.
        count_ += unfinished_.size() - 1;
        at = unfinished_.size();
        break;
    }
    unfinished_.clear();
  }
  const size_t start = count_;
  while (at < bytes.size()) {
    size_t length = 0;
    const Utf8Status status = leading_character(std::string_view(bytes).substr(at), length);
    ++count_;
    if (status == Utf8Status::Incomplete) {
      unfinished_ = bytes.substr(at);
      break;
    }
    at += status == Utf8Status::Complete ? length : 1;
  }
  return start;
}

}  // namespace pipeline
