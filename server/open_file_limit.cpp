#include "server/open_file_limit.h"

#include <sys/resource.h>

#include <fstream>

namespace pipeline {

namespace {

// What the kernel lets one process open at most; a soft limit above it is refused.
rlim_t kernel_open_file_ceiling() {
  std::ifstream file("/proc/sys/fs/nr_open");
  rlim_t ceiling = 0;
  if (file >> ceiling && ceiling > 0) return ceiling;
  return rlim_t(1) << 20;  // Linux's default nr_open
}

}  // namespace

uint64_t raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  rlim_t target = limit.rlim_max;
  if (target == RLIM_INFINITY) target = kernel_open_file_ceiling();
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < target) {
    rlimit raised = limit;
    raised.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : uint64_t(limit.rlim_cur);
}

}  // namespace pipeline
