// The simple generation loop behind `pipeline generate` and the tests (the server's scheduler
// is the flow graph's batch_window stage, not this): requests join a running batch at given
// decode steps; newly joined prompts are prefilled together in one Batch, then every running
// sequence decodes one token per step in one Batch, sampled with its own Sampler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/batch.h"
#include "model/finish_reason.h"
#include "model/kv_cache.h"
#include "model/model_runner.h"
#include "model/sampling.h"

namespace pipeline {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included when the model wants one
  SamplingParams sampling;
  int max_tokens = 0;       // 0: up to the end of the context
  bool ignore_eos = false;  // generate past end-of-sequence ids
  int join_step = 0;        // the decode step at which this request enters the running batch
};

struct GenerationResult {
  // Generated ids; with finish Stop the last one is the end-of-sequence id that stopped it.
  std::vector<int32_t> tokens;
  std::vector<SampledToken> sampled;  // one per generated token, with its logprobs
  FinishReason finish = FinishReason::Length;
  double prefill_seconds = 0.0;  // the prefill batch this request was part of
  double decode_seconds = 0.0;   // the decode steps this request was part of
};

// Called after every generated token with the request's index, in generation order.
using TokenCallback = std::function<void(size_t request, const SampledToken& token)>;

class Generator {
 public:
  // Request i's sampler is seeded with fallback_seed + i when its params carry no seed.
  Generator(ModelRunner& runner, uint64_t fallback_seed);

  // Runs every request to its end: an end-of-sequence id (unless ignore_eos), max_tokens, or
  // the end of the context (max_position_embeddings). Throws std::invalid_argument naming the
  // request on an empty prompt, a prompt that leaves no room in the context, a token outside
  // the vocabulary or invalid sampling parameters; std::runtime_error when the KV pool cannot
  // hold a request or runs out while requests run together.
  std::vector<GenerationResult> run(std::span<const GenerationRequest> requests,
                                    const TokenCallback& on_token = {});

  // The KV blocks of the last run; all free once run() has returned.
  const BlockManager& blocks() const { return blocks_; }

 private:
  struct Sequence;

  void check_request(size_t index, const GenerationRequest& request) const;
  void prefill(std::span<const GenerationRequest> requests, std::span<const size_t> joining,
               std::vector<Sequence>& running, std::vector<GenerationResult>& results,
               const TokenCallback& on_token);
  void decode_step(std::vector<Sequence>& running, std::vector<GenerationResult>& results,
                   const TokenCallback& on_token);
  // Samples the next token of each of `sequences` from its row of logits_ (in order) and marks the
  // sequences that it ends.
  void sample_next(std::span<Sequence> sequences, std::vector<GenerationResult>& results,
                   const TokenCallback& on_token);
  // Drops the finished sequences from `running` and frees their blocks.
  void retire_finished(std::vector<Sequence>& running);
  int max_new_tokens(const GenerationRequest& request) const;

  ModelRunner& runner_;
  uint64_t fallback_seed_;
  BlockManager blocks_;
  Batch batch_;
  Logits logits_;
};

}  // namespace pipeline
