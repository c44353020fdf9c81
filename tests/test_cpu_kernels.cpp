// Each CPU kernel against a plain double-precision reference on random data: odd sizes that are
// not multiples of any vector width, batch 1 and larger, every weight dtype, and every
// instruction-set path this machine supports, each forced in turn.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "io/dtype.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/huge_page_buffer.h"
#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/paged_kv.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/silu_mul.h"
#include "kernels/cpu/weight_matrix.h"

namespace pipeline::cpu {
namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight matrix stored in `dtype`, plus the float values it really holds after rounding.
struct TestWeights {
  std::vector<std::byte> bytes;
  std::vector<float> values;
  WeightMatrix view;
};

TestWeights make_weights(int rows, int cols, DType dtype, std::mt19937& rng) {
  TestWeights t;
  const std::vector<float> f = random_floats(size_t(rows) * cols, rng);
  t.bytes.resize(f.size() * dtype_size(dtype));
  for (size_t i = 0; i < f.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(t.bytes.data() + 4 * i, &f[i], 4);
    } else {
      const uint16_t h = dtype == DType::BF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
  }
  t.values.resize(f.size());
  for (size_t i = 0; i < f.size(); ++i) t.values[i] = load_as_f32(t.bytes.data(), dtype, i);
  t.view = WeightMatrix{t.bytes.data(), dtype, rows, cols};
  return t;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16}) {
    if (isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

TEST(CpuFeatures, BestIsaIsSupported) {
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_TRUE(isa_supported(best_matmul_isa()));
  EXPECT_TRUE(isa_supported(Isa::Portable));
}

// bf16 weights run on vdpbf16ps or on the widening AVX-512 kernel, whichever was timed faster on
// an AVX512_BF16 CPU, and on the widest kernel elsewhere; the choice holds for the process, and
// the default matmul runs what it says.
TEST(CpuFeatures, Bf16WeightsRunOnTheKernelTimedFasterAndOnlyThat) {
  for (DType activations : {DType::BF16, DType::F32}) {
    const Isa chosen = bf16_matmul_isa(activations);
    if (best_matmul_isa() == Isa::Avx512Bf16)
      EXPECT_TRUE(chosen == Isa::Avx512Bf16 || chosen == Isa::Avx512) << isa_name(chosen);
    else
      EXPECT_EQ(chosen, best_isa());
    EXPECT_EQ(bf16_matmul_isa(activations), chosen);

    std::mt19937 rng(7);
    const TestWeights weights = make_weights(40, 45, DType::BF16, rng);  // 45: a tail
    const PackedMatrix packed = PackedMatrix::stack(std::span(&weights.view, 1), activations);
    EXPECT_EQ(matmul_isa(packed), chosen);
    const std::vector<float> x = random_floats(3 * 45, rng);
    std::vector<float> by_default(3 * 40), by_choice(3 * 40);
    matmul(x.data(), 3, packed, by_default.data(), 40);
    matmul(chosen, x.data(), 3, packed, by_choice.data(), 40);
    EXPECT_EQ(by_default, by_choice);
  }
}

// The entry points that take an instruction set refuse one this CPU lacks (on a CPU with all of
// them there is none to try).
TEST(CpuFeatures, KernelsRefuseAnInstructionSetTheCpuLacks) {
  std::mt19937 rng(5);
  const TestWeights w = make_weights(16, 4, DType::F32, rng);
  const PackedMatrix packed = PackedMatrix::stack({&w.view, 1}, DType::F32);
  std::vector<float> x(4), y(16), pool(64);
  const PagedKvLayer kv{pool.data(), pool.data(), 4, 1, 4, DType::F32};
  const std::vector<int32_t> table = {0};
  const AttentionSequence seq{0, 1, 0, table};
  for (Isa isa : {Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16}) {
    if (isa_supported(isa)) continue;
    SCOPED_TRACE(isa_name(isa));
    EXPECT_THROW(matmul(isa, x.data(), 1, packed, y.data(), 16), std::invalid_argument);
    EXPECT_THROW(paged_attention(isa, kv, {&seq, 1}, 1, x.data(), 4, y.data()),
                 std::invalid_argument);
  }
}

// Y = X·Wᵀ in double over the float values the stored weights really hold.
double reference_dot(const TestWeights& w, int row, const float* x, int cols, double* magnitude) {
  double sum = 0.0;
  for (int i = 0; i < cols; ++i) {
    const double p = double(w.values[size_t(row) * cols + i]) * x[i];
    sum += p;
    *magnitude += std::abs(p);
  }
  return sum;
}

// Each weight dtype with the activations it can take: only a bf16 matrix can round them to bf16
// (PackedMatmul.OnlyBf16MatricesTakeBf16Activations checks that the others ignore it).
struct MatrixKind {
  DType dtype, activations;
};
constexpr MatrixKind kMatrixKinds[] = {{DType::F32, DType::F32},
                                       {DType::BF16, DType::F32},
                                       {DType::BF16, DType::BF16},
                                       {DType::F16, DType::F32}};

// The activations a matrix really multiplies: x itself, or x rounded to bf16 where a bf16 matrix
// takes bf16 activations.
std::vector<float> activations_for(const PackedMatrix& w, std::vector<float> x) {
  if (w.activations() == DType::BF16) {
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  }
  return x;
}

TEST(PackedMatmul, StackedPartsMatchReferenceOnEveryIsaAndDtype) {
  std::mt19937 rng(11);
  // (batch, in, rows of each part): odd in_features, parts that end mid-panel, batches that
  // cover the decode tile (<= 4 rows), the wide tile (12) and its ragged tails.
  struct Case {
    int batch, in;
    std::vector<int> parts;
  };
  const Case cases[] = {{1, 37, {13}},         {1, 64, {8, 3, 3}}, {3, 67, {40}},
                        {5, 16, {4, 20}},      {13, 300, {21}},    {26, 5, {3}},
                        {2, 129, {33, 17, 5}}, {4, 130, {64, 16}}, {30, 64, {70}}};
  for (Isa isa : supported_isas()) {
    for (const auto [dtype, activations] : kMatrixKinds) {
      for (const Case& c : cases) {
        std::vector<TestWeights> parts;
        std::vector<WeightMatrix> views;
        for (int rows : c.parts) parts.push_back(make_weights(rows, c.in, dtype, rng));
        for (const TestWeights& t : parts) views.push_back(t.view);
        const PackedMatrix packed = PackedMatrix::stack(views, activations);
        const std::vector<float> x = random_floats(size_t(c.batch) * c.in, rng);
        const std::vector<float> x_used = activations_for(packed, x);
        const size_t ldy = size_t(packed.out_cols()) + 3;
        for (MatmulMode mode : {MatmulMode::Overwrite, MatmulMode::Accumulate}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + dtype_name(dtype) + " activations " +
                       dtype_name(activations) + " batch " + std::to_string(c.batch) + " in " +
                       std::to_string(c.in) + (mode == MatmulMode::Accumulate ? " +=" : " ="));
          const std::vector<float> y0 = random_floats(size_t(c.batch) * ldy, rng);
          std::vector<float> y = y0;
          matmul(isa, x.data(), c.batch, packed, y.data(), ldy, mode);
          for (int b = 0; b < c.batch; ++b) {
            for (size_t part = 0; part < parts.size(); ++part) {
              for (int r = 0; r < c.parts[part]; ++r) {
                const size_t at = size_t(b) * ldy + size_t(packed.part_offset(int(part)) + r);
                double magnitude = mode == MatmulMode::Accumulate ? std::abs(y0[at]) : 0.0;
                const double dot = reference_dot(parts[part], r, x_used.data() + size_t(b) * c.in,
                                                 c.in, &magnitude);
                const double ref = (mode == MatmulMode::Accumulate ? y0[at] : 0.0) + dot;
                ASSERT_NEAR(y[at], ref, 1e-5 * magnitude + 1e-6)
                    << "row " << b << " part " << part << " output " << r;
              }
            }
            // Past the last output column nothing is written.
            for (size_t col = size_t(packed.out_cols()); col < ldy; ++col) {
              ASSERT_EQ(y[size_t(b) * ldy + col], y0[size_t(b) * ldy + col]);
            }
          }
        }
      }
    }
  }
}

// Only a bf16 matrix rounds its activations; a float32 or float16 one keeps them in float32.
TEST(PackedMatmul, OnlyBf16MatricesTakeBf16Activations) {
  std::mt19937 rng(16);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const TestWeights w = make_weights(20, 9, dtype, rng);
    EXPECT_EQ(PackedMatrix::stack(std::span(&w.view, 1)).activations(), DType::F32);
    EXPECT_EQ(PackedMatrix::stack(std::span(&w.view, 1), DType::BF16).activations(),
              dtype == DType::BF16 ? DType::BF16 : DType::F32);
    EXPECT_EQ(PackedMatrix::interleave(w.view, w.view, DType::BF16).activations(),
              dtype == DType::BF16 ? DType::BF16 : DType::F32);
    EXPECT_THROW(PackedMatrix::stack(std::span(&w.view, 1), DType::F16), std::invalid_argument);
  }
}

