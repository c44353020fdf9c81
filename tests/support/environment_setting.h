// An environment variable set to a value (unset where null) for the guard's life, and as it was
// after: gpu_check runs the CUDA tests with some of the variables the backend reads already set.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace pipeline {

class EnvironmentSetting {
 public:
  EnvironmentSetting(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) before_ = before;
    set(value);
  }
  ~EnvironmentSetting() { set(before_ ? before_->c_str() : nullptr); }
  EnvironmentSetting(const EnvironmentSetting&) = delete;
  EnvironmentSetting& operator=(const EnvironmentSetting&) = delete;

 private:
  void set(const char* value) const {
    if (value)
      setenv(name_.c_str(), value, 1);
    else
      unsetenv(name_.c_str());
  }
  std::string name_;
  std::optional<std::string> before_;
};

}  // namespace pipeline
