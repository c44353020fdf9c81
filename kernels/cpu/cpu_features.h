// Which x86-64 vector instruction sets the running CPU offers. The kernels are compiled for the
// baseline x86-64 and pick their AVX2 or AVX-512 code at run time, so one binary runs anywhere.
#pragma once

namespace pipeline::cpu {

enum class Isa {
  Portable,  // plain C++, any CPU
  Avx2,      // AVX2 + FMA + F16C
  Avx512,    // AVX-512 F, BW and VL (plus everything Avx2 needs)
};

const char* isa_name(Isa isa);
bool isa_supported(Isa isa);
// The widest supported Isa, detected once.
Isa best_isa();

}  // namespace pipeline::cpu
