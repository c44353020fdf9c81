#include "graph/log.h"

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace pipeline {

void log_line(const char* format, ...) {
  const auto now = std::chrono::system_clock::now();
  const auto t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  // One fprintf per line keeps lines from different threads whole.
  std::fprintf(stderr, "[%02d:%02d:%02d.%03d] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, int(ms),
               message);
}

}  // namespace pipeline
