// SIGINT, SIGTERM and SIGHUP for the commands that stop gracefully (`pipeline run`, `pipeline
// batch`): the first asks them to finish what is in flight, a second to fail it at once. The
// signals are blocked in every thread and taken by one thread that waits for them, so what they set
// off may lock and allocate, as no signal handler could.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace pipeline {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and every thread it starts afterwards:
// call before any thread starts.
void block_stop_signals();

// "SIGINT", "SIGTERM" or "SIGHUP".
const char* stop_signal_name(int signal_number);

// Waits for stop signals on a thread of its own while it lives (it checks five times a second
// whether it should stop): on_first runs at the first, with its number, on_second at a second,
// and a third ends the process at once (status 128 + its number), for whatever still holds it. The
// thread starts with the watcher, not at the signal: by then a loaded server may have no thread
// left to start. block_stop_signals() must have run.
class StopSignalWatcher {
 public:
  StopSignalWatcher(std::function<void(int)> on_first, std::function<void(int)> on_second);
  // Stops watching; waits for a callback that is running.
  ~StopSignalWatcher();
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace pipeline
