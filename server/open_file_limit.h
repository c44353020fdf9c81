// The process's limit on open files, which bounds the server's connections: each holds a
// socket. A shell's default soft limit (often 1024) is far below what the kernel allows, and
// when it runs out the listening socket can accept no one, so idle connections keep every new
// client out (the relief for idle connections starts only with a connection waiting for a
// thread). Servers raise it at start, as nginx and vLLM do.
#pragma once

#include <cstdint>

namespace pipeline {

// Raises the soft RLIMIT_NOFILE to the hard limit (to the kernel's nr_open where the hard
// limit is unlimited); returns the soft limit in force after, raised or not.
uint64_t raise_open_file_limit();

}  // namespace pipeline