TEST(PackedMatmul, InterleavesTwoMatricesPanelByPanel) {
  std::mt19937 rng(12);
  for (Isa isa : supported_isas()) {
    const TestWeights a = make_weights(37, 29, DType::BF16, rng);
    const TestWeights b = make_weights(37, 29, DType::BF16, rng);
    const PackedMatrix packed = PackedMatrix::interleave(a.view, b.view);
    ASSERT_EQ(packed.out_cols(), 2 * 48);
    const int batch = 6;
    const std::vector<float> x = random_floats(size_t(batch) * 29, rng);
    std::vector<float> y(size_t(batch) * packed.out_cols());
    matmul(isa, x.data(), batch, packed, y.data(), size_t(packed.out_cols()));
    for (int row = 0; row < batch; ++row) {
      for (int r = 0; r < 37; ++r) {
        const size_t at = size_t(row) * packed.out_cols() + size_t(r / 16) * 32 + size_t(r % 16);
        double ma = 0.0, mb = 0.0;
        const double ref_a = reference_dot(a, r, x.data() + size_t(row) * 29, 29, &ma);
        const double ref_b = reference_dot(b, r, x.data() + size_t(row) * 29, 29, &mb);
        EXPECT_NEAR(y[at], ref_a, 1e-5 * ma);
        EXPECT_NEAR(y[at + 16], ref_b, 1e-5 * mb);
      }
    }
  }
}

