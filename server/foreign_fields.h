// Fields of other servers' request bodies (llama.cpp's server, vLLM's) that clients written for
// them also send to the OpenAI routes, and which this server does not implement. A body is
// otherwise read field by field and a field no reader asks for is ignored, as vLLM ignores it;
// these are not, because ignoring them would give an answer, or an answer's shape, the client did
// not ask for. Each is refused unless at a value that changes nothing here, and the 400 names
// what to send instead where this server has an equivalent.
#pragma once

#include "model/sampling.h"
#include "server/json_body.h"

namespace pipeline {

// Throws ApiError 400 naming the first such field at a value that would change something.
// `sampling`: the request's parameters as read, for fields whose effect depends on them.
void refuse_foreign_fields(const JsonBody& body, const SamplingParams& sampling);

}  // namespace pipeline
