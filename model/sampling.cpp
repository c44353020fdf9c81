#include "model/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/fast_exp.h"

namespace pipeline {

namespace {

std::string out_of_range(const char* name, const char* range, double value) {
  std::ostringstream message;
  message << name << " must be " << range << ", got " << value;
  return message.str();
}

// A uniform double in [0, 1) from the top 53 bits of one raw 64-bit draw: the same on every
// standard library, unlike std::uniform_real_distribution.
double uniform_unit(std::mt19937_64& rng) {
  return double(rng() >> 11) * 0x1.0p-53;
}

// The largest value, NaNs skipped (-inf when there is nothing else). Sixteen independent running
// maxima make the loop vector code: one chain through every element runs at the latency of a
// compare per element, seven times slower over a 32,000-word vocabulary.
float max_value(std::span<const float> values) {
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -INFINITY);
  size_t i = 0;
  for (; i + kLanes <= values.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) lane[j] = std::max(lane[j], values[i + j]);
  float max = -INFINITY;
  for (float m : lane) max = std::max(max, m);
  for (; i < values.size(); ++i) max = std::max(max, values[i]);
  return max;
}

// The lowest id holding the largest value: ties go to the lower id, as in every argmax here.
int32_t first_argmax(std::span<const float> values, float max) {
  return int32_t(std::find(values.begin(), values.end(), max) - values.begin());
}

// exp(x) for the softmax of logits already shifted by their maximum (x <= 0): vector code, and
// exactly 0 where the float result would underflow (a -inf logit, or far below the maximum).
float shifted_exp(float x) {
  return x > -87.0f ? cpu::fast_exp(x) : 0.0f;
}

// The sum of f(value) over `values` in double, in sixteen interleaved partial sums (vector
// code) added in a fixed order, so the result is the same on every run.
template <typename F>
double sum_over(std::span<const float> values, F f) {
  constexpr size_t kLanes = 16;
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= values.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) lane[j] += double(f(values[i + j]));
  double sum = 0.0;
  for (double partial : lane) sum += partial;
  for (; i < values.size(); ++i) sum += double(f(values[i]));
  return sum;
}

// Softmax weights lie in [0, 1]; their float bits grow with their value, and bits >> 20 keep the
// exponent and three mantissa bits: buckets an eighth of an octave wide, in order of weight.
constexpr int kWeightBuckets = (0x3F800000 >> 20) + 1;  // up to 1.0f's bucket
int weight_bucket(float weight) {
  return std::min(int(std::bit_cast<uint32_t>(weight) >> 20), kWeightBuckets - 1);
}

// log(sum(exp(logits))) of the raw logits: the model's own distribution, which logprobs report.
double log_normaliser(std::span<const float> logits, float max_logit) {
  // float exp (a couple of ulp), summed in double
  const double sum = sum_over(logits, [&](float logit) { return shifted_exp(logit - max_logit); });
  return max_logit + std::log(sum);
}

// The `count` most likely tokens of the raw logits, most likely first, ties broken by the lower
// id so that the report is the same everywhere (NaNs skipped). One pass keeps them in `top`,
// sorted, their logits in place of logprobs until the end: a token enters only when it beats
// the list's last, which after the first few thousand ids is rare.
void report_alternatives(std::span<const float> logits, double log_z, size_t count,
                         std::vector<TokenLogprob>& top) {
  count = std::min(count, logits.size());
  top.clear();
  if (count == 0) return;
  top.reserve(count + 1);
  for (size_t id = 0; id < logits.size(); ++id) {
    const float logit = logits[id];
    if (std::isnan(logit)) continue;
    // Ids come in increasing order, so an equal logit never beats one already listed.
    if (top.size() == count && !(logit > top.back().logprob)) continue;
    auto at =
        std::upper_bound(top.begin(), top.end(), logit,
                         [](float value, const TokenLogprob& t) { return value > t.logprob; });
    top.insert(at, {int32_t(id), logit});
    if (top.size() > count) top.pop_back();
  }
  for (TokenLogprob& t : top) t.logprob = float(double(t.logprob) - log_z);
}

// What sample() and take_argmax() throw for a row without a finite maximum.
constexpr char kNoFiniteMaximum[] = "Sampler::sample: logits have no finite maximum";

}  // namespace

