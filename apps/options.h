// Command-line options of one subcommand: "--name value", "--name=value", boolean flags named
// up front, and positional arguments. Every mistake throws UsageError naming the option.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
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
  double number(const std::string& name, double fallback);
  std::vector<std::string> all(const std::string& name);  // a repeatable option
  std::vector<std::string> positional(size_t min_count, size_t max_count);

  // Throws UsageError on any option the command did not read.
  void finish() const;

 private:
  std::string usage_;
  std::set<std::string> flags_given_;
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::set<std::string> read_;
};

}  // namespace pipeline
