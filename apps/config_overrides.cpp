#include "apps/config_overrides.h"

#include "graph/runner_factory.h"

namespace pipeline {

namespace {

// YAML reads a '#' that starts a plain value, or follows a space in it, as a comment:
// --set server.api_key=#s3cret was read as null and turned authentication off without a word,
// and api_key=abc #def as "abc". A quoted value keeps its '#'.
void refuse_comment(const std::string& assignment) {
  const auto eq = assignment.find('=');
  const std::string value = assignment.substr(eq + 1);
  if (value.starts_with('\'') || value.starts_with('"')) return;
  for (size_t i = 0; i < value.size(); ++i)
    if (value[i] == '#' && (i == 0 || value[i - 1] == ' ' || value[i - 1] == '\t'))
      throw UsageError("--set " + assignment + ": YAML reads '" + value.substr(i) +
                       "' as a comment; quote the value to keep it: --set \"" +
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
  if (auto device = options.one_of("--device", kDeviceNames))
    overrides.push_back("device=" + *device);
  if (options.find("--threads"))
    overrides.push_back("threads=" +
                        std::to_string(options.int_value("--threads", 0, 0, kMaxThreads)));
  for (const auto& assignment : options.all("--set")) {
    if (assignment.find('=') == std::string::npos)
      throw UsageError("--set: expected section.key=value, got '" + assignment + "'");
    refuse_comment(assignment);
    overrides.push_back(assignment);
  }
  return overrides;
}

}  // namespace pipeline