std::string validate(const SamplingParams& p) {
  // Written as !(inside) so that NaN is rejected too.
  if (!(p.temperature >= 0.0f && p.temperature <= 2.0f))
    return out_of_range("temperature", "between 0 and 2", p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return out_of_range("top_p", "greater than 0 and at most 1", p.top_p);
  if (p.top_k < -1) return out_of_range("top_k", "-1 or 0 (off) or a count", p.top_k);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return out_of_range("min_p", "between 0 and 1", p.min_p);
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty)))
    return out_of_range("repetition_penalty", "greater than 0", p.repetition_penalty);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return out_of_range("presence_penalty", "between -2 and 2", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return out_of_range("frequency_penalty", "between -2 and 2", p.frequency_penalty);
  if (p.top_logprobs < 0 || p.top_logprobs > 20)
    return out_of_range("top_logprobs", "between 0 and 20", p.top_logprobs);
  if (p.repeat_last_n < -1)
    return out_of_range("repeat_last_n", "-1 (whole history), 0 (off) or a window length",
                        p.repeat_last_n);
  for (const LogitBias& b : p.logit_bias) {
    if (b.token < 0) return out_of_range("logit_bias", "keyed by token ids of 0 or more", b.token);
    if (!(b.bias >= -100.0f && b.bias <= 100.0f))
      return out_of_range("logit_bias", "between -100 and 100", b.bias);
  }
  for (int32_t token : p.allowed_tokens)
    if (token < 0) return out_of_range("allowed_token_ids", "token ids of 0 or more", token);
  for (const std::vector<int32_t>& sequence : p.bad_word_sequences) {
    if (sequence.empty())
      return "bad_words must be sequences of one token or more, got an empty one";
    for (int32_t token : sequence)
      if (token < 0) return out_of_range("bad_words", "token ids of 0 or more", token);
  }
  if (p.min_tokens < 0) return out_of_range("min_tokens", "0 or more", p.min_tokens);
  for (int32_t token : p.ending_tokens)
    if (token < 0) return out_of_range("stop_token_ids", "token ids of 0 or more", token);
  return {};
}

bool first_draw_possible(const SamplingParams& p, int vocab_size) {
  const size_t vocab = size_t(std::max(vocab_size, 0));
  std::vector<bool> banned(vocab, false);
  const auto ban = [&](int32_t token) {
    if (size_t(token) < vocab) banned[size_t(token)] = true;
  };
  for (const std::vector<int32_t>& sequence : p.bad_word_sequences)
    if (sequence.size() == 1) ban(sequence[0]);
  if (p.min_tokens > 0) std::ranges::for_each(p.ending_tokens, ban);
  const auto open = [&](int32_t token) { return size_t(token) < vocab && !banned[size_t(token)]; };
  if (!p.allowed_tokens.empty()) return std::ranges::any_of(p.allowed_tokens, open);
  return std::find(banned.begin(), banned.end(), false) != banned.end();
}

SampledToken score_token(std::span<const float> logits, int32_t token, int top_logprobs) {
  if (token < 0 || size_t(token) >= logits.size())
    throw std::invalid_argument("score_token: token " + std::to_string(token) +
                                " is outside the vocabulary of " + std::to_string(logits.size()));
  const float max_logit = max_value(logits);
  if (!std::isfinite(max_logit))
    throw std::invalid_argument("score_token: logits have no finite maximum");
  const double log_z = log_normaliser(logits, max_logit);
  SampledToken out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - log_z);
  report_alternatives(logits, log_z, size_t(std::max(top_logprobs, 0)), out.top);
  return out;
}

Sampler::Sampler(const SamplingParams& params, uint64_t fallback_seed,
                 std::optional<GuidedDecoding> guide)
    : params_(params), rng_(params.seed.value_or(fallback_seed)), guide_(std::move(guide)) {
  if (std::string error = validate(params); !error.empty()) throw std::invalid_argument(error);
  // A closed object allows only an end of sequence, which min_tokens may still ban.
  if (guide_ && params.min_tokens > 0 && !params.ending_tokens.empty())
    throw std::invalid_argument("min_tokens cannot be combined with guided decoding");
}

RowArgmax argmax_of(std::span<const float> logits) {
  const float max = max_value(logits);
  return {first_argmax(logits, max), max};
}

