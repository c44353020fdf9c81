// OnDemandThreadPool starts threads only as tasks need them, up to its limit, and runs every
// task it accepted.
#include "server/on_demand_thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace pipeline {
namespace {

using namespace std::chrono_literals;

// Tasks block on a gate until it opens; the test can wait until some number of them run.
class Gate {
 public:
  void pass() {
    std::unique_lock lock(mutex_);
    ++running_;
    max_running_ = std::max(max_running_, running_);
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    --running_;
    ++done_;
    changed_.notify_all();
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  bool wait_running(int n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 10s, [&] { return running_ >= n; });
  }
  bool wait_done(int n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 10s, [&] { return done_ >= n; });
  }
  int max_running() {
    std::lock_guard lock(mutex_);
    return max_running_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
  int running_ = 0, max_running_ = 0, done_ = 0;
};

// `tasks` tasks that block until the gate opens: as many run at once as the limit allows, each
// on a thread of its own, the rest wait, and all of them finish.
void expect_runs_at_once(size_t limit, int tasks) {
  OnDemandThreadPool pool(limit);
  Gate gate;
  for (int i = 0; i < tasks; ++i) pool.enqueue([&gate] { gate.pass(); });
  const int together = std::min(int(limit), tasks);
  EXPECT_TRUE(gate.wait_running(together)) << "a task waited although the limit allowed a thread";
  std::this_thread::sleep_for(20ms);  // time for a task too many to start
  EXPECT_EQ(gate.max_running(), together);
  EXPECT_EQ(pool.threads_started(), size_t(together));
  gate.open();
  EXPECT_TRUE(gate.wait_done(tasks));
}

TEST(OnDemandThreadPool, StartsNoThreadBeforeATask) {
  OnDemandThreadPool pool(64);
  EXPECT_EQ(pool.threads_started(), 0u);
}

TEST(OnDemandThreadPool, RunsAsManyTasksAtOnceAsArriveTogether) {
  expect_runs_at_once(64, 12);
}

TEST(OnDemandThreadPool, ReusesAnIdleThread) {
  OnDemandThreadPool pool(64);
  std::atomic<int> ran{0};
  for (int i = 1; i <= 5; ++i) {
    pool.enqueue([&] { ++ran; });
    // Until the task ran and its thread waits for the next one.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((ran < i || pool.threads_idle() != 1) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    ASSERT_EQ(ran.load(), i);
    ASSERT_EQ(pool.threads_idle(), 1u);
  }
  EXPECT_EQ(pool.threads_started(), 1u);
}

TEST(OnDemandThreadPool, TasksBeyondTheLimitWaitAndAllRun) {
  expect_runs_at_once(3, 10);
}

TEST(OnDemandThreadPool, ShutdownRunsWhatIsQueuedFirst) {
  std::atomic<int> ran{0};
  {
    OnDemandThreadPool pool(1);
    for (int i = 0; i < 20; ++i)
      pool.enqueue([&] {
        std::this_thread::sleep_for(1ms);
        ++ran;
      });
    pool.shutdown();
    EXPECT_EQ(ran.load(), 20);
    EXPECT_THROW(pool.enqueue([] {}), std::logic_error);
  }
  EXPECT_EQ(ran.load(), 20);
}

// A task that finds every thread taken gets `relieve` called, again and again, until a thread
// is free: the pool's owner ends what holds them (here, the third call opens the gate). Tasks
// that find a thread call nothing.
TEST(OnDemandThreadPool, WhileATaskWaitsForAThreadReliefIsCalled) {
  Gate gate;
  std::atomic<int> reliefs{0};
  std::atomic<bool> waited_task_ran{false};
  OnDemandThreadPool pool(
      2,
      [&] {
        if (++reliefs == 3) gate.open();
      },
      5ms);
  pool.enqueue([&] { gate.pass(); });
  pool.enqueue([&] { gate.pass(); });
  ASSERT_TRUE(gate.wait_running(2));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(reliefs.load(), 0) << "relief was called with no task waiting";
  pool.enqueue([&] { waited_task_ran = true; });
  ASSERT_TRUE(gate.wait_done(2)) << "relief was not called until the gate opened";
  pool.shutdown();
  EXPECT_TRUE(waited_task_ran.load());
  EXPECT_GE(reliefs.load(), 3);
}

}  // namespace
}  // namespace pipeline
