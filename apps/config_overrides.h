// The command-line flags that override fields of a serve config (load_serve_config's
// "section.key=value" overrides), shared by the commands that load one.
#pragma once

#include <string>
#include <vector>

#include "apps/options.h"

namespace pipeline {

// --model DIR (model.path), --device cpu|cuda|auto, --threads N, then every --set
// section.key=value, in that order so that --set wins. Throws UsageError naming a flag with a bad
// value, and a --set value with a YAML comment in it ('#' at its start or after a space) unless it
// is quoted.
std::vector<std::string> config_overrides(Options& options);

// `text` as a YAML single-quoted scalar: an override's value stays a string whatever it holds.
std::string yaml_string(const std::string& text);

}  // namespace pipeline
