// Feeding text to a SchemaPrefix a byte at a time, for the tests of JSON mode and JSON schemas.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "io/json_schema.h"
#include "io/schema_prefix.h"

namespace pipeline::testing {

// How many leading bytes of `text` the schema's recogniser accepts, and whether it is then whole.
struct Fed {
  size_t accepted = 0;
  bool complete = false;
};

inline Fed feed_all(const JsonSchema& schema, const std::string& text) {
  SchemaPrefix prefix(schema);
  Fed fed;
  for (char c : text) {
    if (!prefix.feed(uint8_t(c))) return fed;
    ++fed.accepted;
  }
  fed.complete = prefix.complete();
  return fed;
}

// Finishes an accepted prefix by appending, again and again, the first byte of `tries` that the
// recogniser accepts. With tries that lead out of every string and container (closing bytes
// first), this ends with a whole value unless some accepted prefix cannot be finished.
inline std::string finish(const JsonSchema& schema, const std::string& prefix_text,
                          const std::string& tries) {
  SchemaPrefix prefix(schema);
  EXPECT_TRUE(prefix.feed(prefix_text)) << prefix_text;
  std::string text = prefix_text;
  for (int steps = 0; !prefix.complete() && steps < 3000; ++steps) {
    bool moved = false;
    for (char c : tries) {
      SchemaPrefix trial = prefix;
      if (trial.feed(uint8_t(c))) {
        prefix = trial;
        text += c;
        moved = true;
        break;
      }
    }
    if (!moved) {
      ADD_FAILURE() << "no byte continues the accepted prefix "
                    << nlohmann::json(text).dump(-1, ' ', false,
                                                 nlohmann::json::error_handler_t::replace);
      break;
    }
  }
  EXPECT_TRUE(prefix.complete()) << text;
  return text;
}

}  // namespace pipeline::testing
