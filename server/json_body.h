// Request bodies as JSON whose objects keep their members in the order they were written: a JSON
// schema's properties are written in that order (response_format json_schema).
//
// nlohmann's ordered_json finds a key by a linear search, so its own parser takes time
// quadratic in an object's members; a 16 MiB body of one object would cost minutes. This reader
// builds the same value in linear time, looking keys up in a hash set while an object is open.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace pipeline {

using JsonBody = nlohmann::ordered_json;

// Arrays and objects nest at most this deep in a request: no request needs more, and copying or
// printing a value recurses once a level (a batch line nested 100,000 deep overflowed the stack
// when its body was copied). Python's json, which vLLM's server reads with, stops near the same
// depth.
inline constexpr int kMaxJsonDepth = 1000;

// The JSON text as a value, a repeated key's last value kept (as nlohmann's parser keeps it).
// Throws nlohmann::json::parse_error where the text is not JSON, out_of_range for a number
// beyond a double, other_error for arrays and objects nested more than `max_depth` deep.
JsonBody read_json_body(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace pipeline
