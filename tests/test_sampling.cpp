// Sampler and validate() on small hand-made logits: every filter keeps exactly the tokens it
// should, draws follow the filtered softmax, penalties move the right logits by the right
// amount, and logprobs are the raw distribution's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "model/sampling.h"

// Counts heap allocations, to show that sample() allocates nothing after its first call.
namespace {
size_t g_allocations = 0;
}

// Out of line, so that the compiler does not pair the malloc and free through inlining.
[[gnu::noinline]] void* operator new(size_t size) {
  ++g_allocations;
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

namespace pipeline {
namespace {

std::vector<double> softmax(const std::vector<float>& logits, double temperature = 1.0) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i)
    sum += p[i] = std::exp((logits[i] - max) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

std::vector<float> logits_of(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(float(std::log(p)));
  return logits;
}

// Relative frequency of every token over `draws` samples with no history.
std::map<int32_t, double> frequencies(const SamplingParams& params,
                                      const std::vector<float>& logits, int draws) {
  Sampler sampler(params, 0);
  std::map<int32_t, double> counts;
  for (int i = 0; i < draws; ++i) counts[sampler.sample(logits, {}).token] += 1.0 / draws;
  return counts;
}

std::set<int32_t> drawn_tokens(const SamplingParams& params, const std::vector<float>& logits,
                               int draws) {
  std::set<int32_t> tokens;
  for (const auto& [token, frequency] : frequencies(params, logits, draws)) tokens.insert(token);
  return tokens;
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams params;
  params.seed = seed;
  return params;
}

TEST(Sampling, GreedyPicksTheArgmaxAndTheLowestIdOnTies) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler(params, 0);
  EXPECT_EQ(sampler.sample(std::vector<float>{0.5f, 2.0f, -1.0f, 1.0f}, {}).token, 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f}, {}).token, 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-4.0f}, {}).token, 0);
}

TEST(Sampling, ArgmaxOfIsGreedysPickAndPassesOverNaNs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const RowArgmax tie = argmax_of(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f});
  EXPECT_EQ(tie.token, 1);
  EXPECT_EQ(tie.value, 3.0f);
  const RowArgmax past_nan = argmax_of(std::vector<float>{nan, -2.0f, nan, -1.0f, -inf});
  EXPECT_EQ(past_nan.token, 3);
  EXPECT_EQ(past_nan.value, -1.0f);
  EXPECT_FALSE(std::isfinite(argmax_of(std::vector<float>{nan, nan}).value));
  EXPECT_FALSE(std::isfinite(argmax_of(std::vector<float>{-inf, -inf}).value));
  EXPECT_FALSE(std::isfinite(argmax_of(std::vector<float>{0.0f, inf}).value));
}

// Only a greedy draw that nothing adjusts and nothing reports may be taken from the argmax alone.
TEST(Sampling, OnlyAPlainGreedyDrawNeedsNothingButTheArgmax) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_TRUE(Sampler(greedy, 0).draws_argmax());
  greedy.top_k = 5;  // no effect on a greedy draw
  greedy.top_p = 0.5f;
  EXPECT_TRUE(Sampler(greedy, 0).draws_argmax());
  greedy.ending_tokens = {2};  // they end the answer, and ban nothing without min_tokens
  EXPECT_TRUE(Sampler(greedy, 0).draws_argmax());

  const auto needs_the_row = [&](auto change) {
    SamplingParams params = greedy;
    change(params);
    return !Sampler(params, 0).draws_argmax();
  };
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.temperature = 0.7f; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.logprobs = true; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.top_logprobs = 2; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.logit_bias = {{1, 5.0f}}; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.repetition_penalty = 1.2f; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.presence_penalty = 0.5f; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.frequency_penalty = -0.5f; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.allowed_tokens = {0, 1}; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.bad_word_sequences = {{3}}; }));
  EXPECT_TRUE(needs_the_row([](SamplingParams& p) { p.min_tokens = 1; }));
}

// take_argmax draws what sample() draws from the whole row, and counts the draw as sample()
// does: min_tokens' ban ends after its draws, whichever way they were made.
TEST(Sampling, TakeArgmaxDrawsWhatSampleDraws) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler whole(greedy, 0), argmax(greedy, 0);
  for (int draw = 0; draw < 50; ++draw) {
    std::vector<float> logits(509);
    for (float& x : logits) x = normal(rng);
    if (draw % 5 == 0) logits[100] = logits[400] = 20.0f;  // a tie: the lower token
    const SampledToken taken = argmax.take_argmax(argmax_of(logits));
    EXPECT_EQ(taken.token, whole.sample(logits, {}).token) << "draw " << draw;
    EXPECT_EQ(taken.logprob, 0.0f);
    EXPECT_TRUE(taken.top.empty());
  }

  SamplingParams held = greedy;
  held.min_tokens = 2;
  held.ending_tokens = {1};
  Sampler sampler(held, 0);
  const std::vector<float> logits{0.5f, 4.0f, 1.0f};
  for (int draw = 0; draw < 2; ++draw) {
    EXPECT_FALSE(sampler.draws_argmax()) << "draw " << draw;
    EXPECT_EQ(sampler.sample(logits, {}).token, 2);
  }
  ASSERT_TRUE(sampler.draws_argmax());
  EXPECT_EQ(sampler.take_argmax(argmax_of(logits)).token, 1);
}

