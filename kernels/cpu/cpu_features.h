// Which x86-64 vector instruction sets the running CPU offers. The kernels are compiled for the
// baseline x86-64 and pick their AVX2 or AVX-512 code at run time, so one binary runs anywhere.
#pragma once

namespace pipeline::cpu {

enum class Isa {
  Portable,    // plain C++, any CPU
  Avx2,        // AVX2 + FMA + F16C
  Avx512,      // AVX-512 F, BW and VL (plus everything Avx2 needs)
  Avx512Bf16,  // Avx512 plus AVX512_BF16's vdpbf16ps (bf16 pair dot products); only the packed
               // matmul has code for it, everything else runs its Avx512 code
};

const char* isa_name(Isa isa);
bool isa_supported(Isa isa);
// The widest vector instruction set supported (Portable, Avx2 or Avx512), detected once.
Isa best_isa();
// Throws std::invalid_argument, naming `caller`, where this CPU lacks `isa`: the kernels that
// take a chosen instruction set (for tests and benchmarks) check it first.
void require_isa(Isa isa, const char* caller);
// The widest instruction set the packed matmul has code for: Avx512Bf16 where the CPU has it,
// else best_isa(). Which one it runs is matmul_isa()'s choice (kernels/cpu/packed_matmul.h).
Isa best_matmul_isa();

}  // namespace pipeline::cpu
