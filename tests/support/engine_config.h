// The config of the in-process engine tests: the tiny real model stories260K on the CPU, with
// the sections each test sets, read from a file as `pipeline run` reads one.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "graph/serve_config.h"
#include "tests/support/shared_data.h"

namespace pipeline::testing {

// stories260K on the CPU (two kernel threads, the raw chat template), then `sections` (YAML:
// server, scheduler, graph; those not given default).
inline ServeConfig stories_engine_config(const std::string& sections) {
  const auto dir = make_temp_dir("engine-config");
  const auto file = dir / "serve.yaml";
  std::ofstream(file) << "model: {path: " << shared_path("models/stories260K").string()
                      << ", chat_template: raw}\n"
                      << "device: cpu\nthreads: 2\n"
                      << sections;
  auto config = load_serve_config(file);
  std::filesystem::remove_all(dir);
  return config;
}

}  // namespace pipeline::testing