SampledToken Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) throw std::invalid_argument("Sampler::sample: empty logits");
  SampledToken out;
  // The normaliser costs an exp per vocabulary entry, more than the rest of a greedy step:
  // only logprobs need it.
  const float max_logit = max_value(logits);
  if (!std::isfinite(max_logit)) throw std::invalid_argument(kNoFiniteMaximum);
  const bool report = reports_logprobs();
  const double log_z = report ? log_normaliser(logits, max_logit) : 0.0;
  if (report) report_alternatives(logits, log_z, size_t(params_.top_logprobs), out.top);

  out.token = choose(logits, history, max_logit);
  if (guide_) {
    // Masking costs a pass over the vocabulary, so it is done only when the guide refuses the
    // first draw, as llama.cpp applies grammars. Greedy gets the masked argmax; a plain draw
    // (no top-k, top-p or min-p) gets the masked distribution exactly, p(t) + (1 - P) p(t) / P
    // for an allowed t, P the allowed mass; with those filters the first draw's candidates are
    // cut from the unmasked distribution, as in llama.cpp.
    if (!guide_->allows(out.token)) out.token = choose_guided(logits, history);
    guide_->advance(out.token);
  }
  if (report) out.logprob = float(double(logits[out.token]) - log_z);
  ++drawn_;
  return out;
}

bool Sampler::draws_argmax() const {
  return params_.temperature == 0.0f && !adjusts() && !guide_ && !reports_logprobs();
}

SampledToken Sampler::take_argmax(const RowArgmax& argmax) {
  if (!draws_argmax())
    throw std::logic_error("Sampler::take_argmax: this sampler's draws need the whole row");
  if (!std::isfinite(argmax.value)) throw std::invalid_argument(kNoFiniteMaximum);
  ++drawn_;
  return {argmax.token, 0.0f, {}};
}

int32_t Sampler::choose(std::span<const float> logits, std::span<const int32_t> history,
                        float max_logit) {
  if (params_.temperature == 0.0f && !adjusts())
    return first_argmax(logits, max_logit);  // the raw logits' argmax: no copy needed
  adjust(logits, history);
  const float adjusted_max = max_value(scratch_);
  // Every token banned: greedy would take token 0 and a draw its first candidate, banned too.
  if (!std::isfinite(adjusted_max))
    throw NothingToDraw(
        "no token can be drawn: allowed_token_ids, bad_words and min_tokens ban every one");
  return pick(adjusted_max);
}

int32_t Sampler::choose_guided(std::span<const float> logits, std::span<const int32_t> history) {
  adjust(logits, history);
  guide_->mask(scratch_);
  const float max_logit = max_value(scratch_);
  if (!std::isfinite(max_logit))  // nothing allowed, or nothing allowed that can be drawn
    throw NothingToDraw("no token the model can draw continues " + guide_->held_to() +
                        bans_named());
  return pick(max_logit);
}

// What else took tokens from a guided draw, for its error: the guide alone may not be at fault.
std::string Sampler::bans_named() const {
  std::vector<std::string> bans;
  if (!params_.allowed_tokens.empty()) bans.push_back("allowed_token_ids");
  if (!params_.bad_word_sequences.empty()) bans.push_back("bad_words");
  if (bans_ending()) bans.push_back("min_tokens");
  if (bans.empty()) return "";
  std::string named = " among the tokens ";
  for (size_t i = 0; i < bans.size(); ++i) {
    if (i > 0) named += i + 1 == bans.size() ? " and " : ", ";
    named += bans[i];
  }
  named += bans.size() == 1 ? " leaves" : " leave";
  return named;
}

int32_t Sampler::pick(float max_logit) {
  return params_.temperature == 0.0f ? first_argmax(scratch_, max_logit) : draw(max_logit);
}

bool Sampler::adjusts() const {
  return penalises() || !params_.logit_bias.empty() || !params_.allowed_tokens.empty() ||
         !params_.bad_word_sequences.empty() || bans_ending();
}

void Sampler::adjust(std::span<const float> logits, std::span<const int32_t> history) {
  scratch_.assign(logits.begin(), logits.end());
  apply_logit_bias();  // before the penalties, as vLLM applies it
  apply_penalties(history);
  if (!params_.allowed_tokens.empty()) keep_allowed();
  if (!params_.bad_word_sequences.empty()) ban_bad_words(history);
  if (bans_ending()) ban_ending();
}