// A row's result must not depend on the batch around it (continuous batching relies on it), so
// every tile shape must accumulate in the same order. Batches of 2 to 4 rows and 29 (tiles of
// 6, 6, 6, 6, 5 rows on AVX2; 12, 12, 5 on AVX-512) against each row alone.
TEST(PackedMatmul, RowResultsDoNotDependOnBatchSize) {
  std::mt19937 rng(13);
  for (Isa isa : supported_isas()) {
    for (const auto [dtype, activations] : kMatrixKinds) {
      const TestWeights w = make_weights(150, 95, dtype, rng);
      const PackedMatrix packed = PackedMatrix::stack(std::span(&w.view, 1), activations);
      for (int batch : {2, 3, 4, 29}) {
        const std::vector<float> x = random_floats(size_t(batch) * 95, rng);
        std::vector<float> all(size_t(batch) * 150);
        matmul(isa, x.data(), batch, packed, all.data(), 150);
        for (int row = 0; row < batch; ++row) {
          std::vector<float> alone(150);
          matmul(isa, x.data() + size_t(row) * 95, 1, packed, alone.data(), 150);
          ASSERT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + size_t(row) * 150))
              << isa_name(isa) << " " << dtype_name(dtype) << " activations "
              << dtype_name(activations) << " batch " << batch << " row " << row;
        }
      }
    }
  }
}

TEST(PackedMatmul, RejectsMismatchedPartsAndShortLdy) {
  std::mt19937 rng(15);
  const TestWeights a = make_weights(4, 8, DType::BF16, rng);
  const TestWeights b = make_weights(4, 9, DType::BF16, rng);
  const TestWeights c = make_weights(5, 8, DType::F32, rng);
  const WeightMatrix ab[] = {a.view, b.view};
  const WeightMatrix ac[] = {a.view, c.view};
  EXPECT_THROW(PackedMatrix::stack(ab), std::invalid_argument);
  EXPECT_THROW(PackedMatrix::stack(ac), std::invalid_argument);
  EXPECT_THROW(PackedMatrix::interleave(a.view, c.view), std::invalid_argument);
  const PackedMatrix packed = PackedMatrix::stack(std::span(&a.view, 1));
  std::vector<float> x(8), y(4);
  EXPECT_THROW(matmul(x.data(), 1, packed, y.data(), 3), std::invalid_argument);
}

TEST(HugePageBuffer, IsHugePageAlignedZeroedAndWritable) {
  const size_t huge_page = size_t(2) << 20;
  const size_t bytes = 2 * huge_page + 3;  // whole huge pages and a ragged tail
  const HugePageBuffer buffer = allocate_huge_page_buffer(bytes);
  ASSERT_NE(buffer.get(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.get()) % huge_page, 0u);
  EXPECT_TRUE(std::all_of(buffer.get(), buffer.get() + bytes,
                          [](std::byte b) { return b == std::byte{0}; }));
  std::memset(buffer.get(), 0x5a, bytes);
  EXPECT_EQ(buffer[bytes - 1], std::byte{0x5a});
  EXPECT_EQ(allocate_huge_page_buffer(0), nullptr);
}

// Pages of `bytes` at `data` that are in memory now, by mincore().
size_t resident_pages(const std::byte* data, size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  if (mincore(const_cast<std::byte*>(data), bytes, in_core.data()) != 0) return 0;
  return size_t(
      std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return c & 1; }));
}

TEST(HugePageBuffer, MakeResidentBringsEveryPageIn) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t bytes = (size_t(8) << 20) + 3 * page + 5;  // huge pages and a ragged tail
  const HugePageBuffer buffer = allocate_huge_page_buffer(bytes);
  const size_t pages = (bytes + page - 1) / page;
  EXPECT_LT(resident_pages(buffer.get(), bytes), pages);  // fresh memory faults in as written
  make_resident(buffer.get(), bytes);
  EXPECT_EQ(resident_pages(buffer.get(), bytes), pages);
  EXPECT_TRUE(std::all_of(buffer.get(), buffer.get() + bytes,
                          [](std::byte b) { return b == std::byte{0}; }));
}

