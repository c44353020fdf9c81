// Command-line options of one subcommand: "--name value", "--name=value", boolean flags named
// up front, and positional arguments; -h is --help. Every mistake throws UsageError naming the
// option or argument. A value that starts with "--" is given as --name=value: "--name --other"
// is two options, so that a mistyped option never takes the option after it as its value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

class UsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Options {
 public:
  // argv[0] is the subcommand. `flags` are the options that take no value (--help always is).
  Options(int argc, char** argv, std::string usage, std::initializer_list<const char*> flags = {});

  // Prints the usage when --help was given; the command then returns 0.
  bool help() const;

  bool flag(const std::string& name);
  std::optional<std::string> find(const std::string& name);
  std::string get(const std::string& name, const std::string& fallback);
  std::string required(const std::string& name);
  int64_t integer(const std::string& name, int64_t fallback);
  // An integer from `min` to `max`.
  int64_t integer(const std::string& name, int64_t fallback, int64_t min,
                  int64_t max = std::numeric_limits<int64_t>::max());
  // An int from `min` to `max`: a value past an int is refused, never cut to 32 bits.
  int int_value(const std::string& name, int fallback, int min = std::numeric_limits<int>::min(),
                int max = std::numeric_limits<int>::max());
  // A finite number: std::stod also reads "nan" and "inf", which no option means (sent on in
  // JSON, they became null).
  double number(const std::string& name, double fallback);
  // The value when given, which must be one of `choices`.
  std::optional<std::string> one_of(const std::string& name,
                                    std::span<const std::string_view> choices);
  std::vector<std::string> all(const std::string& name);  // a repeatable option

  // Called once every option is read: throws UsageError on any option the command did not
  // read, then on a count of positional arguments outside [min_count, max_count]; returns them.
  std::vector<std::string> finish(size_t min_count = 0, size_t max_count = 0) const;

 private:
  // Marks `name` read; throws when it was given with no value after it.
  void read_value_option(const std::string& name);

  std::string usage_;
  std::set<std::string> flags_given_;
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::set<std::string> read_;
  // Options given with no value after them (last, or followed by another option) -> what came
  // next ("" when nothing): "needs a value" if the command reads one, "unknown option" if not.
  std::map<std::string, std::string> without_value_;
};

}  // namespace pipeline
