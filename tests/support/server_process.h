// A real `pipeline run` child process for end-to-end tests: started on a free port (--port 0)
// with a config written to a temp dir, its stderr collected, stopped with SIGTERM.
// Header-only so that only the tests that start a server include it.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/shared_data.h"

extern char** environ;

namespace pipeline::testing {

// A serving config for the tiny real model stories260K on the CPU; `extra_yaml` adds sections.
inline std::string stories_config(const std::string& extra_yaml = "") {
  return "model:\n  path: " + shared_path("models/stories260K").string() +
         "\ndevice: cpu\nserver:\n  host: 127.0.0.1\n  port: 0\n" + extra_yaml;
}

class ServerProcess {
 public:
  // Starts `pipeline run CONFIG --port 0 --device cpu ARGS...` and waits until it listens.
  explicit ServerProcess(const std::string& config_yaml, std::vector<std::string> args = {}) {
    dir_ = make_temp_dir("pipeline-server");
    const auto config = dir_ / "serve.yaml";
    std::ofstream(config) << config_yaml;

    std::vector<std::string> command = {
        pipeline_binary().string(), "run", config.string(), "--port", "0", "--device", "cpu"};
    command.insert(command.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& arg : command) argv.push_back(arg.data());
    argv.push_back(nullptr);

    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe() failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    const int spawned = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (spawned != 0) {
      close(fds[0]);
      throw std::runtime_error("cannot start " + command[0]);
    }
    reader_ = std::thread([this, fd = fds[0]] { collect_stderr(fd); });
    try {
      wait_until_listening();
    } catch (...) {
      stop();  // a joinable thread left to the unwinding would end the test process
      throw;
    }
  }

  ~ServerProcess() { stop(); }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::string stderr_text() const {
    std::lock_guard lock(mutex_);
    return stderr_;
  }

  void signal(int signal_number) { kill(pid_, signal_number); }

  // Whether the server's stderr shows `text` within `timeout`.
  bool stderr_shows(const std::string& text, std::chrono::seconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] {
      return stderr_.find(text) != std::string::npos || stderr_closed_;
    }) && stderr_.find(text) != std::string::npos;
  }

  // Sends SIGTERM and waits: the exit code, or -1 when the process did not exit normally in
  // time (it is killed then).
  int terminate(std::chrono::seconds timeout) {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  void collect_stderr(int fd) {
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof buffer)) > 0) {
      std::lock_guard lock(mutex_);
      stderr_.append(buffer, size_t(n));
      changed_.notify_all();
    }
    close(fd);
    std::lock_guard lock(mutex_);
    stderr_closed_ = true;
    changed_.notify_all();
  }

  // Kills the server if it runs, waits for its stderr to close, and removes its folder.
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (reader_.joinable()) reader_.join();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void wait_until_listening() {
    static const std::regex listening(R"(listening on http://(?:\[[^\]\s]+\]|[^:\s]+):(\d+))");
    std::unique_lock lock(mutex_);
    std::smatch match;
    const bool ready = changed_.wait_for(lock, std::chrono::seconds(60), [&] {
      return std::regex_search(stderr_, match, listening) || stderr_closed_;
    });
    if (!ready || match.empty())
      throw std::runtime_error("pipeline run did not start listening; its stderr:\n" + stderr_);
    port_ = std::stoi(match[1].str());
  }

  std::filesystem::path dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string stderr_;
  bool stderr_closed_ = false;
};

}  // namespace pipeline::testing
