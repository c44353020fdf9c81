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

std::vector<SequencePtr> carried_sequences(const Message& message) {
  if (const auto* m = std::get_if<Submitted>(&message)) return {m->seq};
  if (const auto* m = std::get_if<Tokenized>(&message)) return {m->seq};
  if (const auto* m = std::get_if<PrefillBatch>(&message)) return m->seqs;
  if (const auto* m = std::get_if<DecodeBatch>(&message)) return m->seqs;
  std::vector<SequencePtr> seqs;
  if (const auto* m = std::get_if<StepResult>(&message)) {
    for (const SampledOutput& out : m->outputs) seqs.push_back(out.seq);
    seqs.insert(seqs.end(), m->retry.begin(), m->retry.end());
  } else {
    for (const StreamEvent& event : std::get<StreamEvents>(message).events)
      seqs.push_back(event.seq);
  }
  return seqs;
}

}  // namespace pipeline
