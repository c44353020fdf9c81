// Where tests find the shared test data (../shared from the repository root) and the built
// `pipeline` command. Missing data fails the test loudly; it never skips. The environment
// variables PIPELINE_SOURCE_DIR, PIPELINE_SHARED_DIR and PIPELINE_BINARY override the three, for
// test executables run away from the tree that built them (scripts/gpu_check.sh on a GPU
// machine).
#pragma once

#include <filesystem>
#include <string>

namespace pipeline::testing {

// The repository root (or $PIPELINE_SOURCE_DIR).
std::filesystem::path source_dir();
// ../shared/<relative> (or $PIPELINE_SHARED_DIR/<relative>); throws std::runtime_error naming the
// path when it does not exist.
std::filesystem::path shared_path(const std::string& relative);
// The built `pipeline` executable (or $PIPELINE_BINARY).
std::filesystem::path pipeline_binary();
// A fresh empty directory under the system temp dir; the caller removes it.
std::filesystem::path make_temp_dir(const std::string& prefix);

}  // namespace pipeline::testing
