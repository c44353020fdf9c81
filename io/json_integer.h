// A JSON integer as int64, for range checks that must not be fooled by nlohmann's parsing: a
// non-negative literal parses as unsigned, and one past INT64_MAX would read as a negative
// number through get<int64_t>().
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace pipeline {

// The value when `value` is an integer that fits int64; nullopt otherwise.
// (Any nlohmann JSON type: ordered or not.)
template <class Json>
std::optional<int64_t> json_int64(const Json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned() && value.template get<uint64_t>() > uint64_t(INT64_MAX))
    return std::nullopt;
  return value.template get<int64_t>();
}

}  // namespace pipeline
