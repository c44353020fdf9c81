// Stop strings matched across token boundaries. Text that could still turn into a stop
// string is held back, so a stop string is never sent, not even in part.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

class StopStringMatcher {
 public:
  // Throws std::invalid_argument on an empty stop string. No stops: text passes straight on.
  // `keep_stop` (vLLM's include_stop_str_in_output): the text sent ends with the stop string
  // that matched, not before it.
  explicit StopStringMatcher(std::vector<std::string> stops, bool keep_stop = false);

  struct Result {
    std::string text;       // safe to send now
    bool stopped = false;   // a stop string matched; `text` ends just before it (or with it)
    std::string stop = {};  // the stop string that matched, in the push that matched it
  };

  // After a stop has matched, every push returns no text and stopped = true.
  Result push(std::string_view text);
  // Text no stop string may end in (vLLM's min_tokens: the first tokens' text), though one may
  // begin there and end in a later push. Its end is held back as push() holds it back.
  std::string push_unmatched(std::string_view text);
  // At the end of generation (no stop matched): the held-back text.
  std::string flush();

 private:
  // The length of the longest suffix of `text` that begins some stop string.
  size_t partial_stop_length(std::string_view text) const;

  // Moves the front of held_ that can no longer begin a stop string to `out`.
  std::string release();

  std::vector<std::string> stops_;
  bool keep_stop_;
  std::string held_;
  size_t unmatched_ = 0;  // held_'s first bytes, from push_unmatched: no stop may end in them
  bool stopped_ = false;
};

}  // namespace pipeline
