// A JSON integer as int64, for range checks that must not be fooled by nlohmann's parsing: a
// non-negative literal parses as unsigned, and one past INT64_MAX would read as a negative
// number through get<int64_t>().
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace pipeline {

// The value when `value` is an integer that fits int64; nullopt otherwise.
inline std::optional<int64_t> json_int64(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX))
    return std::nullopt;
  return value.get<int64_t>();
}

}  // namespace pipeline
