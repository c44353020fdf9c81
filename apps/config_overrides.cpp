#include "apps/config_overrides.h"

#include <yaml-cpp/yaml.h>

#include <set>

namespace pipeline {

namespace {

// YAML reads "#s3cret" as a comment, and so as null: --set server.api_key=#s3cret turned
// authentication off without a word. A null is asked for by writing one.
void refuse_accidental_null(const std::string& assignment) {
  const auto eq = assignment.find('=');
  const std::string value = assignment.substr(eq + 1);
  static const std::set<std::string> kNulls = {"", "~", "null", "Null", "NULL"};
  if (kNulls.contains(value)) return;
  try {
    if (!YAML::Load(value).IsNull()) return;
  } catch (const YAML::Exception&) {
    return;  // not YAML at all: load_serve_config names the override
  }
  throw UsageError("--set " + assignment + ": YAML reads '" + value +
                   "' as null ('#' starts a comment); quote the value to keep it: --set \"" +
                   assignment.substr(0, eq) + "=" + yaml_string(value) + "\"");
}

}  // namespace

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
    refuse_accidental_null(assignment);
    overrides.push_back(assignment);
  }
  return overrides;
}

}  // namespace pipeline
