// Whether programmatic dependent launch (dependent_launch.cuh) is on, for the kernels' launches
// and for the host code that reports it.
#pragma once

namespace pipeline::cuda {

// Whether launches may overlap: the code device 0 runs was compiled for compute capability 9.0
// or newer, so wait_for_previous_kernel() and allow_next_kernel() wait and trigger. A build
// without sm_90 code run on a Hopper GPU runs PTX of an older architecture, in which both calls
// compiled to nothing: a kernel launched early there would read its predecessor's output before
// it is written. PIPELINE_CUDA_PDL=0 in the environment turns it off.
bool dependent_launch_supported();

// The compute capability whose PTX the kernels device 0 runs came from (90 for compute_90), or 0
// where it cannot be asked: what dependent_launch_supported() decides on.
int kernel_ptx_architecture();

}  // namespace pipeline::cuda
