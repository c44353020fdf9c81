#include "tests/support/shared_data.h"

#include <cstdlib>
#include <random>
#include <stdexcept>

namespace pipeline::testing {

namespace {

// The value of environment variable `name`, or `fallback` when it is unset or empty.
std::filesystem::path from_env(const char* name, const std::filesystem::path& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::filesystem::path(value) : fallback;
}

}  // namespace

std::filesystem::path source_dir() {
  return from_env("PIPELINE_SOURCE_DIR", PIPELINE_SOURCE_DIR);
}

std::filesystem::path shared_path(const std::string& relative) {
  const auto path =
      from_env("PIPELINE_SHARED_DIR", source_dir().parent_path() / "shared") / relative;
  if (!std::filesystem::exists(path))
    throw std::runtime_error("shared test data missing: " + path.string() +
                             " (the tests expect ../shared beside the repository)");
  return path;
}

std::filesystem::path pipeline_binary() {
  return from_env("PIPELINE_BINARY", PIPELINE_BINARY);
}

std::filesystem::path make_temp_dir(const std::string& prefix) {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto dir = std::filesystem::temp_directory_path() /
               (prefix + "-" + std::to_string(rd()) + std::to_string(attempt));
    if (std::filesystem::create_directory(dir)) return dir;
  }
  throw std::runtime_error("cannot create a temporary directory for " + prefix);
}

}  // namespace pipeline::testing
