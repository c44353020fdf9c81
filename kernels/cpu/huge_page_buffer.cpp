#include "kernels/cpu/huge_page_buffer.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>

namespace pipeline::cpu {
namespace {

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

size_t page_size() {
  return size_t(sysconf(_SC_PAGESIZE));
}

}  // namespace

void HugePageFree::operator()(std::byte* p) const {
  munmap(p, round_up(bytes, page_size()));
}

size_t whole_huge_pages(size_t bytes) {
  return round_up(bytes, kHugePageBytes);
}

HugePageBuffer allocate_huge_page_buffer(size_t bytes) {
  if (bytes == 0) return HugePageBuffer(nullptr, HugePageFree{0});
  const size_t length = round_up(bytes, page_size());
  // Over-allocate by one huge page and trim both ends, so the start is 2 MiB aligned; the tail
  // past the last whole huge page stays on small pages, so nothing is wasted.
  void* raw = mmap(nullptr, length + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePageBytes);
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = start + length + kHugePageBytes - (aligned + length);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + length), tail);
  auto* p = reinterpret_cast<std::byte*>(aligned);
  // Advice only: a kernel without THP (or with it set to "never") refuses, and that is fine.
  madvise(p, length, MADV_HUGEPAGE);
  return HugePageBuffer(p, HugePageFree{bytes});
}

void make_resident(std::byte* data, size_t bytes) {
  const size_t page = page_size();
  const size_t pages = (bytes + page - 1) / page;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, pages, 256), [&](const auto& range) {
    for (size_t i = range.begin(); i < range.end(); ++i) data[i * page] = std::byte{0};
  });
}

}  // namespace pipeline::cpu
