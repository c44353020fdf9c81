// ThreadSanitizer builds only: makes oneTBB's hand-offs between threads visible to TSan.
//
// Debian's libtbb.so is not built with -fsanitize=thread, so TSan cannot see the synchronisation
// inside it: that a task spawned (or enqueued, or submitted by a flow graph) on one thread
// happens before it runs on another, that a wait returns after the tasks it waits for, and that
// a small object pool hands memory freed by one thread to another. Without these edges every
// parallel_for and every flow-graph message is reported as a race.
//
// This file defines the few libtbb entry points that the oneTBB headers call for those
// hand-offs (an executable's definition takes precedence over the shared library's) and adds
// the missing edge around the real call, found with dlsym(RTLD_NEXT):
//   - spawn, enqueue, submit, execute_and_wait: the task is wrapped in HandedOverTask, released
//     by the handing thread and acquired by whichever thread runs it;
//   - wait, execute_and_wait: the waiter acquires the wait_context, which every finished task
//     released with its (instrumented, header-inlined) atomic decrement;
//   - task_arena::execute: the delegate is wrapped the same way, both directions;
//   - small object pool: deallocate releases the block, allocate acquires it.
// Each edge is keyed by one task, delegate, wait or block, never a global address, so work that
// TBB does not order stays unordered and TSan still reports real races between tasks.
#if defined(__SANITIZE_THREAD__)
#include <dlfcn.h>
#include <oneapi/tbb/detail/_small_object_pool.h>
#include <oneapi/tbb/detail/_task.h>
#include <oneapi/tbb/task_arena.h>
#include <sanitizer/tsan_interface.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace tbb::detail::r1 {
namespace {

// libtbb's own definition of the entry point this file stands in for.
template <typename Fn>
Fn libtbb_definition(const char* mangled_name) {
  void* f = dlsym(RTLD_NEXT, mangled_name);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_tbb_hooks: libtbb has no %s\n", mangled_name);
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

// Stands in for a task handed to the scheduler: the thread that runs it first acquires what the
// handing thread released, then runs the real task (whose execute may free it).
class HandedOverTask final : public d1::task {
 public:
  explicit HandedOverTask(d1::task& task) : task_(task) { __tsan_release(this); }
  d1::task* execute(d1::execution_data& ed) override { return run(ed, false); }
  d1::task* cancel(d1::execution_data& ed) override { return run(ed, true); }

 private:
  d1::task* run(d1::execution_data& ed, bool cancelled) {
    __tsan_acquire(this);
    d1::task& task = task_;
    delete this;
    return cancelled ? task.cancel(ed) : task.execute(ed);
  }
  d1::task& task_;
};

// The same for task_arena::execute's delegate, which may run on a thread of the arena while
// the caller waits: acquire on entry, release on exit for the caller to acquire.
class HandedOverDelegate final : public d1::delegate_base {
 public:
  explicit HandedOverDelegate(d1::delegate_base& delegate) : delegate_(delegate) {
    __tsan_release(this);
  }
  bool operator()() const override {
    __tsan_acquire(sync());
    const bool result = delegate_();
    __tsan_release(sync());
    return result;
  }
  void* sync() const { return const_cast<HandedOverDelegate*>(this); }

 private:
  d1::delegate_base& delegate_;
};

// The tasks a wait waits for release the wait_context's reference count (an atomic in the
// header, which TSan sees); libtbb's read of it is not seen, so the waiter acquires it here.
void acquire_wait_context(d1::wait_context& wait) {
  auto* bytes = reinterpret_cast<char*>(&wait);
  for (size_t at = 0; at < sizeof(d1::wait_context); at += sizeof(std::uint64_t))
    __tsan_acquire(bytes + at);
}

}  // namespace

void* allocate(d1::small_object_pool*& pool, std::size_t bytes, const d1::execution_data& ed) {
  static const auto next =
      libtbb_definition<void* (*)(d1::small_object_pool*&, std::size_t, const d1::execution_data&)>(
          "_ZN3tbb6detail2r18allocateERPNS0_2d117small_object_poolEmRKNS2_14execution_dataE");
  void* block = next(pool, bytes, ed);
  __tsan_acquire(block);
  return block;
}

void* allocate(d1::small_object_pool*& pool, std::size_t bytes) {
  static const auto next = libtbb_definition<void* (*)(d1::small_object_pool*&, std::size_t)>(
      "_ZN3tbb6detail2r18allocateERPNS0_2d117small_object_poolEm");
  void* block = next(pool, bytes);
  __tsan_acquire(block);
  return block;
}

void deallocate(d1::small_object_pool& pool, void* block, std::size_t bytes,
                const d1::execution_data& ed) {
  static const auto next = libtbb_definition<void (*)(d1::small_object_pool&, void*, std::size_t,
                                                      const d1::execution_data&)>(
      "_ZN3tbb6detail2r110deallocateERNS0_2d117small_object_poolEPvmRKNS2_14execution_dataE");
  __tsan_release(block);
  next(pool, block, bytes, ed);
}

void deallocate(d1::small_object_pool& pool, void* block, std::size_t bytes) {
  static const auto next = libtbb_definition<void (*)(d1::small_object_pool&, void*, std::size_t)>(
      "_ZN3tbb6detail2r110deallocateERNS0_2d117small_object_poolEPvm");
  __tsan_release(block);
  next(pool, block, bytes);
}

void spawn(d1::task& t, d1::task_group_context& ctx) {
  static const auto next = libtbb_definition<void (*)(d1::task&, d1::task_group_context&)>(
      "_ZN3tbb6detail2r15spawnERNS0_2d14taskERNS2_18task_group_contextE");
  next(*new HandedOverTask(t), ctx);
}

void spawn(d1::task& t, d1::task_group_context& ctx, d1::slot_id id) {
  static const auto next =
      libtbb_definition<void (*)(d1::task&, d1::task_group_context&, d1::slot_id)>(
          "_ZN3tbb6detail2r15spawnERNS0_2d14taskERNS2_18task_group_contextEt");
  next(*new HandedOverTask(t), ctx, id);
}

void execute_and_wait(d1::task& t, d1::task_group_context& t_ctx, d1::wait_context& wait,
                      d1::task_group_context& w_ctx) {
  static const auto next = libtbb_definition<void (*)(d1::task&, d1::task_group_context&,
                                                      d1::wait_context&, d1::task_group_context&)>(
      "_ZN3tbb6detail2r116execute_and_waitERNS0_2d14taskERNS2_18task_group_contextERNS2_12wait_"
      "contextES6_");
  next(*new HandedOverTask(t), t_ctx, wait, w_ctx);
  acquire_wait_context(wait);
}

void wait(d1::wait_context& wait, d1::task_group_context& ctx) {
  static const auto next = libtbb_definition<void (*)(d1::wait_context&, d1::task_group_context&)>(
      "_ZN3tbb6detail2r14waitERNS0_2d112wait_contextERNS2_18task_group_contextE");
  next(wait, ctx);
  acquire_wait_context(wait);
}

void enqueue(d1::task& t, d1::task_arena_base* arena_base) {
  static const auto next = libtbb_definition<void (*)(d1::task&, d1::task_arena_base*)>(
      "_ZN3tbb6detail2r17enqueueERNS0_2d14taskEPNS2_15task_arena_baseE");
  next(*new HandedOverTask(t), arena_base);
}

void enqueue(d1::task& t, d1::task_group_context& ctx, d1::task_arena_base* arena_base) {
  static const auto next =
      libtbb_definition<void (*)(d1::task&, d1::task_group_context&, d1::task_arena_base*)>(
          "_ZN3tbb6detail2r17enqueueERNS0_2d14taskERNS2_18task_group_contextEPNS2_15task_arena_"
          "baseE");
  next(*new HandedOverTask(t), ctx, arena_base);
}

void submit(d1::task& t, d1::task_group_context& ctx, arena* a, std::uintptr_t as_critical) {
  static const auto next =
      libtbb_definition<void (*)(d1::task&, d1::task_group_context&, arena*, std::uintptr_t)>(
          "_ZN3tbb6detail2r16submitERNS0_2d14taskERNS2_18task_group_contextEPNS1_5arenaEm");
  next(*new HandedOverTask(t), ctx, a, as_critical);
}

void execute(d1::task_arena_base& arena_base, d1::delegate_base& delegate) {
  static const auto next = libtbb_definition<void (*)(d1::task_arena_base&, d1::delegate_base&)>(
      "_ZN3tbb6detail2r17executeERNS0_2d115task_arena_baseERNS2_13delegate_baseE");
  HandedOverDelegate handed_over(delegate);
  next(arena_base, handed_over);
  __tsan_acquire(handed_over.sync());
}

}  // namespace tbb::detail::r1
#endif  // __SANITIZE_THREAD__