TEST(Sampling, TakeArgmaxRefusesARowWithoutAFiniteMaximumAndASamplerThatNeedsTheRow) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler sampler(greedy, 0);
  const float inf = std::numeric_limits<float>::infinity();
  try {
    sampler.take_argmax({0, -inf});
    FAIL() << "a row without a finite maximum was drawn from";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "Sampler::sample: logits have no finite maximum");
  }
  EXPECT_THROW(sampler.take_argmax({0, inf}), std::invalid_argument);
  EXPECT_THROW(Sampler(SamplingParams{}, 0).take_argmax({1, 2.0f}), std::logic_error);
}

TEST(Sampling, TinyTemperatureActsAsGreedy) {
  SamplingParams params = seeded(12);
  params.temperature = 1e-40f;  // 1 / T overflows a float
  Sampler sampler(params, 0);
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(sampler.sample(std::vector<float>{0.5f, 2.0f, 1.999f, -1.0f}, {}).token, 1);
}

TEST(Sampling, SameSeedSameTokensDifferentSeedsDiffer) {
  const std::vector<float> logits{0.1f, 0.2f, 0.0f, 0.3f, 0.1f, 0.2f, 0.0f, 0.1f};
  Sampler a(seeded(42), 0), b(seeded(42), 0), c(seeded(43), 0);
  std::vector<int32_t> from_a, from_b, from_c;
  for (int i = 0; i < 200; ++i) {
    from_a.push_back(a.sample(logits, {}).token);
    from_b.push_back(b.sample(logits, {}).token);
    from_c.push_back(c.sample(logits, {}).token);
  }
  EXPECT_EQ(from_a, from_b);
  EXPECT_NE(from_a, from_c);
  // Without a seed in the params the fallback seed is used.
  Sampler fallback(SamplingParams{}, 42);
  std::vector<int32_t> from_fallback;
  for (int i = 0; i < 200; ++i) from_fallback.push_back(fallback.sample(logits, {}).token);
  EXPECT_EQ(from_fallback, from_a);
}

// The draw is defined on the raw 64-bit output of std::mt19937_64 (fixed by the C++ standard):
// u = top 53 bits / 2^53, and the token is where u falls in the cumulative distribution in
// token order. Re-deriving it here pins the tokens on every platform.
TEST(Sampling, DrawIsTheInverseCdfOfTheRawGeneratorOutput) {
  const std::vector<float> logits{0.3f, -0.2f, 1.1f, 0.0f, 0.7f};
  const std::vector<double> p = softmax(logits);
  Sampler sampler(seeded(7), 0);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    const double u = double(rng() >> 11) * 0x1.0p-53;
    int32_t expected = 0;
    for (double cumulative = p[0]; u >= cumulative && expected + 1 < int32_t(p.size());)
      cumulative += p[++expected];
    ASSERT_EQ(sampler.sample(logits, {}).token, expected) << "draw " << i;
  }
}

TEST(Sampling, FrequenciesFollowSoftmaxAtTheTemperature) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, 0.5f};
  const int draws = 40000;  // standard error of a frequency <= 0.0025
  std::map<float, double> most_likely_share;
  for (float temperature : {0.5f, 1.0f, 1.5f}) {
    SamplingParams params = seeded(1);
    params.temperature = temperature;
    const std::vector<double> expected = softmax(logits, temperature);
    std::map<int32_t, double> observed = frequencies(params, logits, draws);
    for (int32_t token = 0; token < 4; ++token)
      EXPECT_NEAR(observed[token], expected[token], 0.01)
          << "token " << token << " at temperature " << temperature;
    most_likely_share[temperature] = observed[2];
  }
  // Low temperature sharpens, high temperature flattens.
  EXPECT_GT(most_likely_share[0.5f], most_likely_share[1.0f] + 0.1);
  EXPECT_LT(most_likely_share[1.5f], most_likely_share[1.0f] - 0.05);
}

