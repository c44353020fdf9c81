// Anonymous memory for large buffers. The read-mostly ones (the packed weights) are placed so
// that the kernel can back them with 2 MiB transparent huge pages: decode streams every weight
// once per token, and on 4 KiB pages a 1 GiB model crosses a page, and misses the TLB, every
// 4 KiB of every stream, which costs a visible share of the memory bandwidth. Where THP is
// "madvise" (or "always") those buffers get huge pages; where it is "never", they are plain
// anonymous memory. The KV pool is one of them too, made resident at start (make_resident).
#pragma once

#include <cstddef>
#include <memory>

namespace pipeline::cpu {

struct HugePageFree {
  size_t bytes = 0;
  void operator()(std::byte* p) const;
};

using HugePageBuffer = std::unique_ptr<std::byte[], HugePageFree>;

// `bytes` of zero-filled memory starting on a 2 MiB boundary; throws std::bad_alloc.
HugePageBuffer allocate_huge_page_buffer(size_t bytes);

constexpr size_t kHugePageBytes = size_t(2) << 20;

// `bytes` rounded up to whole huge pages.
size_t whole_huge_pages(size_t bytes);

// A scratch array that only grows, in huge-page memory of whole 2 MiB pages: the first pass
// that needs it large faults once per 2 MiB, not once per 4 KiB (a first prefill of 2,048
// tokens on llama2-110m took 25,000 faults in std::vector scratch, about 0.2 s on a VM).
// Growing discards the contents, which every user writes before it reads.
template <class T>
class ScratchArray {
 public:
  // Makes room for at least `count` elements.
  void grow(size_t count) {
    if (count <= capacity_) return;
    const size_t bytes = whole_huge_pages(count * sizeof(T));
    memory_.reset();  // before the new one: the two need not both be mapped
    memory_ = allocate_huge_page_buffer(bytes);
    capacity_ = bytes / sizeof(T);
  }
  T* data() const { return reinterpret_cast<T*>(memory_.get()); }
  size_t capacity() const { return capacity_; }

 private:
  HugePageBuffer memory_;
  size_t capacity_ = 0;  // elements
};

// Writes each page of [data, data + bytes) once, from all threads, so that every page is
// resident before its first real use and no later write stops on a page fault. For the KV
// pool, whose blocks are otherwise first written a few at a time, in the middle of decode steps.
void make_resident(std::byte* data, size_t bytes);

}  // namespace pipeline::cpu
