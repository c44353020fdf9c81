// NVTX ranges of the CUDA backend, in the "pipeline" domain that the flow-graph nodes use, so
// an Nsight Systems timeline shows embedding / attention / mlp / lm_head inside each step.
#pragma once

#include <nvtx3/nvtx3.hpp>

namespace pipeline::cuda {

struct NvtxDomain {
  static constexpr char const* name{"pipeline"};
};

// A range open for the lifetime of the object: `NvtxRange range{"attention"};`
using NvtxRange = nvtx3::scoped_range_in<NvtxDomain>;

}  // namespace pipeline::cuda
