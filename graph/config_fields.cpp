#include "graph/config_fields.h"

#include <yaml-cpp/depthguard.h>

namespace pipeline {
namespace {

// "section.key", or "key" at the top level ("").
std::string field_in(const std::string& section, const std::string& key) {
  return section.empty() ? key : section + "." + key;
}

std::string comma_list(const std::set<std::string>& words) {
  std::string list;
  for (const auto& w : words) list += (list.empty() ? "" : ", ") + w;
  return list;
}

}  // namespace

std::string yaml_problem(const YAML::Exception& e) {
  if (dynamic_cast<const YAML::DeepRecursion*>(&e))
    return "lists and mappings nested deeper than yaml-cpp reads";
  return e.msg;
}

FieldReader::FieldReader(std::string file, std::map<std::string, std::string> overrides)
    : file_(std::move(file)), overrides_(std::move(overrides)) {}

void FieldReader::fail(const YAML::Node& node, const std::string& field,
                       const std::string& what) const {
  throw ConfigError(where(node, field) + ": field '" + field + "': " + what);
}

std::string FieldReader::where(const YAML::Node& node, const std::string& field) const {
  if (auto it = overrides_.find(field); it != overrides_.end()) return override_named(*it);
  if (const auto* enclosing = enclosing_override(field)) return override_named(*enclosing);
  // An empty value's mark is that of the next token, lines below: name its key's line.
  if (node && node.IsNull())
    if (auto it = key_lines_.find(field); it != key_lines_.end())
      return file_ + ":" + std::to_string(it->second);
  if (node && node.Mark().line >= 0) return file_ + ":" + std::to_string(node.Mark().line + 1);
  // No line of the file holds it: an override of a field within it wrote it (--set bogus.x=1
  // writes the section 'bogus').
  const auto within = overrides_.lower_bound(field + ".");
  if (within != overrides_.end() && within->first.starts_with(field + "."))
    return override_named(*within);
  return file_;
}

void FieldReader::fail_key(const YAML::Node& key, const std::string& field,
                           const std::string& what) const {
  if (!in_file(key, field)) fail(key, field, what);
  throw ConfigError(file_ + ":" + std::to_string(line(key)) + ": field '" + field + "': " + what);
}

bool FieldReader::in_file(const YAML::Node& key, const std::string& field) const {
  return key.Mark().line >= 0 && !enclosing_override(field);
}

void FieldReader::require_map(const YAML::Node& node, const std::string& field) const {
  if (!node.IsMap()) fail(node, field, "expected a mapping");
}

std::string FieldReader::key_name(const YAML::Node& key, const std::string& section) const {
  if (key.IsScalar()) return key.Scalar();
  const std::string kind = key.IsSequence() ? "a list" : key.IsMap() ? "a mapping" : "null";
  throw ConfigError(file_ + ":" + std::to_string(line(key)) + ": " +
                    (section.empty() ? "" : "field '" + section + "': ") +
                    "a key must be a name, not " + kind);
}

void FieldReader::check_keys(const YAML::Node& node, const std::string& section,
                             const std::set<std::string>& known,
                             const std::function<std::string(const std::string& key)>& hint) const {
  for (const auto& entry : node)
    if (const auto key = key_name(entry.first, section); !known.contains(key))
      fail_key(entry.first, field_in(section, key),
               "unknown field (known: " + comma_list(known) + ")" + (hint ? hint(key) : ""));
  check_unique_keys(node, section);
}

void FieldReader::check_unique_keys(const YAML::Node& node, const std::string& section) const {
  std::map<std::string, int> first_line;
  for (const auto& entry : node) {
    const auto key = key_name(entry.first, section);
    const std::string field = field_in(section, key);
    if (const auto [it, fresh] = first_line.emplace(key, line(entry.first)); !fresh)
      fail_key(entry.first, field,
               in_file(entry.first, field)
                   ? "given twice (first on line " + std::to_string(it->second) + ")"
                   : "given twice");
    key_lines_[field] = line(entry.first);
  }
}

int FieldReader::integer(const YAML::Node& node, const std::string& field, int min, int max,
                         const std::string& why) const {
  // Read wide, so that a value past int's range is called too large, not "not an integer".
  const int64_t value = scalar<int64_t>(node, field, "an integer");
  if (value < min) fail(node, field, "must be at least " + std::to_string(min));
  if (value > max)
    fail(node, field,
         "must be at most " + std::to_string(max) + (why.empty() ? "" : " (" + why + ")"));
  return int(value);
}

std::string FieldReader::one_of(const YAML::Node& node, const std::string& field,
                                const std::set<std::string>& allowed) const {
  if (!node.IsScalar()) fail(node, field, "expected one of " + comma_list(allowed));
  const auto value = string(node, field);
  if (!allowed.contains(value))
    fail(node, field, "'" + value + "' is not one of " + comma_list(allowed));
  return value;
}

std::string FieldReader::override_named(const Override& applied) const {
  return file_ + ": override '" + applied.first + "=" + applied.second + "'";
}

const FieldReader::Override* FieldReader::enclosing_override(const std::string& field) const {
  for (const auto& applied : overrides_) {
    const std::string& name = applied.first;
    if (field.size() > name.size() && field.starts_with(name) &&
        (field[name.size()] == '.' || field[name.size()] == '['))
      return &applied;
  }
  return nullptr;
}

}  // namespace pipeline
