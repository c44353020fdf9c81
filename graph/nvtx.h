// NVTX ranges in the "pipeline" domain, one per graph-node body, so that
// `nsys profile -t cuda,nvtx` shows the stages beside the kernels. Without the NVTX headers
// (PIPELINE_HAVE_NVTX undefined) both classes are empty and the ranges compile away.
#pragma once

#include <string>

#ifdef PIPELINE_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace pipeline {

#ifdef PIPELINE_HAVE_NVTX

// A range name registered once (at graph build time), cheap to open many times.
class NvtxName {
 public:
  explicit NvtxName(const std::string& name)
      : handle_(nvtxDomainRegisterStringA(domain(), name.c_str())) {}

  static nvtxDomainHandle_t domain() {
    static const nvtxDomainHandle_t handle = nvtxDomainCreateA("pipeline");
    return handle;
  }
  nvtxStringHandle_t handle() const { return handle_; }

 private:
  nvtxStringHandle_t handle_;
};

class NvtxRange {
 public:
  explicit NvtxRange(const NvtxName& name) {
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attributes.message.registered = name.handle();
    nvtxDomainRangePushEx(NvtxName::domain(), &attributes);
  }
  ~NvtxRange() { nvtxDomainRangePop(NvtxName::domain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

#else

class NvtxName {
 public:
  explicit NvtxName(const std::string&) {}
};

class NvtxRange {
 public:
  explicit NvtxRange(const NvtxName&) {}
};

#endif

}  // namespace pipeline