TEST(Sampling, TopKKeepsExactlyTheKMostLikely) {
  const std::vector<float> logits{0.2f, 1.0f, -0.5f, 0.9f, 0.0f, 0.8f, 0.1f, 0.3f};
  for (int k : {1, 3, 5}) {
    SamplingParams params = seeded(2);
    params.top_k = k;
    std::vector<int32_t> by_logit(logits.size());
    std::iota(by_logit.begin(), by_logit.end(), 0);
    std::sort(by_logit.begin(), by_logit.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const std::set<int32_t> expected(by_logit.begin(), by_logit.begin() + k);
    EXPECT_EQ(drawn_tokens(params, logits, 5000), expected) << "top_k " << k;
  }
  // The kept tokens are drawn in proportion to their renormalised probabilities.
  SamplingParams params = seeded(3);
  params.top_k = 2;
  std::map<int32_t, double> observed = frequencies(params, logits, 40000);
  EXPECT_NEAR(observed[1], std::exp(1.0) / (std::exp(1.0) + std::exp(0.9)), 0.01);
  // top_k at or above the vocabulary keeps everything.
  params.top_k = 8;
  EXPECT_EQ(drawn_tokens(params, logits, 5000).size(), 8u);
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  const std::vector<float> logits = logits_of({0.05, 0.5, 0.15, 0.3});
  SamplingParams params = seeded(4);
  params.top_p = 0.75f;  // 0.5 < 0.75 <= 0.5 + 0.3
  EXPECT_EQ(drawn_tokens(params, logits, 5000), (std::set<int32_t>{1, 3}));
  std::map<int32_t, double> observed = frequencies(params, logits, 40000);
  EXPECT_NEAR(observed[1], 0.5 / 0.8, 0.01);
  params.top_p = 0.85f;  // 0.8 < 0.85 <= 0.95
  EXPECT_EQ(drawn_tokens(params, logits, 5000), (std::set<int32_t>{1, 2, 3}));
  params.top_p = 0.1f;  // the most likely token alone already holds more
  EXPECT_EQ(drawn_tokens(params, logits, 2000), (std::set<int32_t>{1}));
}

// A nucleus of 130 tokens out of 200, scattered over the ids, with weights so close that the
// nucleus ends inside one of the buckets the sampler sorts by.
TEST(Sampling, TopPFindsALargeNucleus) {
  const int vocab = 200, nucleus = 130;
  std::vector<float> logits(vocab, 0.0f);
  for (int rank = 0; rank < nucleus; ++rank) logits[(rank * 37) % vocab] = 5.0f - 0.001f * rank;
  std::vector<double> p = softmax(logits);
  std::vector<double> sorted = p;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const double mass_before = std::accumulate(sorted.begin(), sorted.begin() + nucleus - 1, 0.0);
  const double mass_with = mass_before + sorted[nucleus - 1];
  SamplingParams params = seeded(5);
  params.top_p = float((mass_before + mass_with) / 2);
  std::set<int32_t> expected;
  for (int rank = 0; rank < nucleus; ++rank) expected.insert((rank * 37) % vocab);
  EXPECT_EQ(drawn_tokens(params, logits, 30000), expected);
}

// LLaMA's vocabulary of 32,000 words with a spread-out distribution (logits of standard
// deviation 3): top-p 0.9 keeps 1,411 tokens at temperature 1 and 300 at 0.8, and every draw
// comes from exactly those.
TEST(Sampling, TopPOverALargeVocabularyDrawsOnlyFromTheNucleus) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(32000);
  for (float& x : logits) x = normal(rng);
  for (const float temperature : {1.0f, 0.8f}) {
    const std::vector<double> p = softmax(logits, temperature);
    std::vector<int32_t> by_probability(p.size());
    std::iota(by_probability.begin(), by_probability.end(), 0);
    std::sort(by_probability.begin(), by_probability.end(),
              [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    // The nucleus ends at the first token that brings the mass to 0.9; top_p sits halfway
    // between the mass without it and with it, far from rounding either way.
    double mass = 0.0;
    size_t nucleus = 0;
    while (mass + p[by_probability[nucleus]] < 0.9) mass += p[by_probability[nucleus++]];
    SamplingParams params = seeded(12);
    params.temperature = temperature;
    params.top_p = float(mass + p[by_probability[nucleus]] / 2);
    ++nucleus;
    const std::set<int32_t> expected(by_probability.begin(), by_probability.begin() + nucleus);
    const std::set<int32_t> drawn = drawn_tokens(params, logits, 1500);
    EXPECT_GT(nucleus, 100u) << "temperature " << temperature;
    EXPECT_TRUE(std::includes(expected.begin(), expected.end(), drawn.begin(), drawn.end()))
        << "temperature " << temperature << ": a draw outside the nucleus of " << nucleus;
    EXPECT_GT(drawn.size(), 50u) << "temperature " << temperature;
  }
}

TEST(Sampling, MinPDropsTokensBelowAShareOfTheMostLikely) {
  const std::vector<float> logits = logits_of({0.05, 0.5, 0.15, 0.3});
  SamplingParams params = seeded(6);
  params.min_p = 0.2f;  // threshold 0.1: drops 0.05
  EXPECT_EQ(drawn_tokens(params, logits, 5000), (std::set<int32_t>{1, 2, 3}));
  std::map<int32_t, double> observed = frequencies(params, logits, 40000);
  EXPECT_NEAR(observed[2], 0.15 / 0.95, 0.01);
  params.min_p = 0.5f;  // threshold 0.25: keeps 0.5 and 0.3
  EXPECT_EQ(drawn_tokens(params, logits, 5000), (std::set<int32_t>{1, 3}));
  params.min_p = 1.0f;
  EXPECT_EQ(drawn_tokens(params, logits, 2000), (std::set<int32_t>{1}));
}

// vLLM's order: top-k, min-p, then top-p over what min-p left.
TEST(Sampling, FiltersCombineInOrder) {
  const std::vector<float> logits = logits_of({0.05, 0.5, 0.15, 0.3});
  // top_k 3 keeps {1, 3, 2}; min_p 0.4 drops 2 (0.15 < 0.4 * 0.5); top_p 0.9 of what is left
  // (0.625, 0.375) keeps both.
  SamplingParams params = seeded(8);
  params.top_k = 3;
  params.top_p = 0.9f;
  params.min_p = 0.4f;
  EXPECT_EQ(drawn_tokens(params, logits, 5000), (std::set<int32_t>{1, 3}));
  // min_p 0.2 drops 0 alone (0.05 < 0.1); top_p 0.82 of what is left (0.526, 0.316, 0.158)
  // then stops at {1, 3} (0.842). The other order keeps 2 as well (top_p over 0.5, 0.3, 0.15
  // reaches 0.82 only with it).
  for (int top_k : {0, 3}) {
    SCOPED_TRACE(top_k);
    SamplingParams ordered = seeded(9);
    ordered.top_k = top_k;
    ordered.min_p = 0.2f;
    ordered.top_p = 0.82f;
    EXPECT_EQ(drawn_tokens(ordered, logits, 5000), (std::set<int32_t>{1, 3}));
  }
}

// Greedy sampling of [penalised token, rival] tells on which side of `expected` the penalised
// logit lands; a rival just above and just below pins it to within 0.01. The sampler first draws
// `answer` (each token forced) after `prompt`, so that the history is prompt + answer and the
// answer is its own.
void expect_penalised_to(const SamplingParams& penalties, float logit,
                         const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                         float expected) {
  SamplingParams params = penalties;
  params.temperature = 0.0f;
  for (float offset : {-0.01f, 0.01f}) {
    Sampler sampler(params, 0);
    std::vector<int32_t> history = prompt;
    for (int32_t token : answer) {
      std::vector<float> forced(8, -1000.0f);
      forced[size_t(token)] = 1000.0f;
      ASSERT_EQ(sampler.sample(forced, history).token, token);
      history.push_back(token);
    }
    // Token 0 is penalised (it is in the history), token 1 is the rival; the other tokens
    // fill the history's ids and sit far below.
    std::vector<float> logits(8, -100.0f);
    logits[0] = logit;
    logits[1] = expected + offset;
    const int32_t winner = offset < 0 ? 0 : 1;
    EXPECT_EQ(sampler.sample(logits, history).token, winner)
        << "logit " << logit << " should become " << expected << " (rival at " << expected + offset
        << ")";
  }
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams params;
  params.repetition_penalty = 1.5f;
  expect_penalised_to(params, 3.0f, {0}, {}, 2.0f);
  expect_penalised_to(params, -1.0f, {0}, {}, -1.5f);
  // Once per distinct token, however often it occurs, in the prompt or the answer.
  expect_penalised_to(params, 3.0f, {0, 0}, {0, 5}, 2.0f);
}

TEST(Sampling, PresenceAndFrequencyPenaltiesSubtract) {
  SamplingParams presence;
  presence.presence_penalty = 0.5f;
  expect_penalised_to(presence, 3.0f, {}, {0, 0, 0}, 2.5f);
  SamplingParams frequency;
  frequency.frequency_penalty = 0.4f;
  expect_penalised_to(frequency, 3.0f, {}, {0, 0, 0}, 1.8f);
  // Negative penalties encourage repetition.
  frequency.frequency_penalty = -0.5f;
  expect_penalised_to(frequency, 1.0f, {}, {0, 0}, 2.0f);
}

// OpenAI's and vLLM's: the answer's tokens count, all of them, and the prompt's do not
// (repeat_last_n is the repetition penalty's window alone, as in llama.cpp).
TEST(Sampling, PresenceAndFrequencyPenaltiesCountTheWholeAnswerAndNotThePrompt) {
  SamplingParams params;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 1.0f;
  expect_penalised_to(params, 3.0f, {0, 0, 0}, {}, 3.0f);
  expect_penalised_to(params, 3.0f, {0, 0, 0}, {5, 0}, 1.5f);
  params.repeat_last_n = 2;
  expect_penalised_to(params, 3.0f, {}, {0, 0, 5, 6}, 0.5f);
  params.repeat_last_n = 0;
  expect_penalised_to(params, 3.0f, {}, {0}, 1.5f);
}

TEST(Sampling, RepetitionPenaltyComesBeforePresenceAndFrequency) {
  SamplingParams params;
  params.repetition_penalty = 1.5f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  // 3 / 1.5 - 0.5 - 2 * 0.25 = 1 (the other order would give 1.33).
  expect_penalised_to(params, 3.0f, {}, {0, 6, 0}, 1.0f);
}

// vLLM's: by default the whole history counts, however long.
TEST(Sampling, RepetitionPenaltyCoversTheWholeHistoryByDefault) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  std::vector<int32_t> prompt(1000, 5);
  prompt.front() = 0;
  expect_penalised_to(params, 3.0f, prompt, {6}, 1.5f);
}

TEST(Sampling, RepetitionPenaltyLooksOnlyAtTheLastRepeatLastNTokens) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.repeat_last_n = 2;
  expect_penalised_to(params, 3.0f, {0, 0, 0, 5}, {}, 1.5f);  // a 0 among the last two
  expect_penalised_to(params, 3.0f, {0, 5, 6}, {}, 3.0f);     // none
  expect_penalised_to(params, 3.0f, {0, 5}, {6}, 3.0f);       // the window spans the answer
  params.repeat_last_n = -1;
  expect_penalised_to(params, 3.0f, {0, 5, 6}, {}, 1.5f);  // the whole history
  params.repeat_last_n = 0;
  expect_penalised_to(params, 3.0f, {0, 0, 0, 5}, {}, 3.0f);  // off
  // A longer window than the history takes the whole history.
  params.repeat_last_n = 64;
  expect_penalised_to(params, 3.0f, {0}, {5}, 1.5f);
}

