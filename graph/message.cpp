#include "graph/message.h"

namespace pipeline {

std::string describe_kinds(KindSet kinds) {
  static const char* const kNames[] = {"submitted requests", "tokenized sequences",
                                       "prefill batches",    "decode batches",
                                       "step results",       "stream events"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  std::string out;
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (kinds & (KindSet(1) << i)) out += (out.empty() ? "" : ", ") + std::string(kNames[i]);
  return out.empty() ? "nothing" : out;
}

}  // namespace pipeline
