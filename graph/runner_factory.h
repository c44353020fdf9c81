// The ModelRunner for a config's `device`: "cpu", "cuda", or "auto" (CUDA when this build has
// the CUDA backend and a device is present, else the CPU).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline {

// The most CPU kernel threads a runner is given (a config's `threads`, --threads): more than
// the hardware threads of the largest servers, and far below the counts whose thread slots
// exhaust memory (16000000 threw std::bad_alloc, and 100000 crashed the process at exit).
constexpr int kMaxThreads = 1024;

// The devices make_runner takes: a config's `device`, the commands' --device.
inline constexpr std::string_view kDeviceNames[] = {"auto", "cpu", "cuda"};

// Throws std::invalid_argument on an unknown device name, std::runtime_error when "cuda" is
// asked for but this build or this machine has no CUDA device (the message says which).
std::unique_ptr<ModelRunner> make_runner(const std::string& device,
                                         std::shared_ptr<const LlamaWeights> weights,
                                         const RunnerOptions& options);

}  // namespace pipeline