TEST(Sampling, LogitBiasBansForcesAndComesBeforeThePenalties) {
  const std::vector<float> logits{0.5f, 2.0f, 1.0f, -1.0f};
  SamplingParams banned;
  banned.temperature = 0.0f;
  banned.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(Sampler(banned, 0).sample(logits, {}).token, 2);
  // +100 on an unlikely token at temperature 1: every draw is that token.
  SamplingParams forced = seeded(3);
  forced.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(drawn_tokens(forced, logits, 500), (std::set<int32_t>{3}));
  // A small bias moves the draw frequencies as a shift of the logit does.
  SamplingParams nudged = seeded(5);
  nudged.logit_bias = {{0, 1.5f}};
  std::vector<float> shifted = logits;
  shifted[0] += 1.5f;
  const auto expected = softmax(shifted);
  const auto seen = frequencies(nudged, logits, 20000);
  for (int32_t token = 0; token < 4; ++token)
    EXPECT_NEAR(seen.count(token) ? seen.at(token) : 0.0, expected[token], 0.015) << token;
  // The penalties take the biased logit, as in vLLM: (3.0 + 0.25) / 1.5 - 0.5 presence = 1.667
  // (after them, the bias would give 3.0 / 1.5 - 0.5 + 0.25 = 1.75).
  SamplingParams both;
  both.repetition_penalty = 1.5f;
  both.presence_penalty = 0.5f;
  both.logit_bias = {{0, 0.25f}};
  expect_penalised_to(both, 3.0f, {}, {0}, 3.25f / 1.5f - 0.5f);
}