// Every logit -inf but the allowed tokens', which keep theirs: a pass over the vocabulary and
// one over the list, whatever its length.
void Sampler::keep_allowed() {
  allowed_logits_.clear();
  for (int32_t token : params_.allowed_tokens) {
    if (size_t(token) >= scratch_.size())
      throw std::invalid_argument("Sampler::sample: allowed token " + std::to_string(token) +
                                  " is outside the vocabulary of " +
                                  std::to_string(scratch_.size()));
    allowed_logits_.push_back(scratch_[size_t(token)]);
  }
  std::fill(scratch_.begin(), scratch_.end(), -INFINITY);
  for (size_t i = 0; i < params_.allowed_tokens.size(); ++i)
    scratch_[size_t(params_.allowed_tokens[i])] = allowed_logits_[i];
}

// Every sequence's prefix is compared with the answer's end at every draw: a request's
// sequences hold at most 1024 tokens (model/bad_words.h), little beside the pass over the
// vocabulary. vLLM bans them after allowed_tokens but before logit_bias and the penalties; as
// -inf stays -inf through those, the order here draws the same.
void Sampler::ban_bad_words(std::span<const int32_t> history) {
  const std::span<const int32_t> drawn = answer(history);
  for (const std::vector<int32_t>& sequence : params_.bad_word_sequences) {
    const std::span<const int32_t> prefix(sequence.data(), sequence.size() - 1);
    if (prefix.size() > drawn.size() || !std::ranges::equal(prefix, drawn.last(prefix.size())))
      continue;
    const int32_t token = sequence.back();
    if (size_t(token) >= scratch_.size())
      throw std::invalid_argument("Sampler::sample: bad word token " + std::to_string(token) +
                                  " is outside the vocabulary of " +
                                  std::to_string(scratch_.size()));
    scratch_[size_t(token)] = -INFINITY;
  }
}

void Sampler::ban_ending() {
  for (int32_t token : params_.ending_tokens) {
    if (size_t(token) >= scratch_.size())
      throw std::invalid_argument("Sampler::sample: ending token " + std::to_string(token) +
                                  " is outside the vocabulary of " +
                                  std::to_string(scratch_.size()));
    scratch_[size_t(token)] = -INFINITY;
  }
}

bool Sampler::penalises() const {
  return penalises_repetition() || penalises_answer();
}

bool Sampler::penalises_repetition() const {
  return params_.repetition_penalty != 1.0f && params_.repeat_last_n != 0;
}

bool Sampler::penalises_answer() const {
  return params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
}

// The repetition penalty, once per distinct token of the sequence (its prompt's too), all of it
// as vLLM applies it or its last repeat_last_n tokens as llama.cpp does; then OpenAI's presence and
// frequency penalties over the whole answer so far, the tokens this sampler drew (the history's
// last drawn_), as OpenAI and vLLM apply them: the prompt's own words are not penalised.
void Sampler::apply_penalties(std::span<const int32_t> history) {
  const SamplingParams& p = params_;
  if (penalises_repetition()) {
    const size_t window =
        p.repeat_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.repeat_last_n));
    for_each_distinct(history.last(window), [&](int32_t token, int) {
      float& logit = scratch_[token];
      logit = logit > 0.0f ? logit / p.repetition_penalty : logit * p.repetition_penalty;
    });
  }
  if (penalises_answer()) {
    for_each_distinct(answer(history), [&](int32_t token, int count) {
      scratch_[token] -= float(count) * p.frequency_penalty + p.presence_penalty;
    });
  }
}

template <class Visit>
void Sampler::for_each_distinct(std::span<const int32_t> tokens, Visit&& visit) {
  const size_t vocab = scratch_.size();
  for (int32_t token : tokens)
    if (token < 0 || size_t(token) >= vocab)
      throw std::invalid_argument("Sampler::sample: history token " + std::to_string(token) +
                                  " is outside the vocabulary of " + std::to_string(vocab));
  if (token_counts_.size() != vocab) token_counts_.assign(vocab, 0);
  distinct_tokens_.reserve(vocab);
  distinct_tokens_.clear();
  for (int32_t token : tokens)
    if (token_counts_[token]++ == 0) distinct_tokens_.push_back(token);
  for (int32_t token : distinct_tokens_) {
    visit(token, token_counts_[token]);
    token_counts_[token] = 0;  // ready for the next call
  }
}

void Sampler::apply_logit_bias() {
  for (const LogitBias& b : params_.logit_bias) {
    if (size_t(b.token) >= scratch_.size())
      throw std::invalid_argument("Sampler::sample: logit_bias token " + std::to_string(b.token) +
                                  " is outside the vocabulary of " +
                                  std::to_string(scratch_.size()));
    scratch_[b.token] += b.bias;
  }
}