// Whole huge pages, kept while big enough; a growth hands out fresh memory that faults in by
// the huge page where THP allows it (here only its size, alignment and use are checked).
TEST(ScratchArray, GrowsByWholeHugePagesAndKeepsItsMemoryWhileBigEnough) {
  const size_t floats_per_huge_page = kHugePageBytes / sizeof(float);
  ScratchArray<float> scratch;
  EXPECT_EQ(scratch.capacity(), 0u);
  scratch.grow(10);
  EXPECT_EQ(scratch.capacity(), floats_per_huge_page);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(scratch.data()) % kHugePageBytes, 0u);
  const float* first = scratch.data();
  scratch.grow(floats_per_huge_page);
  EXPECT_EQ(scratch.data(), first);
  scratch.grow(floats_per_huge_page + 1);
  EXPECT_EQ(scratch.capacity(), 2 * floats_per_huge_page);
  std::fill_n(scratch.data(), scratch.capacity(), 1.5f);
  EXPECT_EQ(scratch.data()[scratch.capacity() - 1], 1.5f);
}

TEST(RmsNorm, MatchesReference) {
  std::mt19937 rng(3);
  for (int dim : {1, 7, 64, 131}) {
    const int rows = 5;
    const std::vector<float> x = random_floats(size_t(rows) * dim, rng, 3.0f);
    const std::vector<float> weight = random_floats(dim, rng);
    std::vector<float> y(x.size());
    rmsnorm(x.data(), weight.data(), rows, dim, 1e-5f, y.data());
    for (int r = 0; r < rows; ++r) {
      double sq = 0.0;
      for (int i = 0; i < dim; ++i) sq += double(x[size_t(r) * dim + i]) * x[size_t(r) * dim + i];
      const double inv_rms = 1.0 / std::sqrt(sq / dim + 1e-5);
      for (int i = 0; i < dim; ++i) {
        const size_t at = size_t(r) * dim + i;
        EXPECT_NEAR(y[at], x[at] * inv_rms * weight[i], 1e-5) << "dim " << dim;
      }
    }
    std::vector<float> in_place = x;  // y may alias x
    rmsnorm(in_place.data(), weight.data(), rows, dim, 1e-5f, in_place.data());
    EXPECT_EQ(in_place, y);
  }
}

TEST(Rope, RotatesHalvesAsHuggingFaceDoes) {
  std::mt19937 rng(4);
  const int head_dim = 10, num_heads = 3, max_pos = 600;
  const double theta = 500000.0;
  const RopeTable table(head_dim, max_pos, theta);
  const std::vector<int32_t> positions = {0, 1, 17, 599};
  const size_t stride = num_heads * head_dim + 4;  // rows may be wider than the heads
  const std::vector<float> x = random_floats(positions.size() * stride, rng);
  std::vector<float> y = x;
  apply_rope(table, positions, num_heads, y.data(), stride);
  const int half = head_dim / 2;
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int h = 0; h < num_heads; ++h) {
      const float* in = x.data() + t * stride + size_t(h) * head_dim;
      const float* out = y.data() + t * stride + size_t(h) * head_dim;
      for (int d = 0; d < head_dim; ++d) {
        // q·cos + rotate_half(q)·sin, rotate_half(q) = cat(-q[half:], q[:half]).
        const int i = d % half;
        const double angle = positions[t] * std::pow(theta, -2.0 * i / head_dim);
        const double rotated = d < half ? -double(in[d + half]) : double(in[d - half]);
        EXPECT_NEAR(out[d], in[d] * std::cos(angle) + rotated * std::sin(angle), 1e-5);
      }
    }
    for (size_t d = num_heads * head_dim; d < stride; ++d)
      EXPECT_EQ(y[t * stride + d], x[t * stride + d]);
  }
}

TEST(Rope, RejectsOddHeadDim) {
  EXPECT_THROW(RopeTable(7, 16, 10000.0), std::invalid_argument);
}

TEST(SiluMul, ReadsInterleavedGateAndUpBlocks) {
  std::mt19937 rng(5);
  const int block = 16;
  for (int units : {1, 13, 16, 40, 3000}) {
    const int rows = 3;
    const size_t ld = size_t((units + block - 1) / block) * 2 * block + 5;
    const std::vector<float> gate_up = random_floats(rows * ld, rng, 20.0f);
    std::vector<float> out(size_t(rows) * units);
    silu_mul_interleaved(gate_up.data(), ld, rows, units, block, out.data());
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < units; ++i) {
        const size_t at = size_t(r) * ld + size_t(i / block) * 2 * block + size_t(i % block);
        const double g = gate_up[at], u = gate_up[at + block];
        EXPECT_NEAR(out[size_t(r) * units + i], g / (1.0 + std::exp(-g)) * u,
                    1e-5 * (1 + std::abs(g)))
            << "row " << r << " unit " << i;
      }
    }
  }
}

