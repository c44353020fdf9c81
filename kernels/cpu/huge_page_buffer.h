// Anonymous memory for large buffers. The read-mostly ones (the packed weights) are placed so
// that the kernel can back them with 2 MiB transparent huge pages: decode streams every weight
// once per token, and on 4 KiB pages a 1 GiB model crosses a page, and misses the TLB, every
// 4 KiB of every stream, which costs a visible share of the memory bandwidth. Where THP is
// "madvise" (or "always") those buffers get huge pages; where it is "never", they are plain
// anonymous memory.
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

// `bytes` of zero-filled memory on small pages (advised against huge pages), starting on a page
// boundary, each page resident once first written; throws std::bad_alloc. For the KV pool,
// which attention reads in aligned 64-byte vectors, and where huge pages would make 2 MiB
// resident for each block first written.
HugePageBuffer allocate_page_buffer(size_t bytes);

}  // namespace pipeline::cpu