// vLLM's allowed_token_ids: only they are drawn, greedy or not, in proportion to their own
// weights; logprobs stay the model's own; one outside the vocabulary is an error.
TEST(Sampling, AllowedTokensAreTheOnlyOnesDrawn) {
  const std::vector<float> logits{0.5f, 4.0f, 1.0f, 3.5f, -1.0f};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.allowed_tokens = {4, 2};
  greedy.logprobs = true;
  const SampledToken best = Sampler(greedy, 0).sample(logits, {});
  EXPECT_EQ(best.token, 2);
  EXPECT_NEAR(best.logprob, std::log(softmax(logits)[2]), 1e-5);
  SamplingParams drawing = seeded(11);
  drawing.allowed_tokens = {0, 4};
  const auto seen = frequencies(drawing, logits, 20000);
  EXPECT_EQ(seen.size(), 2u);
  const double p0 = std::exp(0.5) / (std::exp(0.5) + std::exp(-1.0));
  EXPECT_NEAR(seen.at(0), p0, 0.015);
  // With a bias, the allowed token's biased logit is what counts.
  SamplingParams biased = greedy;
  biased.logit_bias = {{4, 5.0f}};
  EXPECT_EQ(Sampler(biased, 0).sample(logits, {}).token, 4);
  SamplingParams outside;
  outside.allowed_tokens = {5};
  EXPECT_THROW(Sampler(outside, 0).sample(logits, {}), std::invalid_argument);
}

// What a sampler with `params` draws from `logits` once it has drawn `answer` after `prompt`, each
// of the answer's tokens forced by logits that all but name it.
SampledToken sample_after(const SamplingParams& params, std::vector<int32_t> prompt,
                          const std::vector<int32_t>& answer, const std::vector<float>& logits) {
  Sampler sampler(params, 0);
  std::vector<int32_t>& history = prompt;
  for (int32_t token : answer) {
    std::vector<float> forcing(logits.size(), 0.0f);
    forcing[size_t(token)] = 50.0f;
    EXPECT_EQ(sampler.sample(forcing, history).token, token) << "forcing the answer";
    history.push_back(token);
  }
  return sampler.sample(logits, history);
}

