// Fields of other servers' request bodies (llama.cpp's server, vLLM's beam search) that clients
// written for them also send to the OpenAI routes, and which this server does not implement.
// A body is otherwise read field by field and a field no reader asks for is ignored, as vLLM
// ignores it; these are not, because ignoring them would give an answer the client did not ask
// for. Each is refused unless at its neutral value, and the 400 names what to send instead where
// this server has an equivalent.
#pragma once

#include "server/json_body.h"

namespace pipeline {

// Throws ApiError 400 naming the first such field not at its neutral value.
void refuse_foreign_fields(const JsonBody& body);

}  // namespace pipeline
