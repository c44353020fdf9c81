// Waiting in a test for what another thread brings about, with a bound, so that a hang fails the
// test instead of stopping it.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace pipeline::testing {

// Whether `condition` holds within 5 s, asked every millisecond.
inline bool eventually(const std::function<bool()>& condition) {
  using namespace std::chrono_literals;
  for (const auto until = std::chrono::steady_clock::now() + 5s; !condition();) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace pipeline::testing