// From the table in place, and from the same table packed (a tied lm_head): 37 rows span three
// panels, the last one partly, and 7 columns leave the last pair's odd half empty.
TEST(Embedding, GathersRowsInEveryDtypeFromTheTableOrItsPackedCopy) {
  std::mt19937 rng(6);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const TestWeights table = make_weights(37, 7, dtype, rng);
    const PackedMatrix packed = PackedMatrix::stack(std::span(&table.view, 1));
    const std::vector<int32_t> tokens = {3, 0, 36, 17, 3};
    std::vector<float> out(tokens.size() * 7), from_packed(out.size());
    embedding_lookup(table.view, tokens, out.data());
    embedding_lookup(packed, tokens, from_packed.data());
    for (size_t t = 0; t < tokens.size(); ++t) {
      for (int i = 0; i < 7; ++i) {
        EXPECT_EQ(out[t * 7 + i], table.values[size_t(tokens[t]) * 7 + i]) << dtype_name(dtype);
        EXPECT_EQ(from_packed[t * 7 + i], out[t * 7 + i]) << dtype_name(dtype);
      }
    }
  }
}

// Dense causal GQA attention in double over one sequence's full K and V ([positions, kv_dim]).
std::vector<double> reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int start_pos, int num_queries,
                                        int num_heads, int num_kv_heads, int head_dim) {
  const int group = num_heads / num_kv_heads;
  const int q_dim = num_heads * head_dim, kv_dim = num_kv_heads * head_dim;
  std::vector<double> out(size_t(num_queries) * q_dim);
  for (int i = 0; i < num_queries; ++i) {
    const int keys = start_pos + i + 1;
    for (int h = 0; h < num_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> scores(keys);
      for (int p = 0; p < keys; ++p) {
        double s = 0.0;
        for (int d = 0; d < head_dim; ++d) {
          s += double(q[size_t(i) * q_dim + h * head_dim + d]) *
               k[size_t(p) * kv_dim + kvh * head_dim + d];
        }
        scores[p] = s / std::sqrt(double(head_dim));
      }
      const double m = *std::max_element(scores.begin(), scores.end());
      double sum = 0.0;
      for (double& s : scores) sum += (s = std::exp(s - m));
      for (int d = 0; d < head_dim; ++d) {
        double acc = 0.0;
        for (int p = 0; p < keys; ++p)
          acc += scores[p] * v[size_t(p) * kv_dim + kvh * head_dim + d];
        out[size_t(i) * q_dim + h * head_dim + d] = acc / sum;
      }
    }
  }
  return out;
}

// The values a KV pool of `dtype` holds for `x`.
std::vector<float> as_stored(std::vector<float> x, DType dtype) {
  if (dtype == DType::BF16)
    for (float& f : x) f = bf16_to_f32(f32_to_bf16(f));
  return x;
}

// `elements` NaNs of `dtype` (F32 or BF16).
std::vector<std::byte> nans(size_t elements, DType dtype) {
  std::vector<std::byte> pool(elements * dtype_size(dtype));
  for (size_t i = 0; i < elements; ++i) {
    if (dtype == DType::F32) {
      const float nan = std::nanf("");
      std::memcpy(pool.data() + 4 * i, &nan, 4);
    } else {
      const uint16_t nan = 0x7fc0;
      std::memcpy(pool.data() + 2 * i, &nan, 2);
    }
  }
  return pool;
}

// One layer's KV pool of `num_blocks` blocks, every slot NaN: unwritten slots must never be
// read. `layer` points into k and v.
struct NanKvPool {
  NanKvPool(int num_blocks, int block_size, int num_kv_heads, int head_dim, DType dtype)
      : k(nans(size_t(num_blocks) * block_size * num_kv_heads * head_dim, dtype)),
        v(nans(k.size() / dtype_size(dtype), dtype)),
        layer{k.data(), v.data(), block_size, num_kv_heads, head_dim, dtype} {}
  NanKvPool(const NanKvPool&) = delete;
  NanKvPool& operator=(const NanKvPool&) = delete;

  std::vector<std::byte> k, v;
  PagedKvLayer layer;
};

// Every block of a pool of `num_blocks`, in a random order: a table whose blocks lie anywhere.
std::vector<int32_t> shuffled_blocks(int num_blocks, std::mt19937& rng) {
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  return blocks;
}

// An attention layout and pool type, for a test's trace.
std::string layout_name(int head_dim, int num_heads, int num_kv_heads, DType dtype) {
  return "head_dim " + std::to_string(head_dim) + ", " + std::to_string(num_heads) +
         " heads over " + std::to_string(num_kv_heads) + ", " + dtype_name(dtype) + " pool";
}

