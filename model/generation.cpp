#include "model/generation.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>

#include "model/seconds.h"

namespace pipeline {

namespace {

using Clock = std::chrono::steady_clock;

std::string request_name(size_t index) {
  return "request " + std::to_string(index) + ": ";
}

}  // namespace

struct Generator::Sequence {
  size_t request = 0;           // index into the run's requests and results
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int max_new = 0;              // generated tokens allowed (max_tokens, capped by the context)
  bool ignore_eos = false;
  std::vector<int32_t> block_table;
  Sampler sampler;
  bool finished = false;
};

Generator::Generator(ModelRunner& runner, uint64_t fallback_seed)
    : runner_(runner), fallback_seed_(fallback_seed), blocks_(runner.kv_shape().num_blocks) {}

int Generator::max_new_tokens(const GenerationRequest& request) const {
  // A sequence holds at most max_position_embeddings tokens; the last one is sampled but
  // never fed back, so it needs no position of its own in the KV cache.
  const int room = runner_.config().max_position_embeddings - int(request.prompt.size());
  return request.max_tokens > 0 ? std::min(request.max_tokens, room) : room;
}

void Generator::check_request(size_t index, const GenerationRequest& request) const {
  const LlamaConfig& config = runner_.config();
  const KvCacheShape& kv = runner_.kv_shape();
  const int context = config.max_position_embeddings;
  const int prompt_length = int(request.prompt.size());
  if (request.prompt.empty())
    throw std::invalid_argument(request_name(index) + "the prompt is empty");
  if (prompt_length >= context)
    throw std::invalid_argument(request_name(index) + "the prompt has " +
                                std::to_string(prompt_length) +
                                " tokens, which leaves no room in the context of " +
                                std::to_string(context) + " positions");
  for (size_t i = 0; i < request.prompt.size(); ++i)
    if (request.prompt[i] < 0 || request.prompt[i] >= config.vocab_size)
      throw std::invalid_argument(
          request_name(index) + "prompt token " + std::to_string(request.prompt[i]) + " at index " +
          std::to_string(i) + " is outside the vocabulary of " + std::to_string(config.vocab_size));
  if (request.max_tokens < 0)
    throw std::invalid_argument(request_name(index) +
                                "max_tokens must be at least 0 (0 = up to the end of the "
                                "context), got " +
                                std::to_string(request.max_tokens));
  if (request.join_step < 0)
    throw std::invalid_argument(request_name(index) + "join_step must be at least 0, got " +
                                std::to_string(request.join_step));
  if (std::string error = validate(request.sampling); !error.empty())
    throw std::invalid_argument(request_name(index) + error);

  // Every token but the last generated one goes into the KV cache.
  const int cached_tokens = prompt_length + max_new_tokens(request) - 1;
  if (kv.blocks_for(cached_tokens) > blocks_.num_total())
    throw std::runtime_error(request_name(index) + "needs " +
                             std::to_string(kv.blocks_for(cached_tokens)) + " KV blocks for " +
                             std::to_string(cached_tokens) + " tokens, the pool holds only " +
                             std::to_string(blocks_.num_total()));
}

std::vector<GenerationResult> Generator::run(std::span<const GenerationRequest> requests,
                                             const TokenCallback& on_token) {
  for (size_t i = 0; i < requests.size(); ++i) check_request(i, requests[i]);
  blocks_ = BlockManager(runner_.kv_shape().num_blocks);  // a run that threw left blocks taken

  // Requests in the order they join; equal steps keep their given order.
  std::vector<size_t> waiting(requests.size());
  std::iota(waiting.begin(), waiting.end(), size_t(0));
  std::stable_sort(waiting.begin(), waiting.end(), [&](size_t a, size_t b) {
    return requests[a].join_step < requests[b].join_step;
  });

  std::vector<GenerationResult> results(requests.size());
  std::vector<Sequence> running;
  size_t next_waiting = 0;
  int step = 0;
  while (next_waiting < waiting.size() || !running.empty()) {
    // Nothing to decode until the next request joins: skip ahead to its step.
    if (running.empty()) step = std::max(step, requests[waiting[next_waiting]].join_step);
    const size_t first_joining = next_waiting;
    while (next_waiting < waiting.size() && requests[waiting[next_waiting]].join_step <= step)
      ++next_waiting;
    if (next_waiting > first_joining)
      prefill(requests,
              std::span<const size_t>(waiting).subspan(first_joining, next_waiting - first_joining),
              running, results, on_token);
    if (!running.empty()) decode_step(running, results, on_token);
    ++step;
  }
  return results;
}

void Generator::prefill(std::span<const GenerationRequest> requests,
                        std::span<const size_t> joining, std::vector<Sequence>& running,
                        std::vector<GenerationResult>& results, const TokenCallback& on_token) {
  const size_t first = running.size();
  batch_.seqs.clear();
  for (size_t index : joining) {
    const GenerationRequest& request = requests[index];
    Sequence& seq = running.emplace_back(Sequence{
        .request = index,
        .tokens = request.prompt,
        .max_new = max_new_tokens(request),
        .ignore_eos = request.ignore_eos,
        .block_table = {},
        .sampler = Sampler(request.sampling, fallback_seed_ + index),
    });
    if (!blocks_.ensure_capacity(seq.block_table, int(seq.tokens.size()),
                                 runner_.kv_shape().block_size))
      throw std::runtime_error(request_name(index) + "the KV cache is full (" +
                               std::to_string(blocks_.num_free()) + " of " +
                               std::to_string(blocks_.num_total()) +
                               " blocks free) with the requests already running; run fewer "
                               "requests together or give the runner more KV blocks");
    batch_.seqs.push_back({.tokens = seq.tokens,
                           .start_pos = 0,
                           .block_table = seq.block_table,
                           .all_logits = false,
                           .argmax_only = seq.sampler.draws_argmax()});
  }

  const Clock::time_point start = Clock::now();
  runner_.forward(batch_, logits_);
  std::span<Sequence> joined = std::span(running).subspan(first);
  sample_next(joined, results, on_token);
  const double elapsed = seconds_since(start);
  for (const Sequence& seq : joined) results[seq.request].prefill_seconds = elapsed;
  retire_finished(running);
}

void Generator::decode_step(std::vector<Sequence>& running, std::vector<GenerationResult>& results,
                            const TokenCallback& on_token) {
  batch_.seqs.resize(running.size());
  for (size_t i = 0; i < running.size(); ++i) {
    Sequence& seq = running[i];
    const int position = int(seq.tokens.size()) - 1;  // the last token, not yet in the cache
    if (!blocks_.ensure_capacity(seq.block_table, position + 1, runner_.kv_shape().block_size))
      throw std::runtime_error(request_name(seq.request) + "the KV cache ran out (all " +
                               std::to_string(blocks_.num_total()) + " blocks in use by " +
                               std::to_string(running.size()) +
                               " running requests); run fewer requests together or give the "
                               "runner more KV blocks");
    SequenceChunk& chunk = batch_.seqs[i];
    chunk.tokens.assign(1, seq.tokens.back());
    chunk.start_pos = position;
    chunk.block_table = seq.block_table;
    chunk.all_logits = false;
    chunk.argmax_only = seq.sampler.draws_argmax();
  }

  const Clock::time_point start = Clock::now();
  runner_.forward(batch_, logits_);
  sample_next(running, results, on_token);
  const double elapsed = seconds_since(start);
  for (const Sequence& seq : running) results[seq.request].decode_seconds += elapsed;
  retire_finished(running);
}

void Generator::sample_next(std::span<Sequence> sequences, std::vector<GenerationResult>& results,
                            const TokenCallback& on_token) {
  if (logits_.rows() != int(sequences.size()) || logits_.vocab != runner_.config().vocab_size)
    throw std::logic_error("ModelRunner::forward returned " + std::to_string(logits_.rows()) +
                           " rows of " + std::to_string(logits_.vocab) + " logits for " +
                           std::to_string(sequences.size()) + " sequences of vocabulary " +
                           std::to_string(runner_.config().vocab_size));
  for (size_t row = 0; row < sequences.size(); ++row) {
    Sequence& seq = sequences[row];
    GenerationResult& result = results[seq.request];
    SampledToken sampled = logits_.argmax.empty()
                               ? seq.sampler.sample(logits_.row(int(row)), seq.tokens)
                               : seq.sampler.take_argmax(logits_.argmax[row]);
    const int32_t token = sampled.token;
    seq.tokens.push_back(token);
    result.tokens.push_back(token);
    result.sampled.push_back(std::move(sampled));
    if (on_token) on_token(seq.request, result.sampled.back());

    if (!seq.ignore_eos && runner_.config().is_eos(token)) {
      result.finish = FinishReason::Stop;
      seq.finished = true;
    } else if (int(result.tokens.size()) >= seq.max_new) {
      result.finish = FinishReason::Length;
      seq.finished = true;
    }
  }
}

void Generator::retire_finished(std::vector<Sequence>& running) {
  for (Sequence& seq : running)
    if (seq.finished) blocks_.release_all(seq.block_table);
  std::erase_if(running, [](const Sequence& seq) { return seq.finished; });
}

}  // namespace pipeline
