// Reading a YAML config's fields, each error naming the file, the line and the field
// ("serve.yaml:7: field 'scheduler.window_ms': ..."), or the command-line override that wrote it.
// serve_config.cpp reads ServeConfig's sections with it; graph_plan.cpp reads stage parameters
// with yaml_integer.
#pragma once

#include <cctype>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include <yaml-cpp/yaml.h>

#include "graph/serve_config.h"

namespace pipeline {

// A YAML integer as YAML 1.2's core schema reads it, as every integer field and stage parameter
// is read: "023417" is 23417, as --port reads it, where yaml-cpp's conversion takes a leading 0
// for octal (YAML 1.1). Signs and hex (0x1F) as yaml-cpp reads them. Throws YAML::BadConversion
// on a scalar that is not an integer of type T.
template <typename T>
T yaml_integer(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  const size_t digits = text.find_first_not_of("+-");
  const size_t nonzero = text.find_first_not_of('0', digits);
  const bool leading_zeros = digits != std::string::npos && nonzero != digits &&
                             nonzero != std::string::npos && std::isdigit(uint8_t(text[nonzero]));
  if (!leading_zeros) return node.as<T>();
  return YAML::Node(text.substr(0, digits) + text.substr(nonzero)).as<T>();
}

// What is wrong with YAML that yaml-cpp refused: its message for nesting past its limit is just
// "bad file".
std::string yaml_problem(const YAML::Exception& e);

// Reads fields of one YAML document and words errors with the file and line they came from.
// Overridden fields are reported as the override that set them. Every error is a ConfigError.
class FieldReader {
 public:
  // overrides: field -> value as written, for the fields --set wrote.
  FieldReader(std::string file, std::map<std::string, std::string> overrides);

  [[noreturn]] void fail(const YAML::Node& node, const std::string& field,
                         const std::string& what) const;
  // "FILE:LINE", or the override that wrote the field, or FILE alone.
  std::string where(const YAML::Node& node, const std::string& field) const;

  // A mistake in a key itself: the key's line in the file, whatever an override did to its
  // value; a key only an override wrote has no line, and is the override's.
  [[noreturn]] void fail_key(const YAML::Node& key, const std::string& field,
                             const std::string& what) const;

  int line(const YAML::Node& node) const { return node ? node.Mark().line + 1 : 0; }

  // Whether the file wrote `key` (an override's keys have no line of it).
  bool in_file(const YAML::Node& key, const std::string& field) const;

  void require_map(const YAML::Node& node, const std::string& field) const;

  // A key is a name: not a list or a mapping ("? [a, b]", "{x: 1}: 2"), nor null, of which
  // yaml-cpp's conversion said only "bad conversion", naming no file.
  std::string key_name(const YAML::Node& key, const std::string& section) const;

  // Every key of `node` must be one of `known`, and appear once. `hint`, where given, adds to
  // the error of an unknown key (where that key belongs instead, say).
  void check_keys(const YAML::Node& node, const std::string& section,
                  const std::set<std::string>& known,
                  const std::function<std::string(const std::string& key)>& hint = {}) const;

  // Every key of `node` must be a name and appear once: yaml-cpp keeps a repeated key and reads
  // the first, which would silently drop the second.
  void check_unique_keys(const YAML::Node& node, const std::string& section) const;

  template <typename T>
  T scalar(const YAML::Node& node, const std::string& field, const char* expected) const {
    if (!node.IsScalar()) fail(node, field, std::string("expected ") + expected);
    try {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        return yaml_integer<T>(node);
      else
        return node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node, field, std::string("expected ") + expected + ", got '" + node.Scalar() + "'");
    }
  }

  // `why`, when given, says what the maximum protects.
  int integer(const YAML::Node& node, const std::string& field, int min,
              int max = std::numeric_limits<int>::max(), const std::string& why = "") const;
  bool boolean(const YAML::Node& node, const std::string& field) const {
    return scalar<bool>(node, field, "true or false");
  }
  double number(const YAML::Node& node, const std::string& field) const {
    return scalar<double>(node, field, "a number");
  }
  std::string string(const YAML::Node& node, const std::string& field) const {
    return scalar<std::string>(node, field, "a string");
  }
  std::string one_of(const YAML::Node& node, const std::string& field,
                     const std::set<std::string>& allowed) const;

  const std::string& file() const { return file_; }

 private:
  using Override = std::pair<const std::string, std::string>;  // field -> value as written

  std::string override_named(const Override& applied) const;
  // The override that wrote a whole section or list holding `field` (--set
  // 'scheduler={window_ms: fast}'), whose text the marks of everything in it point into.
  const Override* enclosing_override(const std::string& field) const;

  std::string file_;
  std::map<std::string, std::string> overrides_;
  mutable std::map<std::string, int> key_lines_;  // field -> its key's line, as check_keys met it
};

}  // namespace pipeline
