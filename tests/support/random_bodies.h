// Random request bodies, for tests that throw arbitrary bodies at a parser: each must be answered
// or refused with an ApiError, never with another exception (which the server could only answer
// with a 500).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"

namespace pipeline::testing {

// What the values are drawn from, besides the kinds every test wants (null, booleans, the
// extreme integers, short odd strings, empty arrays).
struct RandomJsonShape {
  int min_int = -3;  // integers from [min_int, max_int]
  int max_int = 3;
  double real_span = 1e12;        // reals from (-real_span, real_span)
  int max_array = 2;              // arrays of up to this many values
  std::vector<const char*> keys;  // objects hold some of these keys
};

// A value of a random kind, nested up to `depth`.
inline nlohmann::json random_json(std::mt19937& rng, int depth, const RandomJsonShape& shape) {
  using nlohmann::json;
  switch (std::uniform_int_distribution<int>(0, depth > 0 ? 9 : 7)(rng)) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return std::uniform_int_distribution<int>(shape.min_int, shape.max_int)(rng);
    case 3:
      return std::numeric_limits<int64_t>::min();
    case 4:
      return ~uint64_t{0};
    case 5:
      return std::uniform_real_distribution<double>(-shape.real_span, shape.real_span)(rng);
    case 6:
      return std::string(rng() % 3, "ab\n\xff"[rng() % 4]);
    case 7:
      return json::array();
    case 8: {
      json array = json::array();
      for (int i = int(rng() % uint32_t(shape.max_array + 1)); i > 0; --i)
        array.push_back(random_json(rng, depth - 1, shape));
      return array;
    }
    default: {
      json object = json::object();
      for (const char* key : shape.keys)
        if (rng() % 2 == 0) object[key] = random_json(rng, depth - 1, shape);
      return object;
    }
  }
}

// Runs `call` (which reads `body`): it may refuse the body with an ApiError, and nothing else.
template <typename Call>
void expect_answer_or_api_error(const nlohmann::json& body, Call call) {
  try {
    call();
  } catch (const ApiError&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an ApiError: " << e.what() << "\nbody: "
                  << body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

}  // namespace pipeline::testing