// vLLM's bad_words: a one-token sequence's token is never drawn; a longer sequence's last token
// only where the answer ends with the rest of it, not where the prompt does; greedy takes the
// next best, and logprobs stay the model's own.
TEST(Sampling, BadWordSequencesBanTheirLastTokenAfterTheirPrefix) {
  const std::vector<float> logits{0.5f, 4.0f, 1.0f, 3.5f, -1.0f};  // 1, 3, 2, 0, 4 likeliest first
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = true;
  greedy.bad_word_sequences = {{1}, {2, 3}, {0, 4, 2}};
  const SampledToken first = sample_after(greedy, {}, {}, logits);
  EXPECT_EQ(first.token, 3);
  EXPECT_NEAR(first.logprob, std::log(softmax(logits)[3]), 1e-5);
  // After 2 the answer would end "2 3": 3 is banned too, and 2 comes next.
  const SampledToken after_prefix = sample_after(greedy, {}, {2}, logits);
  EXPECT_EQ(after_prefix.token, 2);
  EXPECT_NEAR(after_prefix.logprob, std::log(softmax(logits)[2]), 1e-5);
  // The prefix must end the answer, and be the answer's: a prompt's bans nothing.
  EXPECT_EQ(sample_after(greedy, {}, {2, 0}, logits).token, 3);
  EXPECT_EQ(sample_after(greedy, {2}, {}, logits).token, 3);
  // A prefix of two: "0 4" bans 2; "4" alone, or after the prompt's 0, does not.
  const std::vector<float> two_first{0.5f, 4.0f, 5.0f, 3.5f, -1.0f};
  EXPECT_EQ(sample_after(greedy, {}, {0, 4}, two_first).token, 3);
  EXPECT_EQ(sample_after(greedy, {}, {4}, two_first).token, 2);
  EXPECT_EQ(sample_after(greedy, {0}, {4}, two_first).token, 2);
  // Drawn, a banned token never comes, and the others keep their proportions.
  SamplingParams drawing = seeded(5);
  drawing.bad_word_sequences = {{1}, {2, 3}};
  const auto seen = frequencies(drawing, logits, 20000);
  EXPECT_EQ(seen.count(1), 0u);
  const std::vector<double> p = softmax(logits);
  EXPECT_NEAR(seen.at(3), p[3] / (1.0 - p[1]), 0.015);
}

// Bans that leave nothing to draw are an error, not token 0 or a NaN: first_draw_possible tells
// the first draw's ahead (one-token sequences, allowed tokens, min_tokens), the sampler a later
// one's; a bad word token outside the vocabulary is an error too.
TEST(Sampling, BadWordsThatLeaveNothingToDrawAreAnError) {
  const std::vector<float> logits{0.5f, 4.0f, 1.0f, 3.5f, -1.0f};
  SamplingParams only;
  only.allowed_tokens = {3};
  only.bad_word_sequences = {{3, 3}};
  for (const float temperature : {0.0f, 1.0f}) {
    only.temperature = temperature;
    EXPECT_TRUE(first_draw_possible(only, 5));
    Sampler sampler(only, 0);
    EXPECT_EQ(sampler.sample(logits, {}).token, 3);
    EXPECT_THROW(sampler.sample(logits, std::vector<int32_t>{3}), NothingToDraw);
  }

  SamplingParams first;
  first.allowed_tokens = {1, 3};
  first.bad_word_sequences = {{1}, {2, 3}};
  EXPECT_TRUE(first_draw_possible(first, 5));  // 3 is banned only after 2
  first.bad_word_sequences.push_back({3});
  EXPECT_FALSE(first_draw_possible(first, 5));
  first.allowed_tokens.clear();
  EXPECT_TRUE(first_draw_possible(first, 5));
  first.bad_word_sequences = {{0}, {1}, {2}, {3}, {4}};
  EXPECT_FALSE(first_draw_possible(first, 5));
  EXPECT_TRUE(first_draw_possible(first, 6));
  SamplingParams held;
  held.allowed_tokens = {1, 2};
  held.bad_word_sequences = {{1}};
  held.ending_tokens = {2};
  EXPECT_TRUE(first_draw_possible(held, 5));
  held.min_tokens = 1;
  EXPECT_FALSE(first_draw_possible(held, 5));

  SamplingParams outside;
  outside.bad_word_sequences = {{5}};
  EXPECT_THROW(Sampler(outside, 0).sample(logits, {}), std::invalid_argument);
}

// min_tokens: the ending tokens cannot be drawn in the first min_tokens draws, greedy or not,
// and are as likely as ever after; their logprobs stay the model's own.
TEST(Sampling, MinTokensBansTheEndingTokensFromTheFirstDraws) {
  const std::vector<float> logits{0.5f, 4.0f, 1.0f, 3.5f};
  for (const float temperature : {0.0f, 1.0f}) {
    SamplingParams params = seeded(9);
    params.temperature = temperature;
    params.min_tokens = 3;
    params.ending_tokens = {1, 3};
    params.logprobs = true;
    Sampler sampler(params, 0);
    for (int draw = 0; draw < 3; ++draw) {
      const SampledToken sampled = sampler.sample(logits, {});
      EXPECT_TRUE(sampled.token == 0 || sampled.token == 2) << "draw " << draw;
      EXPECT_NEAR(sampled.logprob, std::log(softmax(logits)[size_t(sampled.token)]), 1e-5);
    }
    if (temperature == 0.0f) {
      EXPECT_EQ(sampler.sample(logits, {}).token, 1);
    }
  }
  SamplingParams after = seeded(4);
  after.min_tokens = 1;
  after.ending_tokens = {1};
  Sampler sampler(after, 0);
  EXPECT_NE(sampler.sample(logits, {}).token, 1);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 4000; ++i) ++counts[sampler.sample(logits, {}).token];
  EXPECT_NEAR(counts[1] / 4000.0, softmax(logits)[1], 0.03);

  SamplingParams outside;
  outside.min_tokens = 1;
  outside.ending_tokens = {4};
  EXPECT_THROW(Sampler(outside, 0).sample(logits, {}), std::invalid_argument);
}

