// Per-request token sampling: penalties, temperature, top-k, top-p, min-p, a seeded RNG, and
// the chosen token's logprob with the top alternatives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/guided_decoding.h"
#include "model/row_argmax.h"

namespace pipeline {

// OpenAI's logit_bias: `bias` is added to the token's logit before sampling; -100 all but bans
// it, 100 all but forces it.
struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
};

struct SamplingParams {
  float temperature = 1.0f;           // 0 = greedy
  int top_k = 0;                      // 0 or -1 (as vLLM spells it) = off
  float top_p = 1.0f;                 // 1 = off
  float min_p = 0.0f;                 // 0 = off
  float repetition_penalty = 1.0f;    // 1 = off; over the last repeat_last_n tokens
  int repeat_last_n = -1;             // its window: -1 = all (vLLM's), 0 = off, 64 = llama.cpp's
  float presence_penalty = 0.0f;      // over the answer so far, all of it (not the prompt)
  float frequency_penalty = 0.0f;     // over the answer so far, all of it (not the prompt)
  std::optional<uint64_t> seed;       // same seed, same logits: same tokens
  bool logprobs = false;              // report the chosen token's logprob
  int top_logprobs = 0;               // alternatives to report beside the chosen token
  std::vector<LogitBias> logit_bias;  // before the penalties; logprobs stay the model's own
  // vLLM's allowed_token_ids: only these may be drawn (an end of sequence too only if listed);
  // empty: every token. Like logit_bias, it leaves logprobs the model's own.
  std::vector<int32_t> allowed_tokens;
  // vLLM's bad_words as token sequences (model/bad_words.h), which the caller fills: each one's
  // last token is banned wherever the answer so far (not the prompt) ends with the rest of it,
  // a one-token sequence's at every draw. Logprobs stay the model's own here too.
  std::vector<std::vector<int32_t>> bad_word_sequences;
  // The tokens that end the answer (the end-of-sequence ids unless ignored, vLLM's stop token
  // ids), which the caller fills; vLLM's min_tokens bans them from the first min_tokens draws.
  int min_tokens = 0;
  std::vector<int32_t> ending_tokens;
};

// An error message naming the first parameter outside its (OpenAI) range, or empty when all
// are valid: temperature [0, 2], top_p (0, 1], top_k >= -1, min_p [0, 1],
// repetition_penalty > 0, presence/frequency_penalty [-2, 2], top_logprobs [0, 20],
// repeat_last_n >= -1, logit_bias tokens >= 0 with biases [-100, 100], allowed tokens >= 0,
// bad word sequences of one token or more, each >= 0, min_tokens >= 0, ending tokens >= 0.
std::string validate(const SamplingParams& params);

// Whether the first draw from a vocabulary of `vocab_size` has a token left: one allowed (any,
// without allowed_tokens) that no one-token bad word sequence bans and that, where min_tokens
// holds them back, does not end the answer. Only the prefix of a longer sequence can ban its
// last token, and no prefix precedes the first draw; a later draw finding none is the
// sampler's error.
bool first_draw_possible(const SamplingParams& params, int vocab_size);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;           // log-softmax of the raw logits at `token`; 0 unless asked
  std::vector<TokenLogprob> top;  // the top_logprobs most likely tokens, most likely first
};

// The model's own logprob of a given `token` under `logits` and its `top_logprobs` likeliest
// tokens, as Sampler::sample reports them for the token it draws: echo's scores of a prompt.
// Throws std::invalid_argument on a token outside the logits or logits with no finite maximum.
SampledToken score_token(std::span<const float> logits, int32_t token, int top_logprobs);

// The row's argmax as greedy sampling takes it: the lowest id holding the largest value, NaNs
// aside. What a runner returns for a Batch that is argmax_only().
RowArgmax argmax_of(std::span<const float> logits);

