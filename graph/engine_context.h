// What stages share: the model, its tokenizer and runner, the scheduler and the metrics.
// Built by the Engine before the graph; every stage's factory receives it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "graph/metrics.h"
#include "graph/scheduler.h"
#include "graph/serve_config.h"
#include "io/chat_template.h"
#include "io/model_config.h"
#include "io/tokenizer.h"
#include "model/guided_decoding.h"
#include "model/model_runner.h"

namespace pipeline {

struct EngineContext {
  const ServeConfig& config;
  const LlamaConfig& model;
  const Tokenizer& tokenizer;
  const GuidedVocabulary& guided_vocabulary;  // for guided requests (JSON, regex, grammar)
  ChatTemplate chat_template;
  ModelRunner& runner;
  Scheduler& scheduler;
  Metrics& metrics;
  uint64_t seed_base;  // requests without a seed draw from seed_base + their number
  // Called once the engine can run nothing more (the runner threw RunnerFailure), with why:
  // the engine fails every request and takes no more.
  std::function<void(const std::string& why)> engine_failed;
};

}  // namespace pipeline