// One batch of paged attention against the dense reference, for one layout and pool type. The
// reference attends the keys and values the pool holds (rounded to bf16 for a bf16 pool), so
// the kernel must match it as closely for either type.
void check_paged_attention(Isa isa, int head_dim, int block_size, int num_heads, int num_kv_heads,
                           DType dtype) {
  SCOPED_TRACE(std::string(isa_name(isa)) + ", head_dim " + std::to_string(head_dim) +
               ", block_size " + std::to_string(block_size) + ", " + std::to_string(num_heads) +
               " heads over " + std::to_string(num_kv_heads) + ", " + dtype_name(dtype) + " pool");
  std::mt19937 rng(7);
  const int num_blocks = 64;
  const int kv_dim = num_kv_heads * head_dim, q_dim = num_heads * head_dim;
  const NanKvPool pool(num_blocks, block_size, num_kv_heads, head_dim, dtype);
  const PagedKvLayer& kv = pool.layer;

  // (start_pos, new tokens): a decode, a fresh long prompt (past the query and key chunks), a
  // continued prefill and a one-token prompt, in one batch.
  struct Case {
    int start_pos, num_queries;
  };
  const std::vector<Case> cases = {{40, 1}, {0, 70}, {23, 9}, {0, 1}};
  // Hand shuffled block ids out round-robin across sequences, so every table is non-contiguous.
  std::vector<int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::vector<std::vector<int32_t>> tables(cases.size());
  for (bool more = true; more;) {
    more = false;
    for (size_t s = 0; s < cases.size(); ++s) {
      const int need = (cases[s].start_pos + cases[s].num_queries + block_size - 1) / block_size;
      if (int(tables[s].size()) < need) {
        tables[s].push_back(free_blocks.back());
        free_blocks.pop_back();
        more = true;
      }
    }
  }

  std::vector<std::vector<float>> ks, vs, qs;
  std::vector<AttentionSequence> seqs;
  int rows = 0;
  for (size_t s = 0; s < cases.size(); ++s) {
    const int positions = cases[s].start_pos + cases[s].num_queries;
    ks.push_back(random_floats(size_t(positions) * kv_dim, rng, 2.0f));
    vs.push_back(random_floats(size_t(positions) * kv_dim, rng));
    qs.push_back(random_floats(size_t(cases[s].num_queries) * q_dim, rng, 2.0f));
    store_kv(kv, tables[s], 0, positions, ks[s].data(), vs[s].data(), size_t(kv_dim));
    seqs.push_back({rows, cases[s].num_queries, cases[s].start_pos, tables[s]});
    rows += cases[s].num_queries;
  }
  // q rows packed for one call, padded (as in the fused q/k/v output) for the other.
  const size_t q_stride = size_t(q_dim) + 7;
  std::vector<float> q(size_t(rows) * q_dim), q_padded(size_t(rows) * q_stride, std::nanf(""));
  for (size_t s = 0; s < cases.size(); ++s) {
    std::copy(qs[s].begin(), qs[s].end(), q.begin() + size_t(seqs[s].first_row) * q_dim);
  }
  for (int r = 0; r < rows; ++r) {
    std::copy_n(q.begin() + size_t(r) * q_dim, q_dim, q_padded.begin() + size_t(r) * q_stride);
  }
  std::vector<float> out(q.size()), out_strided(q.size());
  paged_attention(isa, kv, seqs, num_heads, q.data(), size_t(q_dim), out.data());
  paged_attention(isa, kv, seqs, num_heads, q_padded.data(), q_stride, out_strided.data());
  EXPECT_EQ(out, out_strided);

  for (size_t s = 0; s < cases.size(); ++s) {
    const std::vector<double> ref = reference_attention(
        qs[s], as_stored(ks[s], dtype), as_stored(vs[s], dtype), cases[s].start_pos,
        cases[s].num_queries, num_heads, num_kv_heads, head_dim);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(out[size_t(seqs[s].first_row) * q_dim + i], ref[i], 1e-5)
          << "sequence " << s << " element " << i;
    }
  }
}

// Head size 12, or a block size that is no multiple of 16, takes the generic kernel; 64 and 128
// (LLaMA's head sizes) with blocks of 16 or 32 the AVX-512 or AVX2 one. Groups of 3 and of 10
// query heads per KV head (the latter in two passes of at most 8). Float32 and bf16 pools. Every
// instruction set this CPU has.
TEST(PagedAttention, MatchesDenseReferenceThroughInterleavedBlockTables) {
  for (Isa isa : supported_isas()) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      check_paged_attention(isa, 12, 5, 6, 2, dtype);
      check_paged_attention(isa, 64, 5, 6, 2, dtype);
      check_paged_attention(isa, 64, 16, 6, 2, dtype);
      check_paged_attention(isa, 128, 16, 6, 2, dtype);
      check_paged_attention(isa, 64, 32, 20, 2, dtype);
      check_paged_attention(isa, 12, 16, 20, 2, dtype);
    }
  }
}