// What the sampler throws when the request's own constraints (its bans, its guide) leave no token
// to draw: the client's request cannot be met, which is not the server's failure.
class NothingToDraw : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Draws tokens for one sequence: logit_bias, the repetition penalty over the history (or its
// last repeat_last_n tokens), presence and frequency penalties over the answer (OpenAI's), then
// greedy argmax (temperature 0) or top-k, softmax at the temperature, min-p, top-p and a draw
// from what is left, in vLLM's order. Scratch buffers are sized at the first call and reused after.
class Sampler {
 public:
  // `fallback_seed` seeds the RNG when params.seed is unset; a `guide` limits the draws to
  // the texts it allows (guided decoding). Throws std::invalid_argument with validate()'s message
  // on out-of-range parameters.
  Sampler(const SamplingParams& params, uint64_t fallback_seed,
          std::optional<GuidedDecoding> guide = std::nullopt);

  // `history` is the sequence so far for the penalties: its prompt, then the tokens this sampler
  // drew, in order.
  // Throws std::invalid_argument on empty logits, logits with no finite maximum, or a
  // history, logit_bias, allowed, bad word or ending token outside the vocabulary, and
  // NothingToDraw when the bans (allowed_tokens, bad words, min_tokens) or the guide leave
  // no token to draw.
  SampledToken sample(std::span<const float> logits, std::span<const int32_t> history);

  // Whether its next draw is the raw logits' argmax and nothing more: greedy, with no logit_bias,
  // penalty, ban or guide to change the logits and no logprobs to report. Such a draw needs only
  // the row's RowArgmax, which a runner finds where the logits are (SequenceChunk::argmax_only).
  bool draws_argmax() const;
  // The draw sample() makes when draws_argmax(), from the row's argmax. Throws
  // std::invalid_argument when the row has no finite maximum (as sample() does), and
  // std::logic_error when !draws_argmax().
  SampledToken take_argmax(const RowArgmax& argmax);

  const SamplingParams& params() const { return params_; }

 private:
  // One draw from `logits` as the parameters say, before the guide has its say.
  int32_t choose(std::span<const float> logits, std::span<const int32_t> history, float max_logit);
  // The draw again with every token the guide refuses masked out.
  int32_t choose_guided(std::span<const float> logits, std::span<const int32_t> history);
  // " among the tokens bad_words leaves", naming the bans in force; empty without any.
  std::string bans_named() const;
  // Greedy's argmax of scratch_, or a draw from it; `max_logit` is its largest value.
  int32_t pick(float max_logit);
  // Whether anything changes the logits before a draw: without, greedy takes their argmax.
  bool adjusts() const;
  // Whether a draw reports logprobs (the chosen token's, or alternatives).
  bool reports_logprobs() const { return params_.logprobs || params_.top_logprobs > 0; }
  // scratch_ = the logits with the penalties, logit_bias, allowed_tokens, the bad words' bans
  // and min_tokens' ban applied.
  void adjust(std::span<const float> logits, std::span<const int32_t> history);
  bool bans_ending() const { return drawn_ < params_.min_tokens && !params_.ending_tokens.empty(); }
  void ban_ending();
  void ban_bad_words(std::span<const int32_t> history);
  // The tokens this sampler drew: the history's last drawn_.
  std::span<const int32_t> answer(std::span<const int32_t> history) const {
    return history.last(std::min(history.size(), size_t(drawn_)));
  }
  bool penalises() const;             // any penalty that can change a logit
  bool penalises_repetition() const;  // a repetition penalty over a window of some tokens
  bool penalises_answer() const;      // a presence or frequency penalty
  void apply_penalties(std::span<const int32_t> history);
  // visit(token, count) once per distinct token of `tokens`; throws std::invalid_argument on one
  // outside the vocabulary.
  template <class Visit>
  void for_each_distinct(std::span<const int32_t> tokens, Visit&& visit);
  void apply_logit_bias();
  void keep_allowed();
  // The candidates' strict total order: higher scratch_ value first, then the lower id.
  bool more_likely(int32_t a, int32_t b) const {
    return scratch_[a] > scratch_[b] || (scratch_[a] == scratch_[b] && a < b);
  }
  size_t sort_likeliest(size_t n, double mass);
  int32_t draw(float max_logit);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::optional<GuidedDecoding> guide_;
  int drawn_ = 0;                         // tokens drawn so far
  std::vector<float> scratch_;            // per token id: penalised logit, then probability
  std::vector<int32_t> order_;            // candidate token ids
  std::vector<double> bucket_mass_;       // top-p: weight per bucket of weights
  std::vector<int32_t> token_counts_;     // per token id: occurrences, for for_each_distinct
  std::vector<int32_t> distinct_tokens_;  // the distinct tokens for_each_distinct visits
  std::vector<float> allowed_logits_;     // keep_allowed(): the allowed tokens' values
};

}  // namespace pipeline
