// raise_open_file_limit lifts the soft limit on open files to the hard one, so that a server
// started from a shell with `ulimit -n 256` still accepts connections past 256. Run in a child
// process: the limit is the process's.
#include "server/open_file_limit.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace pipeline {
namespace {

TEST(OpenFileLimit, TheSoftLimitIsRaisedToTheHardOne) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  ASSERT_GT(limit.rlim_max, rlim_t(64)) << "the hard limit leaves nothing to raise to";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit low = limit;
    low.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) _exit(2);
    const uint64_t after = raise_open_file_limit();
    rlimit now{};
    getrlimit(RLIMIT_NOFILE, &now);
    const bool raised = now.rlim_cur > 64 && uint64_t(now.rlim_cur) == after &&
                        (limit.rlim_max == RLIM_INFINITY || now.rlim_cur == limit.rlim_max);
    _exit(raised ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: could not lower the limit; 1: it was not raised";
}

}  // namespace
}  // namespace pipeline
