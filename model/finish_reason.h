// Why a sequence stopped generating, in OpenAI's words.
#pragma once

namespace pipeline {

enum class FinishReason {
  Stop,    // an end-of-sequence token or a stop string
  Length,  // max_tokens or the end of the context
};

inline const char* finish_reason_name(FinishReason reason) {
  return reason == FinishReason::Stop ? "stop" : "length";
}

}  // namespace pipeline