// A query's result must not depend on the queries it is attended with: a prompt prefilled in
// one call, the same prompt continued from the middle, and each of its queries alone (as a
// decode at that position) give the same bits. Group sizes 1 (as LLaMA-2), 2 and 8, head sizes
// 64 and 128 (the AVX-512 or AVX2 kernel) and 12 (the generic one), on every instruction set.
void check_rows_independent(Isa isa, int head_dim, int num_heads, int num_kv_heads, DType dtype) {
  SCOPED_TRACE(std::string(isa_name(isa)) + ", " +
               layout_name(head_dim, num_heads, num_kv_heads, dtype));
  std::mt19937 rng(11);
  const int block_size = 16, positions = 150;
  const int num_blocks = (positions + block_size - 1) / block_size;
  const int kv_dim = num_kv_heads * head_dim, q_dim = num_heads * head_dim;
  const NanKvPool pool(num_blocks, block_size, num_kv_heads, head_dim, dtype);
  const PagedKvLayer& kv = pool.layer;
  const std::vector<int32_t> table = shuffled_blocks(num_blocks, rng);
  const std::vector<float> k = random_floats(size_t(positions) * kv_dim, rng, 2.0f);
  const std::vector<float> v = random_floats(size_t(positions) * kv_dim, rng);
  const std::vector<float> q = random_floats(size_t(positions) * q_dim, rng, 2.0f);
  store_kv(kv, table, 0, positions, k.data(), v.data(), size_t(kv_dim));

  // Queries [first, first + count) of the prompt in one call.
  const auto attend = [&](int first, int count) {
    const AttentionSequence seq{0, count, first, table};
    std::vector<float> out(size_t(count) * q_dim);
    paged_attention(isa, kv, {&seq, 1}, num_heads, q.data() + size_t(first) * q_dim, size_t(q_dim),
                    out.data());
    return out;
  };
  const std::vector<float> whole = attend(0, positions);
  const std::vector<float> continued = attend(37, positions - 37);
  EXPECT_TRUE(std::equal(continued.begin(), continued.end(), whole.begin() + 37 * q_dim));
  for (int i = 0; i < positions; ++i) {
    const std::vector<float> alone = attend(i, 1);
    ASSERT_TRUE(std::equal(alone.begin(), alone.end(), whole.begin() + size_t(i) * q_dim))
        << "query " << i;
  }
}

TEST(PagedAttention, AQuerysResultDoesNotDependOnTheQueriesBesideIt) {
  for (Isa isa : supported_isas()) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      check_rows_independent(isa, 64, 4, 4, dtype);
      check_rows_independent(isa, 64, 8, 4, dtype);
      check_rows_independent(isa, 64, 16, 2, dtype);
      check_rows_independent(isa, 128, 3, 3, dtype);
      check_rows_independent(isa, 12, 6, 3, dtype);
    }
  }
}

// Many sequences decoding at once, each at its own length, over blocks shuffled through the
// pool (as a serving batch's): each query's result is the bits it gets decoding alone, and
// matches the dense reference.
void check_decoding_batch(Isa isa, int head_dim, int num_heads, int num_kv_heads, DType dtype) {
  SCOPED_TRACE(std::string(isa_name(isa)) + ", " +
               layout_name(head_dim, num_heads, num_kv_heads, dtype));
  std::mt19937 rng(13);
  const int block_size = 16, num_seqs = 24, max_positions = 150;
  const int blocks_per_seq = (max_positions + block_size - 1) / block_size;
  const int num_blocks = num_seqs * blocks_per_seq;
  const int kv_dim = num_kv_heads * head_dim, q_dim = num_heads * head_dim;
  const NanKvPool pool(num_blocks, block_size, num_kv_heads, head_dim, dtype);
  const PagedKvLayer& kv = pool.layer;
  const std::vector<int32_t> block_ids = shuffled_blocks(num_blocks, rng);

  std::vector<std::vector<float>> ks, vs;
  std::vector<AttentionSequence> seqs;
  const std::vector<float> q = random_floats(size_t(num_seqs) * q_dim, rng, 2.0f);
  for (int s = 0; s < num_seqs; ++s) {
    const int positions = 1 + int(rng() % max_positions);
    const std::span<const int32_t> table(block_ids.data() + size_t(s) * blocks_per_seq,
                                         size_t(blocks_per_seq));
    ks.push_back(random_floats(size_t(positions) * kv_dim, rng, 2.0f));
    vs.push_back(random_floats(size_t(positions) * kv_dim, rng));
    store_kv(kv, table, 0, positions, ks.back().data(), vs.back().data(), size_t(kv_dim));
    seqs.push_back({s, 1, positions - 1, table});
  }
  std::vector<float> out(q.size());
  paged_attention(isa, kv, seqs, num_heads, q.data(), size_t(q_dim), out.data());
  for (int s = 0; s < num_seqs; ++s) {
    const AttentionSequence alone{0, 1, seqs[size_t(s)].start_pos, seqs[size_t(s)].block_table};
    std::vector<float> out_alone(static_cast<size_t>(q_dim));
    paged_attention(isa, kv, {&alone, 1}, num_heads, q.data() + size_t(s) * q_dim, size_t(q_dim),
                    out_alone.data());
    ASSERT_TRUE(std::equal(out_alone.begin(), out_alone.end(), out.begin() + size_t(s) * q_dim))
        << "sequence " << s;
    const std::vector<float> q_s(q.begin() + size_t(s) * q_dim, q.begin() + size_t(s + 1) * q_dim);
    const std::vector<double> ref =
        reference_attention(q_s, as_stored(ks[size_t(s)], dtype), as_stored(vs[size_t(s)], dtype),
                            seqs[size_t(s)].start_pos, 1, num_heads, num_kv_heads, head_dim);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(out[size_t(s) * q_dim + i], ref[i], 1e-5) << "sequence " << s << " element " << i;
  }
}

