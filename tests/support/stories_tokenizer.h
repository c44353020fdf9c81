// stories260K's tokenizer (a vocabulary of 512) from the shared test data, loaded once, for
// tests of the API's token handling.
#pragma once

#include "io/tokenizer.h"
#include "tests/support/shared_data.h"

namespace pipeline::testing {

inline const Tokenizer& stories_tokenizer() {
  static const Tokenizer tokenizer(shared_path("models/stories260K/tokenizer.model"));
  return tokenizer;
}

}  // namespace pipeline::testing
