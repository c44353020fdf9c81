#include "apps/options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pipeline {

namespace {

bool is_option(const std::string& arg) {
  return arg.size() > 2 && arg.rfind("--", 0) == 0;
}

}  // namespace

Options::Options(int argc, char** argv, std::string usage, std::initializer_list<const char*> flags)
    : usage_(std::move(usage)) {
  std::set<std::string> flag_names(flags.begin(), flags.end());
  flag_names.insert("--help");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i] == std::string("-h") ? "--help" : argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      positional_.push_back(arg);
      continue;
    }
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    if (flag_names.count(name)) {
      if (eq != std::string::npos) throw UsageError(name + " takes no value");
      flags_given_.insert(name);
    } else if (eq != std::string::npos) {
      values_.emplace(name, arg.substr(eq + 1));
    } else if (i + 1 < argc && !is_option(argv[i + 1])) {
      values_.emplace(name, argv[++i]);
    } else {
      without_value_[name] = i + 1 < argc ? argv[i + 1] : "";
    }
  }
}

bool Options::help() const {
  if (!flags_given_.count("--help")) return false;
  std::printf("%s\n", usage_.c_str());
  return true;
}

bool Options::flag(const std::string& name) {
  read_.insert(name);
  return flags_given_.count(name) > 0;
}

void Options::read_value_option(const std::string& name) {
  read_.insert(name);
  const auto missing = without_value_.find(name);
  if (missing == without_value_.end()) return;
  if (missing->second.empty()) throw UsageError(name + " needs a value");
  throw UsageError(name + " needs a value, not the option " + missing->second + " (a value that " +
                   "starts with -- is given as " + name + "=VALUE)");
}

std::optional<std::string> Options::find(const std::string& name) {
  read_value_option(name);
  const auto count = values_.count(name);
  if (count == 0) return std::nullopt;
  if (count > 1) throw UsageError(name + " given more than once");
  return values_.find(name)->second;
}

std::string Options::get(const std::string& name, const std::string& fallback) {
  return find(name).value_or(fallback);
}

std::string Options::required(const std::string& name) {
  if (auto value = find(name)) return *value;
  throw UsageError(name + " is required\n" + usage_);
}

int64_t Options::integer(const std::string& name, int64_t fallback) {
  const auto value = find(name);
  if (!value) return fallback;
  size_t used = 0;
  try {
    const int64_t n = std::stoll(*value, &used);
    if (used == value->size()) return n;
  } catch (const std::out_of_range&) {
    throw UsageError(name + ": " + *value + " is out of range (a 64-bit signed integer)");
  } catch (const std::exception&) {
  }
  throw UsageError(name + ": expected an integer, got '" + *value + "'");
}

int64_t Options::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) {
  const int64_t n = integer(name, fallback);
  if (n < min)
    throw UsageError(name + ": expected an integer of at least " + std::to_string(min) + ", got " +
                     std::to_string(n));
  if (n > max)
    throw UsageError(name + ": expected an integer of at most " + std::to_string(max) + ", got " +
                     std::to_string(n));
  return n;
}

int Options::int_value(const std::string& name, int fallback, int min, int max) {
  return int(integer(name, fallback, min, max));
}

double Options::number(const std::string& name, double fallback) {
  const auto value = find(name);
  if (!value) return fallback;
  size_t used = 0;
  try {
    const double x = std::stod(*value, &used);
    if (used == value->size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  throw UsageError(name + ": expected a number, got '" + *value + "'");
}

std::optional<std::string> Options::one_of(const std::string& name,
                                           std::span<const std::string_view> choices) {
  std::optional<std::string> value = find(name);
  if (!value || std::find(choices.begin(), choices.end(), *value) != choices.end()) return value;
  std::string listed;
  for (std::string_view choice : choices)
    listed += (listed.empty() ? "" : ", ") + std::string(choice);
  throw UsageError(name + " must be one of " + listed + ", got '" + *value + "'");
}

std::vector<std::string> Options::all(const std::string& name) {
  read_value_option(name);
  std::vector<std::string> result;
  for (auto [it, end] = values_.equal_range(name); it != end; ++it) result.push_back(it->second);
  return result;
}

std::vector<std::string> Options::finish(size_t min_count, size_t max_count) const {
  // Unknown options first: one may have taken the argument after it as its value, which would
  // make a count of the arguments mislead.
  for (const auto& [name, next] : without_value_)
    if (!read_.count(name)) throw UsageError("unknown option " + name);
  for (const auto& name : flags_given_)
    if (!read_.count(name) && name != "--help") throw UsageError("unknown option " + name);
  for (const auto& [name, value] : values_)
    if (!read_.count(name)) throw UsageError("unknown option " + name);
  if (max_count == 0 && !positional_.empty())
    throw UsageError("unexpected argument '" + positional_.front() + "'");
  if (positional_.size() < min_count || positional_.size() > max_count)
    throw UsageError("expected " +
                     (min_count == max_count
                          ? std::to_string(min_count)
                          : std::to_string(min_count) + " to " + std::to_string(max_count)) +
                     (max_count == 1 ? " argument" : " arguments") + ", got " +
                     std::to_string(positional_.size()) + "\n" + usage_);
  return positional_;
}

}  // namespace pipeline
