// A thread pool that starts a thread only when a task finds none idle, up to a limit; past the
// limit tasks wait in arrival order. The HTTP server's connection threads are one per request
// the engine may hold (hundreds or thousands), of which an idle server needs none: a pool that
// started them all at once would keep that many threads (and their stacks) for nothing.
// Threads that were started stay until shutdown, so a burst pays for its threads once.
//
// A task that waits may be waiting on tasks that hold their thread doing nothing (an HTTP
// connection kept alive between requests, say). Whoever can end those gives `relieve`: while
// any task waits with every thread taken, it is called on a thread of its own, at once and then
// every `relieve_every`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pipeline {

class OnDemandThreadPool {
 public:
  explicit OnDemandThreadPool(
      size_t max_threads, std::function<void()> relieve = {},
      std::chrono::milliseconds relieve_every = std::chrono::milliseconds(100));
  ~OnDemandThreadPool();  // shutdown()
  OnDemandThreadPool(const OnDemandThreadPool&) = delete;
  OnDemandThreadPool& operator=(const OnDemandThreadPool&) = delete;

  // Runs task on an idle thread, or on a new one while fewer than max_threads run; otherwise
  // queues it for the first thread that frees up. When the system has no thread to give and
  // none was started yet, runs it on the caller.
  void enqueue(std::function<void()> task);
  // Runs what is queued, then joins every thread. Later calls do nothing.
  void shutdown();
  size_t threads_started() const;
  size_t threads_idle() const;  // started and waiting for a task

 private:
  void work();
  void relieve_backlog();
  bool backlogged() const { return tasks_.size() > idle_; }  // under mutex_

  const size_t max_threads_;
  const std::function<void()> relieve_;
  const std::chrono::milliseconds relieve_every_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable backlog_;  // wakes the relieving thread
  std::thread relieving_;            // started at the first backlog
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;  // threads waiting for a task
  bool stopping_ = false;
};

}  // namespace pipeline
