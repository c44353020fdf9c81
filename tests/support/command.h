// Running the built `pipeline` command and shell commands from tests.
#pragma once

#include <string>
#include <vector>

namespace pipeline::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the process did not exit normally
  std::string out;     // standard output
  std::string err;     // standard error (run_shell folds it into `out`)
};

std::string shell_quoted(const std::string& arg);

// Runs `pipeline ARGS...`, capturing standard output and standard error apart.
CommandResult run_pipeline(const std::vector<std::string>& args);

// Runs a shell command line with standard error folded into standard output.
CommandResult run_shell(const std::string& command);

}  // namespace pipeline::testing
