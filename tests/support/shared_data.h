// Where tests find the shared test data (../shared from the repository root) and the built
// `pipeline` command. Missing data fails the test loudly; it never skips.
#pragma once

#include <filesystem>
#include <string>

namespace pipeline::testing {

// The repository root.
std::filesystem::path source_dir();
// ../shared/<relative>; throws std::runtime_error naming the path when it does not exist.
std::filesystem::path shared_path(const std::string& relative);
// The built `pipeline` executable.
std::filesystem::path pipeline_binary();
// A fresh empty directory under the system temp dir; the caller removes it.
std::filesystem::path make_temp_dir(const std::string& prefix);

}  // namespace pipeline::testing
