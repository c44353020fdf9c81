// Durations in seconds on the steady clock, as metrics, logs and progress lines report them.
#pragma once

#include <chrono>

namespace pipeline {

inline double seconds_between(std::chrono::steady_clock::time_point start,
                              std::chrono::steady_clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return seconds_between(start, std::chrono::steady_clock::now());
}

}  // namespace pipeline