// Moves the most likely candidates, enough to hold `mass` of the weight, to the front of
// order_[0, n) (every id, no top-k) and sorts them most likely first; returns how many. Buckets
// of weight (weight_bucket) say where that prefix ends without sorting the vocabulary: the
// candidates from that bucket up, and the bucket below in case the bucket sums round short.
size_t Sampler::sort_likeliest(size_t n, double mass) {
  bucket_mass_.assign(kWeightBuckets, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const float weight = scratch_[order_[i]];
    bucket_mass_[weight_bucket(weight)] += weight;
  }
  int edge = kWeightBuckets - 1;
  for (double above = 0.0; edge > 0; --edge) {
    above += bucket_mass_[edge];
    if (above >= mass) break;
  }
  const int lowest = std::max(edge - 1, 0);
  const auto begin = order_.begin();
  const auto end = std::partition(
      begin, begin + n, [&](int32_t id) { return weight_bucket(scratch_[id]) >= lowest; });
  std::sort(begin, end, [this](int32_t a, int32_t b) { return more_likely(a, b); });
  return size_t(end - begin);
}

// Top-k, softmax at the temperature, min-p, top-p (vLLM's order: top-p takes its share of what
// min-p left), then one draw from scratch_, whose largest value is `max_logit`. Candidates are
// ordered by a strict total order (more likely first, then lower id), so every standard library
// keeps the same set in the same order and the same seed picks the same token.
int32_t Sampler::draw(float max_logit) {
  const size_t vocab = scratch_.size();
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  const auto likelier = [this](int32_t a, int32_t b) { return more_likely(a, b); };
  const auto begin = order_.begin();

  size_t n = vocab;   // candidates are order_[0, n)
  size_t sorted = 0;  // order_[0, sorted) is sorted by more_likely
  if (params_.top_k > 0 && size_t(params_.top_k) < vocab) {
    n = size_t(params_.top_k);
    std::partial_sort(begin, begin + n, order_.end(), likelier);
    sorted = n;
  }

  // Softmax weights at the temperature, left unnormalised: the most likely candidate (top-k's
  // first too) gets exp(0) = 1 and the others less. Dividing (not multiplying by 1/T, which
  // overflows for a tiny T) keeps exp(0 / T) = 1.
  const float temperature = params_.temperature;
  auto weight = [&](float logit) { return shifted_exp((logit - max_logit) / temperature); };
  double total = 0.0;
  if (sorted == 0) {  // every id a candidate, in id order: one pass of vector code
    for (float& x : scratch_) x = weight(x);
    total = sum_over(scratch_, [](float x) { return x; });
  } else {
    for (size_t i = 0; i < n; ++i) {
      float& x = scratch_[order_[i]];
      x = weight(x);
      total += x;
    }
  }

  if (params_.min_p > 0.0f) {
    // The most likely candidate weighs 1, so min_p itself is the threshold. Compacting in
    // place keeps the candidates' order.
    size_t kept = 0;
    total = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t token = order_[i];
      if (scratch_[token] < params_.min_p) continue;
      order_[kept++] = token;
      total += scratch_[token];
    }
    n = kept;
    if (sorted > 0) sorted = n;  // compacting kept the sorted order
  }

  if (params_.top_p < 1.0f) {
    // The smallest most-likely-first prefix holding top_p of the mass. Without top-k, only the
    // likeliest candidates get sorted; should rounding leave them short of the mass, the rest
    // are sorted too.
    const double target = double(params_.top_p) * total;
    if (sorted == 0) sorted = sort_likeliest(n, target);
    double kept_mass = 0.0;
    size_t kept = 0;
    while (kept < n) {
      if (kept == sorted) {
        std::sort(begin + sorted, begin + n, likelier);
        sorted = n;
      }
      kept_mass += scratch_[order_[kept++]];
      if (kept_mass >= target) break;
    }
    n = kept;
    total = kept_mass;
  }

  const double target = uniform_unit(rng_) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += scratch_[order_[i]];
    if (target < cumulative) return order_[i];
  }
  // Rounding left target at the total: the last candidate with any weight.
  for (size_t i = n; i-- > 0;)
    if (scratch_[order_[i]] > 0.0f) return order_[i];
  return order_[0];
}

}  // namespace pipeline