TEST(Sampling, LogprobAndAlternativesComeFromTheRawLogits) {
  const std::vector<float> logits{1.0f, 2.0f, 3.0f, 0.5f, 3.0f};
  const std::vector<double> p = softmax(logits);
  SamplingParams params = seeded(9);
  params.temperature = 0.3f;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 1.0f;
  params.top_k = 3;
  params.top_logprobs = 3;
  Sampler sampler(params, 0);
  const std::vector<int32_t> history{2, 2, 4};
  for (int i = 0; i < 50; ++i) {
    const SampledToken sampled = sampler.sample(logits, history);
    EXPECT_NEAR(sampled.logprob, std::log(p[sampled.token]), 1e-6);
    // Most likely first; the tie between 2 and 4 goes to the lower id.
    ASSERT_EQ(sampled.top.size(), 3u);
    const int32_t expected_ids[] = {2, 4, 1};
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(sampled.top[rank].token, expected_ids[rank]);
      EXPECT_NEAR(sampled.top[rank].logprob, std::log(p[expected_ids[rank]]), 1e-6);
    }
  }
  // Greedy reports the same raw logprob when asked, and no alternatives unless asked.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = true;
  const SampledToken sampled = Sampler(greedy, 0).sample(logits, {});
  EXPECT_EQ(sampled.token, 2);
  EXPECT_NEAR(sampled.logprob, std::log(p[2]), 1e-6);
  EXPECT_TRUE(sampled.top.empty());
  // Not asked: no normaliser is computed and the logprob stays 0.
  greedy.logprobs = false;
  EXPECT_EQ(Sampler(greedy, 0).sample(logits, {}).logprob, 0.0f);
  // More alternatives than the vocabulary: all of it.
  greedy.top_logprobs = 20;
  EXPECT_EQ(Sampler(greedy, 0).sample(logits, {}).top.size(), logits.size());
}

// A prompt token's score is what sample() reports for a drawn token: its raw logprob and the
// likeliest alternatives, ties to the lower id, NaNs never among them.
TEST(Sampling, ScoreTokenReportsAGivenTokenAsSampleReportsADrawnOne) {
  const std::vector<float> logits{1.0f, 2.0f, 3.0f, 0.5f, 3.0f, NAN};
  const std::vector<float> finite(logits.begin(), logits.end() - 1);
  const std::vector<double> p = softmax(finite);
  const SampledToken scored = score_token(logits, 3, 4);
  EXPECT_EQ(scored.token, 3);
  EXPECT_NEAR(scored.logprob, std::log(p[3]), 1e-6);
  ASSERT_EQ(scored.top.size(), 4u);
  const int32_t expected_ids[] = {2, 4, 1, 0};
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(scored.top[rank].token, expected_ids[rank]);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = true;
  greedy.top_logprobs = 3;
  const SampledToken drawn = Sampler(greedy, 0).sample(finite, {});
  const SampledToken same = score_token(finite, drawn.token, 3);
  EXPECT_EQ(same.logprob, drawn.logprob);
  ASSERT_EQ(same.top.size(), drawn.top.size());
  for (size_t i = 0; i < same.top.size(); ++i) {
    EXPECT_EQ(same.top[i].token, drawn.top[i].token);
    EXPECT_EQ(same.top[i].logprob, drawn.top[i].logprob);
  }
  EXPECT_TRUE(score_token(logits, 0, 0).top.empty());
  EXPECT_THROW(score_token(logits, 6, 1), std::invalid_argument);
  EXPECT_THROW(score_token(std::vector<float>{NAN, -INFINITY}, 0, 1), std::invalid_argument);
}

TEST(Sampling, SampleAllocatesNothingAfterTheFirstCall) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 7919) % 1000) / 100.0f;
  std::vector<int32_t> history;
  for (int32_t i = 0; i < 300; ++i) history.push_back((i * 13) % 1000);
  SamplingParams params = seeded(10);
  params.top_k = 50;
  params.top_p = 0.9f;
  params.min_p = 0.05f;
  params.repetition_penalty = 1.1f;
  params.frequency_penalty = 0.2f;
  params.presence_penalty = 0.1f;
  // The second's prefix ends the answer once a token is drawn: the history's last stands for it.
  params.bad_word_sequences = {{17}, {history.back(), 5}};
  Sampler sampler(params, 0);
  SamplingParams nucleus_only = seeded(11);
  nucleus_only.top_p = 0.5f;
  Sampler nucleus_sampler(nucleus_only, 0);
  sampler.sample(logits, history);
  nucleus_sampler.sample(logits, history);
  const size_t before = g_allocations;
  for (int i = 0; i < 100; ++i) {
    sampler.sample(logits, history);
    nucleus_sampler.sample(logits, history);
  }
  EXPECT_EQ(g_allocations, before);
  // The counter does count: reporting alternatives allocates the result's list.
  SamplingParams with_alternatives = params;
  with_alternatives.top_logprobs = 5;
  Sampler reporting(with_alternatives, 0);
  reporting.sample(logits, history);
  const size_t before_reporting = g_allocations;
  reporting.sample(logits, history);
  EXPECT_GT(g_allocations, before_reporting);
}

