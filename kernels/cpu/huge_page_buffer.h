// Anonymous memory for large read-mostly buffers (the packed weights), placed so that the kernel
// can back it with 2 MiB transparent huge pages. Decode streams every weight once per token; on
// 4 KiB pages a 1 GiB model crosses a page, and misses the TLB, every 4 KiB of every stream,
// which costs a visible share of the memory bandwidth. Where THP is "madvise" (or "always") the
// buffer gets huge pages; where it is "never", this is plain anonymous memory.
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

}  // namespace pipeline::cpu
