#include "tests/support/shared_data.h"

#include <random>
#include <stdexcept>

namespace pipeline::testing {

std::filesystem::path source_dir() {
  return PIPELINE_SOURCE_DIR;
}

std::filesystem::path shared_path(const std::string& relative) {
  const auto path = source_dir().parent_path() / "shared" / relative;
  if (!std::filesystem::exists(path))
    throw std::runtime_error("shared test data missing: " + path.string() +
                             " (the tests expect ../shared beside the repository)");
  return path;
}

std::filesystem::path pipeline_binary() {
  return PIPELINE_BINARY;
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
