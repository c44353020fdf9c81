#include "io/stop_strings.h"

#include <algorithm>
#include <stdexcept>

#include "io/utf8.h"

namespace pipeline {
namespace {

// Moves a cut position back to the start of the UTF-8 character it falls in, so a cut never
// splits a character even for a stop string that begins mid-character.
size_t character_boundary(std::string_view text, size_t cut) {
  while (cut > 0 && cut < text.size() && is_continuation_byte(text[cut])) --cut;
  return cut;
}

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool keep_stop)
    : stops_(std::move(stops)), keep_stop_(keep_stop) {
  for (size_t i = 0; i < stops_.size(); ++i)
    if (stops_[i].empty())
      throw std::invalid_argument("stop[" + std::to_string(i) + "] is an empty string");
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {"", true};
  held_ += text;

  // The earliest occurrence of any stop string that ends past the unmatched bytes ends the text.
  // Of stops that begin at the same place, the shortest: it is the one a stream split anywhere
  // matches first.
  size_t stop_at = std::string::npos;
  size_t stop_end = 0;
  const std::string* matched = nullptr;
  for (const std::string& stop : stops_) {
    const size_t from = unmatched_ >= stop.size() ? unmatched_ - stop.size() + 1 : 0;
    const size_t at = held_.find(stop, from);
    if (at == std::string::npos) continue;
    if (at < stop_at || (at == stop_at && at + stop.size() < stop_end)) {
      stop_at = at;
      stop_end = at + stop.size();
      matched = &stop;
    }
  }
  if (matched) {
    stopped_ = true;
    Result result{held_.substr(0, keep_stop_ ? stop_end : character_boundary(held_, stop_at)), true,
                  *matched};
    held_.clear();
    return result;
  }
  return {release(), false};
}

std::string StopStringMatcher::push_unmatched(std::string_view text) {
  if (stopped_) return "";
  held_ += text;
  unmatched_ = held_.size();
  return release();
}

std::string StopStringMatcher::release() {
  const size_t send = character_boundary(held_, held_.size() - partial_stop_length(held_));
  std::string text = held_.substr(0, send);
  held_.erase(0, send);
  unmatched_ -= std::min(unmatched_, send);
  return text;
}

std::string StopStringMatcher::flush() {
  std::string text = std::move(held_);
  held_.clear();  // empty after a stop: the text beyond a stop string is dropped
  return text;
}

size_t StopStringMatcher::partial_stop_length(std::string_view text) const {
  size_t longest = 0;
  for (const std::string& stop : stops_) {
    // A whole stop would have matched already, so only proper prefixes are candidates.
    for (size_t length = std::min(stop.size() - 1, text.size()); length > longest; --length) {
      if (text.ends_with(std::string_view(stop).substr(0, length))) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

}  // namespace pipeline
