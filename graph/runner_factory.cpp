#include "graph/runner_factory.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include "model/cpu_runner.h"
#ifdef PIPELINE_HAVE_CUDA
#include "kernels/cuda/cuda_runner.h"
#endif

namespace pipeline {

std::unique_ptr<ModelRunner> make_runner(const std::string& device,
                                         std::shared_ptr<const LlamaWeights> weights,
                                         const RunnerOptions& options) {
  if (std::find(std::begin(kDeviceNames), std::end(kDeviceNames), device) == std::end(kDeviceNames))
    throw std::invalid_argument("device '" + device + "': expected auto, cpu or cuda");
  if (device == "cpu") return make_cpu_runner(std::move(weights), options);
#ifdef PIPELINE_HAVE_CUDA
  std::string why;
  if (cuda_device_available(&why)) return make_cuda_runner(std::move(weights), options);
  if (device == "cuda")
    throw std::runtime_error("device 'cuda': no usable CUDA device (" + why + ")");
#else
  if (device == "cuda")
    throw std::runtime_error(
        "device 'cuda': this build has no CUDA backend (configure with -DPIPELINE_CUDA=ON)");
#endif
  return make_cpu_runner(std::move(weights), options);
}

}  // namespace pipeline
