// Request bodies for the OpenAI protocol tests (test_openai_request, test_openai_response): the
// served stories260K with a few server defaults, the smallest chat and completion bodies, and
// parsing them as the server does.
#pragma once

#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "server/openai_request.h"
#include "server/openai_response.h"
#include "tests/support/stories_tokenizer.h"

namespace pipeline::testing {

using json = ResponseJson;  // ordered: a response's members are compared in their order

inline ServedModel served_model() {
  ServedModel model;
  model.tokenizer = &stories_tokenizer();
  model.name = "stories260K";
  model.defaults.max_tokens = 77;
  model.defaults.params.temperature = 0.7f;
  model.defaults.params.top_p = 0.9f;
  model.defaults.params.repetition_penalty = 1.1f;
  return model;
}

inline json chat_body() {
  return {{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
}

inline json completion_body() {
  return {{"model", "stories260K"}, {"prompt", "Once upon a time"}};
}

inline ParsedRequest parse_chat(const json& body) {
  return parse_openai_request(Endpoint::ChatCompletions, body, served_model());
}

inline ParsedRequest parse_completion(const json& body) {
  return parse_openai_request(Endpoint::Completions, body, served_model());
}

// The error a body is refused with; fails the test when it is accepted.
inline RequestError rejection(Endpoint endpoint, const json& body) {
  try {
    parse_openai_request(endpoint, body, served_model());
  } catch (const ApiError& e) {
    return e.error();
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return {};
}

inline json with(json body, const std::string& key, json value) {
  body[key] = std::move(value);
  return body;
}

}  // namespace pipeline::testing
