// A sampler held to a guide, drawing from random logits: whatever the model would say, guided
// decoding must keep the answer a beginning of a text the guide allows and end it only whole.
// The tests of each kind of guide walk it so and check the text with their own reference.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/guided_decoding.h"
#include "model/sampling.h"

namespace pipeline::testing {

struct GuidedWalk {
  std::string written;  // the tokens' text, the end of sequence left out
  bool ended = false;   // it drew the end of sequence
};

// Up to `steps` draws, greedy on even runs and at temperature 1 on odd ones, each from logits
// of `rng`'s normal(0, 3). After each token the text so far must satisfy `continues`; where it
// does not, the walk records a failure and stops.
inline GuidedWalk walk_with_random_logits(
    const GuidedVocabulary& vocabulary, GuidedDecoding guide, int run, std::mt19937& rng, int steps,
    const std::function<bool(const std::string&)>& continues) {
  SamplingParams params;
  params.temperature = run % 2 ? 1.0f : 0.0f;
  Sampler sampler(params, uint64_t(run), std::move(guide));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  GuidedWalk walk;
  std::vector<int32_t> history;
  for (int step = 0; step < steps && !walk.ended; ++step) {
    std::vector<float> logits(size_t(vocabulary.size()));
    for (float& x : logits) x = normal(rng);
    const int32_t token = sampler.sample(logits, history).token;
    history.push_back(token);
    walk.ended = vocabulary.is_eos(token);
    if (!walk.ended) walk.written += vocabulary.text(token);
    if (!continues(walk.written)) {
      ADD_FAILURE() << "run " << run << " wrote " << walk.written;
      return walk;
    }
  }
  return walk;
}

}  // namespace pipeline::testing
