// Token embedding lookup: one row of the [vocab, hidden] table per token, widened to float32.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/weight_matrix.h"

namespace pipeline::cpu {

// out: [tokens.size(), table.cols]. Token ids must already be checked against table.rows.
void embedding_lookup(const WeightMatrix& table, std::span<const int32_t> tokens, float* out);
// The same from a packed [vocab, hidden] matrix (a tied lm_head): token t is output column t.
void embedding_lookup(const PackedMatrix& table, std::span<const int32_t> tokens, float* out);

}  // namespace pipeline::cpu
