// The ModelRunner for a config's `device`: "cpu", "cuda", or "auto" (CUDA when this build has
// the CUDA backend and a device is present, else the CPU).
#pragma once

#include <memory>
#include <string>

#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline {

// Throws std::invalid_argument on an unknown device name, std::runtime_error when "cuda" is
// asked for but this build or this machine has no CUDA device (the message says which).
std::unique_ptr<ModelRunner> make_runner(const std::string& device,
                                         std::shared_ptr<const LlamaWeights> weights,
                                         const RunnerOptions& options);

}  // namespace pipeline
