#include "server/on_demand_thread_pool.h"

#include <stdexcept>
#include <system_error>
#include <utility>

namespace pipeline {

OnDemandThreadPool::OnDemandThreadPool(size_t max_threads, std::function<void()> relieve,
                                       std::chrono::milliseconds relieve_every)
    : max_threads_(max_threads), relieve_(std::move(relieve)), relieve_every_(relieve_every) {
  if (max_threads == 0) throw std::invalid_argument("OnDemandThreadPool needs at least 1 thread");
}

OnDemandThreadPool::~OnDemandThreadPool() {
  shutdown();
}

void OnDemandThreadPool::enqueue(std::function<void()> task) {
  std::unique_lock lock(mutex_);
  if (stopping_) throw std::logic_error("OnDemandThreadPool::enqueue after shutdown");
  tasks_.push_back(std::move(task));
  // A woken thread leaves idle_ only once it runs, so tasks beyond the idle threads are the
  // ones no thread will take yet.
  if (tasks_.size() > idle_ && threads_.size() < max_threads_) {
    try {
      threads_.emplace_back([this] { work(); });
    } catch (const std::system_error&) {
      // Out of threads: the task waits for a running one; with none, it runs here, since a
      // caller such as httplib's accept loop has no way to refuse it.
      if (threads_.empty()) {
        std::function<void()> own = std::move(tasks_.back());
        tasks_.pop_back();
        lock.unlock();
        own();
      }
    }
    return;
  }
  if (relieve_ && backlogged()) {
    // Best effort: without a thread of its own the backlog waits for a task to end, as before.
    if (!relieving_.joinable()) {
      try {
        relieving_ = std::thread([this] { relieve_backlog(); });
      } catch (const std::system_error&) {
      }
    }
    backlog_.notify_one();
  }
  lock.unlock();
  wake_.notify_one();
}

void OnDemandThreadPool::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    threads.swap(threads_);
  }
  wake_.notify_all();
  backlog_.notify_all();
  for (std::thread& thread : threads) thread.join();
  if (relieving_.joinable()) relieving_.join();
}

size_t OnDemandThreadPool::threads_started() const {
  std::lock_guard lock(mutex_);
  return threads_.size();
}

size_t OnDemandThreadPool::threads_idle() const {
  std::lock_guard lock(mutex_);
  return idle_;
}

void OnDemandThreadPool::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    wake_.wait(lock, [this] { return !tasks_.empty() || stopping_; });
    --idle_;
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

void OnDemandThreadPool::relieve_backlog() {
  std::unique_lock lock(mutex_);
  for (;;) {
    backlog_.wait(lock, [this] { return stopping_ || backlogged(); });
    if (stopping_) return;
    lock.unlock();
    relieve_();
    lock.lock();
    backlog_.wait_for(lock, relieve_every_, [this] { return stopping_; });
  }
}

}  // namespace pipeline
