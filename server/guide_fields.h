// The guided-decoding fields of a completion request, which hold its answer to a JSON value,
// a pattern or a grammar: response_format (json_object, json_schema), vLLM's guided_json,
// guided_regex, guided_choice, guided_grammar and structured_outputs, and llama.cpp's
// json_schema and grammar. parse_openai_request (openai_request.cpp) asks which one a request
// gives, refuses what cannot go with it, and compiles it last, as the costly part.
#pragma once

#include <string>
#include <vector>

#include "graph/request.h"
#include "server/json_body.h"

namespace pipeline {

// The params of the fields that ask for a guide (response_format json_object or json_schema,
// guided_json, guided_regex, guided_choice, guided_grammar, llama.cpp's json_schema and grammar,
// structured_outputs json, json_object, regex, choice or grammar), found without compiling any,
// so that a second one, or a parameter that cannot go with one, is refused before a guide's cost
// is paid. guided_whitespace_pattern is refused rather than ignored.
std::vector<std::string> guides_asked(const JsonBody& body);

// The guide `param` (one of guides_asked()'s) asks for, compiled into the request.
void read_guide(const JsonBody& body, const std::string& param, Request& request);

}  // namespace pipeline
