#include "tests/support/command.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tests/support/shared_data.h"

namespace pipeline::testing {

namespace {

// Runs `command` through the shell; its standard output goes to `out`.
int run_capturing_stdout(const std::string& command, std::string& out) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

std::string shell_quoted(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

CommandResult run_pipeline(const std::vector<std::string>& args) {
  const auto dir = make_temp_dir("pipeline-command");
  const auto err_file = dir / "stderr.txt";
  std::string command = shell_quoted(pipeline_binary().string());
  for (const auto& arg : args) command.append(" ").append(shell_quoted(arg));
  command.append(" 2>").append(shell_quoted(err_file.string()));
  CommandResult result;
  result.exit_code = run_capturing_stdout(command, result.out);
  std::stringstream err;
  err << std::ifstream(err_file).rdbuf();
  result.err = err.str();
  std::filesystem::remove_all(dir);
  return result;
}

CommandResult run_shell(const std::string& command) {
  CommandResult result;
  result.exit_code = run_capturing_stdout(command + " 2>&1", result.out);
  return result;
}

}  // namespace pipeline::testing
