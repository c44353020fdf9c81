#include "kernels/cpu/cpu_features.h"

#include <stdexcept>
#include <string>

namespace pipeline::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Portable:
      return "portable";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx512Bf16:
      return "avx512bf16";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case Isa::Portable:
      return true;
    case Isa::Avx2:
      return avx2;
    case Isa::Avx512:
      return avx512;
    case Isa::Avx512Bf16:
      return avx512 && __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

void require_isa(Isa isa, const char* caller) {
  if (!isa_supported(isa)) {
    throw std::invalid_argument(std::string(caller) + ": instruction set " + isa_name(isa) +
                                " is not supported by this CPU");
  }
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::Avx512) ? Isa::Avx512
                          : isa_supported(Isa::Avx2) ? Isa::Avx2
                                                     : Isa::Portable;
  return best;
}

Isa best_matmul_isa() {
  static const Isa best = isa_supported(Isa::Avx512Bf16) ? Isa::Avx512Bf16 : best_isa();
  return best;
}

}  // namespace pipeline::cpu
