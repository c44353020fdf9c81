// What travels along the flow graph's edges. Every node takes and sends a Message; each stage
// declares which kinds it accepts and produces, and an edge only carries the kinds its target
// accepts (graph_plan checks that every kind produced has somewhere to go).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "graph/request.h"
#include "graph/sequence.h"
#include "model/batch.h"
#include "model/sampling.h"

namespace pipeline {

// A request as submitted, before tokenization (the graph's input).
struct Submitted {
  SequencePtr seq;
};

// A tokenized sequence ready to be scheduled.
struct Tokenized {
  SequencePtr seq;
};

// One forward pass the scheduler chose: `seqs[i]` owns `batch.seqs[i]`. A prefill batch
// computes prompt chunks, and the running sequences' decode tokens ride along: its last
// `decoding` sequences bring one token each.
struct PrefillBatch {
  std::vector<SequencePtr> seqs;
  Batch batch;
  int decoding = 0;
};
struct DecodeBatch {
  std::vector<SequencePtr> seqs;
  Batch batch;
};

// A token sampled for one sequence; `index` counts the sequence's generated tokens from 0.
struct SampledOutput {
  SequencePtr seq;
  int index = 0;
  SampledToken sampled;
  std::optional<FinishReason> finish;              // set when this token ends the sequence
  std::chrono::steady_clock::time_point drawn_at;  // the end of the forward pass that drew it
  // Request::prompt_logprobs, with the first generated token: the scores of prompt tokens 1 ..
  // prompt_len - 1.
  std::vector<SampledToken> prompt_scores;
};

// What a forward pass produced, for the scheduler (the loop edge) and the detokenizer.
struct StepResult {
  bool prefill = false;
  std::vector<SampledOutput> outputs;
  std::vector<SequencePtr> failed;  // sequences whose step threw; their sinks have the error
  // Decoding sequences that rode along a prefill pass that threw: they did not advance, and
  // decode again in the next pass (a failing prompt does not take the running streams with it).
  std::vector<SequencePtr> retry;
  int batch_tokens = 0;  // tokens the forward pass ran
  double seconds = 0.0;
  bool pass_failed = false;  // the forward pass itself threw (logged where it did)
};

// Results on their way to sinks, numbered per sequence so that emit delivers them in order.
struct StreamEvent {
  SequencePtr seq;
  uint64_t index = 0;
  std::variant<Delta, Completion, RequestError> payload;
};
struct StreamEvents {
  std::vector<StreamEvent> events;
};

using Message =
    std::variant<Submitted, Tokenized, PrefillBatch, DecodeBatch, StepResult, StreamEvents>;

// A set of message kinds (bit i: the variant's alternative i).
using KindSet = uint32_t;

// The position of T among Message's alternatives.
template <typename T, size_t I = 0>
constexpr size_t message_index() {
  if constexpr (I == std::variant_size_v<Message>) {
    static_assert(I != std::variant_size_v<Message>, "not a Message alternative");
    return I;
  } else if constexpr (std::is_same_v<T, std::variant_alternative_t<I, Message>>) {
    return I;
  } else {
    return message_index<T, I + 1>();
  }
}

template <typename T>
constexpr KindSet kind_of() {
  return KindSet(1) << message_index<T>();
}

template <typename... T>
constexpr KindSet kinds() {
  return (kind_of<T>() | ... | KindSet(0));
}

inline KindSet kind_of(const Message& message) {
  return KindSet(1) << message.index();
}

// "prefill batches, decode batches", for messages about graphs.
std::string describe_kinds(KindSet kinds);

// The sequences a message carries that are still to be answered: a step result's outputs and
// retries (its failed ones have their error already), a stream event's sequence.
std::vector<SequencePtr> carried_sequences(const Message& message);

}  // namespace pipeline
