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

// The JSON text as a value, a repeated key's last value kept (as nlohmann's parser keeps it).
// Throws nlohmann::json::parse_error where the text is not JSON, out_of_range for a number
// beyond a double, other_error for arrays and objects nested more than 1,000 deep.
JsonBody read_json_body(std::string_view text);

}  // namespace pipeline