TEST(PagedAttention, ManySequencesDecodingMatchEachAloneAndTheReference) {
  for (Isa isa : supported_isas()) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      check_decoding_batch(isa, 64, 12, 12, dtype);
      check_decoding_batch(isa, 64, 32, 4, dtype);
      check_decoding_batch(isa, 128, 8, 8, dtype);
      check_decoding_batch(isa, 12, 6, 3, dtype);
    }
  }
}

TEST(PagedAttention, RefusesAnF16Pool) {
  std::vector<std::byte> pool(64);
  const PagedKvLayer kv{pool.data(), pool.data(), 4, 1, 4, DType::F16};
  const std::vector<int32_t> table = {0};
  const AttentionSequence seq{0, 1, 0, table};
  std::vector<float> q(4), out(4), k(4), v(4);
  EXPECT_THROW(store_kv(kv, table, 0, 1, k.data(), v.data(), 4), std::invalid_argument);
  for (Isa isa : supported_isas()) {
    EXPECT_THROW(paged_attention(isa, kv, {&seq, 1}, 1, q.data(), 4, out.data()),
                 std::invalid_argument);
  }
}

TEST(PagedKv, StoresEachPositionInItsBlockSlot) {
  const PagedKvLayer shape{nullptr, nullptr, 4, 2, 3};
  std::vector<float> k(size_t(8) * 4 * 6, 0.0f), v(k.size(), 0.0f);
  const PagedKvLayer kv{k.data(), v.data(), 4, 2, 3};
  const std::vector<int32_t> table = {6, 1, 3};
  // Rows of 8 floats whose first 6 are the keys (values), as in the fused projection's output.
  std::vector<float> rows(3 * 8, -1.0f), vrows(3 * 8, -1.0f);
  for (int i = 0; i < 3; ++i) {
    std::iota(rows.begin() + 8 * i, rows.begin() + 8 * i + 6, 1.0f + 6 * i);
    std::iota(vrows.begin() + 8 * i, vrows.begin() + 8 * i + 6, 100.0f + 6 * i);
  }
  store_kv(kv, table, 3, 3, rows.data(), vrows.data(), 8);  // positions 3, 4, 5
  // Position 3: block 6, slot 3; head 0, dimension 0. K is [head_dim][block_size] per head.
  EXPECT_EQ(k[shape.head_block_offset(6, 0) + 3], 1.0f);
  EXPECT_EQ(v[shape.head_block_offset(6, 0) + 3 * 3], 100.0f);
  // Position 4: block 1, slot 0.
  EXPECT_EQ(k[shape.head_block_offset(1, 0)], 7.0f);
  // Position 5: block 1, slot 1; element 5 is head 1, dimension 2.
  EXPECT_EQ(k[shape.head_block_offset(1, 1) + 2 * 4 + 1], 18.0f);
  EXPECT_EQ(v[shape.head_block_offset(1, 1) + 1 * 3 + 2], 117.0f);
  EXPECT_EQ(std::count(k.begin(), k.end(), 0.0f), ptrdiff_t(k.size() - 18));
}

// A bf16 pool holds each key and value rounded to nearest even, in the same slots.
TEST(PagedKv, StoresBf16RoundedToNearestEven) {
  std::vector<uint16_t> k(size_t(2) * 4 * 2, 0), v(k.size(), 0);
  const PagedKvLayer kv{k.data(), v.data(), 4, 1, 2, DType::BF16};
  const std::vector<int32_t> table = {1};
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: it rounds to the even one, 1.
  const std::vector<float> keys = {1.0f + 1.0f / 256, -3.0f}, values = {1e-3f, 65504.0f};
  store_kv(kv, table, 2, 1, keys.data(), values.data(), 2);  // position 2: block 1, slot 2
  const size_t at = kv.head_block_offset(1, 0);
  EXPECT_EQ(k[at + 2], f32_to_bf16(1.0f));
  EXPECT_EQ(k[at + 4 + 2], f32_to_bf16(-3.0f));
  EXPECT_EQ(v[at + 2 * 2], f32_to_bf16(1e-3f));
  EXPECT_EQ(v[at + 2 * 2 + 1], f32_to_bf16(65504.0f));
  EXPECT_EQ(std::count(k.begin(), k.end(), uint16_t(0)), ptrdiff_t(k.size() - 2));
}

}  // namespace
}  // namespace pipeline::cpu
