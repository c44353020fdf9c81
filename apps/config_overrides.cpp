#include "apps/config_overrides.h"

namespace pipeline {

std::string yaml_string(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') quoted += '\'';
    quoted += c;
  }
  quoted += '\'';
  return quoted;
}

std::vector<std::string> config_overrides(Options& options) {
  std::vector<std::string> overrides;
  if (auto model = options.find("--model"))
    overrides.push_back("model.path=" + yaml_string(*model));
  if (auto device = options.find("--device")) {
    if (*device != "cpu" && *device != "cuda" && *device != "auto")
      throw UsageError("--device: expected cpu, cuda or auto, got '" + *device + "'");
    overrides.push_back("device=" + *device);
  }
  for (const auto& assignment : options.all("--set")) {
    if (assignment.find('=') == std::string::npos)
      throw UsageError("--set: expected section.key=value, got '" + assignment + "'");
    overrides.push_back(assignment);
  }
  return overrides;
}

}  // namespace pipeline
