#include "apps/stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <utility>

namespace pipeline {

namespace {

sigset_t stop_signal_set() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // The terminal that started a long batch or a server closing asks for the same stop: by default
  // it would end the process with requests in flight.
  sigaddset(&signals, SIGHUP);
  return signals;
}

// Waits for a stop signal and returns its number, or returns 0 once `done` turns true.
int wait_for_stop_signal(const std::atomic<bool>& done) {
  const sigset_t signals = stop_signal_set();
  const timespec poll{0, 200'000'000};
  while (!done.load()) {
    const int signal_number = sigtimedwait(&signals, nullptr, &poll);
    if (signal_number > 0) return signal_number;
  }
  return 0;
}

}  // namespace

void block_stop_signals() {
  const sigset_t signals = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

const char* stop_signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "SIGTERM";
  }
}

StopSignalWatcher::StopSignalWatcher(std::function<void(int)> on_first,
                                     std::function<void(int)> on_second)
    : thread_([this, on_first = std::move(on_first), on_second = std::move(on_second)] {
        if (const int first = wait_for_stop_signal(done_); first != 0) {
          on_first(first);
          if (const int second = wait_for_stop_signal(done_); second != 0) {
            on_second(second);
            if (const int third = wait_for_stop_signal(done_); third != 0) {
              std::fprintf(stderr, "pipeline: third %s: exiting now\n", stop_signal_name(third));
              std::fflush(stderr);
              std::_Exit(128 + third);
            }
          }
        }
      }) {}

StopSignalWatcher::~StopSignalWatcher() {
  done_.store(true);
  thread_.join();
}

}  // namespace pipeline