TEST(Sampling, BadInputIsRejected) {
  Sampler sampler(SamplingParams{}, 0);
  EXPECT_THROW(sampler.sample(std::vector<float>{}, {}), std::invalid_argument);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THROW(sampler.sample(std::vector<float>{-inf, -inf}, {}), std::invalid_argument);
  SamplingParams penalised;
  penalised.temperature = 0.0f;
  penalised.repetition_penalty = 2.0f;
  Sampler penalising(penalised, 0);
  const std::vector<float> logits{1.0f, 2.5f};
  try {
    penalising.sample(logits, std::vector<int32_t>{1, 7});
    FAIL() << "a history token outside the vocabulary was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("history token 7"), std::string::npos) << e.what();
  }
  // The rejected call left nothing behind: token 1 is penalised once, 2.5 / 2 > 1.
  EXPECT_EQ(penalising.sample(logits, std::vector<int32_t>{1}).token, 1);

  SamplingParams biased;
  biased.logit_bias = {{2, 5.0f}};
  Sampler biasing(biased, 0);
  try {
    biasing.sample(logits, {});
    FAIL() << "a logit_bias token outside the vocabulary was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("logit_bias token 2"), std::string::npos) << e.what();
  }
}

TEST(Sampling, ValidateNamesTheParameterOutOfRange) {
  EXPECT_EQ(validate(SamplingParams{}), "");
  SamplingParams edge;
  edge.temperature = 2.0f;
  edge.top_p = 1.0f;
  edge.min_p = 1.0f;
  edge.presence_penalty = -2.0f;
  edge.frequency_penalty = 2.0f;
  edge.top_logprobs = 20;
  edge.repeat_last_n = -1;
  edge.top_k = -1;
  edge.logit_bias = {{0, -100.0f}, {7, 100.0f}};
  EXPECT_EQ(validate(edge), "");

  const auto expect_rejected = [](auto change, const std::string& message) {
    SamplingParams params;
    change(params);
    EXPECT_EQ(validate(params).rfind(message, 0), 0u) << validate(params);
    EXPECT_THROW(Sampler(params, 0), std::invalid_argument);
  };
  expect_rejected([](SamplingParams& p) { p.temperature = 2.5f; },
                  "temperature must be between 0 and 2, got 2.5");
  expect_rejected(
      [](SamplingParams& p) {
        p.allowed_tokens = {3, -1};
      },
      "allowed_token_ids must be token ids of 0 or more, got -1");
  expect_rejected(
      [](SamplingParams& p) {
        p.bad_word_sequences = {{3}, {}};
      },
      "bad_words must be sequences of one token or more, got an empty one");
  expect_rejected(
      [](SamplingParams& p) {
        p.bad_word_sequences = {{3, -2}};
      },
      "bad_words must be token ids of 0 or more, got -2");
  expect_rejected([](SamplingParams& p) { p.temperature = -0.1f; },
                  "temperature must be between 0 and 2");
  expect_rejected([](SamplingParams& p) { p.temperature = std::nanf(""); },
                  "temperature must be between 0 and 2");
  expect_rejected([](SamplingParams& p) { p.top_p = 0.0f; },
                  "top_p must be greater than 0 and at most 1, got 0");
  expect_rejected([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be");
  expect_rejected([](SamplingParams& p) { p.top_k = -2; },
                  "top_k must be -1 or 0 (off) or a count");
  expect_rejected([](SamplingParams& p) { p.min_p = 1.1f; }, "min_p must be between 0 and 1");
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = 0.0f; },
                  "repetition_penalty must be greater than 0");
  expect_rejected([](SamplingParams& p) { p.presence_penalty = 2.1f; },
                  "presence_penalty must be between -2 and 2");
  expect_rejected([](SamplingParams& p) { p.frequency_penalty = -3.0f; },
                  "frequency_penalty must be between -2 and 2");
  expect_rejected([](SamplingParams& p) { p.top_logprobs = 21; },
                  "top_logprobs must be between 0 and 20");
  expect_rejected([](SamplingParams& p) { p.repeat_last_n = -2; },
                  "repeat_last_n must be -1 (whole history), 0 (off) or a window length");
  expect_rejected(
      [](SamplingParams& p) {
        p.logit_bias = {{5, 100.5f}};
      },
      "logit_bias must be between -100 and 100, got 100.5");
  expect_rejected(
      [](SamplingParams& p) {
        p.logit_bias = {{-1, 1.0f}};
      },
      "logit_bias must be keyed by token ids of 0 or more");
  expect_rejected([](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens must be 0 or more");
  expect_rejected(
      [](SamplingParams& p) {
        p.ending_tokens = {2, -3};
      },
      "stop_token_ids must be token ids of 0 or more");
}

}  // namespace
}  // namespace pipeline
