#include "kernels/cpu/attention.h"

#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fast_exp.h"

namespace pipeline::cpu {
namespace {

// Keys scored together: one AVX-512 vector of scores, and the generic kernel's step between
// online-softmax updates (the AVX-512 kernel updates once per kKeySpan keys).
constexpr int kKeyChunk = 16;
// Rows (a query head at one position) attended in one pass over a KV head's keys and values,
// which are then read from memory once for all of them: the query heads of a GQA group and, in
// a prefill, consecutive queries of the prompt.
constexpr int kMaxRows = 16;
// Queries of one (sequence, KV head) handled by one task in a long prefill.
constexpr int kQueryChunk = 16;

// One row of attention: a query head (head_dim floats at q) over the first num_keys positions of
// its sequence, its result to out. Each row's arithmetic is the same whatever rows share its
// pass: a key past a row's own num_keys gets a weight of exactly 0, so a query's result does not
// depend on how a prompt was chunked or batched, and a prefill computes what a decode would.
struct AttentionRow {
  const float* q;
  float* out;
  int num_keys;
};

int max_keys(const AttentionRow* rows, int num_rows) {
  int keys = 0;
  for (int r = 0; r < num_rows; ++r) keys = std::max(keys, rows[r].num_keys);
  return keys;
}

// The online softmax of up to kMaxRows rows, each over the keys seen so far: running max, sum
// of exp(score - max), and the values weighted by the same (acc, head_dim floats a row).
struct SoftmaxState {
  float max[kMaxRows];
  float sum[kMaxRows];
  alignas(64) float acc[kMaxRows * kMaxAttentionHeadDim];

  SoftmaxState(int rows, int head_dim) {
    std::fill_n(max, rows, -std::numeric_limits<float>::infinity());
    std::fill_n(sum, rows, 0.0f);
    std::fill_n(acc, rows * head_dim, 0.0f);
  }

  // Folds in a chunk whose largest scaled score is chunk_max; returns the row's new max and
  // sets `correction`, the factor the row's sum and acc must be rescaled by (~0 on the first
  // chunk; exactly 1 when the chunk raises nothing, as for one whose keys the row does not see).
  float raise_max(int row, float chunk_max, float& correction) {
    const float new_max = std::max(max[row], chunk_max);
    correction = fast_exp(max[row] - new_max);
    max[row] = new_max;
    return new_max;
  }

  void write(const AttentionRow* rows, int num_rows, int head_dim) const {
    for (int r = 0; r < num_rows; ++r) {
      const float inv_sum = 1.0f / sum[r];
      for (int d = 0; d < head_dim; ++d) rows[r].out[d] = acc[r * head_dim + d] * inv_sum;
    }
  }
};

// A pool element as float: T is float, or uint16_t holding bf16 bits (kernels/cpu/paged_kv.h).
inline float widen(float x) {
  return x;
}
inline float widen(uint16_t bits) {
  return bf16_to_f32(bits);
}

// Each row's softmax(q · K[0..num_keys)ᵀ · scale) · V against KV head kv_head, any head_dim and
// block size. Always inlined into attend_generic_avx2/_portable below, so the loops vectorise for
// each; AVX-512 CPUs run attend_avx512 further down for LLaMA's head sizes.
template <class T>
[[gnu::always_inline]] inline void attend_generic(const PagedKvLayer& kv,
                                                  std::span<const int32_t> block_table, int kv_head,
                                                  float scale, const AttentionRow* rows,
                                                  int num_rows) {
  const int head_dim = kv.head_dim, block_size = kv.block_size;
  const int num_keys = max_keys(rows, num_rows);
  SoftmaxState state(num_rows, head_dim);
  for (int pos = 0; pos < num_keys;) {
    const int slot = pos % block_size;
    const int n = std::min({kKeyChunk, block_size - slot, num_keys - pos});
    const size_t at = kv.head_block_offset(block_table[pos / block_size], kv_head);
    // Key j, dimension d at keys[d·block_size + j]; value j, dimension d at values[j·head_dim + d].
    const T* keys = static_cast<const T*>(kv.k) + at + slot;
    const T* values = static_cast<const T*>(kv.v) + at + size_t(slot) * head_dim;
    for (int r = 0; r < num_rows; ++r) {
      // The chunk as a row that ends sooner sees it: its own last chunk is cut where it ends.
      const int live = std::min(n, rows[r].num_keys - pos);
      if (live <= 0) continue;
      const float* q = rows[r].q;
      float scores[kKeyChunk] = {};
      for (int d = 0; d < head_dim; ++d) {
        for (int j = 0; j < live; ++j) scores[j] += q[d] * widen(keys[size_t(d) * block_size + j]);
      }
      float chunk_max = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < live; ++j) chunk_max = std::max(chunk_max, scores[j] *= scale);
      float correction;
      const float new_max = state.raise_max(r, chunk_max, correction);
      float* acc = state.acc + r * head_dim;
      for (int d = 0; d < head_dim; ++d) acc[d] *= correction;
      float chunk_sum = 0.0f;
      for (int j = 0; j < live; ++j) chunk_sum += scores[j] = fast_exp(scores[j] - new_max);
      state.sum[r] = state.sum[r] * correction + chunk_sum;
      for (int j = 0; j < live; ++j) {
        for (int d = 0; d < head_dim; ++d) acc[d] += scores[j] * widen(values[j * head_dim + d]);
      }
    }
    pos += n;
  }
  state.write(rows, num_rows, head_dim);
}

// Chosen at run time in attend_function rather than with GCC's target_clones, whose ifunc
// resolvers run before ThreadSanitizer's runtime is up and crash a -fsanitize=thread build.
template <class T>
__attribute__((target("avx2"))) void attend_generic_avx2(const PagedKvLayer& kv,
                                                         std::span<const int32_t> block_table,
                                                         int kv_head, float scale,
                                                         const AttentionRow* rows, int num_rows) {
  attend_generic<T>(kv, block_table, kv_head, scale, rows, num_rows);
}
template <class T>
void attend_generic_portable(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                             int kv_head, float scale, const AttentionRow* rows, int num_rows) {
  attend_generic<T>(kv, block_table, kv_head, scale, rows, num_rows);
}

#define PIPELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// Keys the AVX-512 kernel scores before it rescales the softmax state and sums their values:
// four vectors of scores, so the reductions and the rescale come once per 64 keys, and a
// span's keys and values (32 KiB at head_dim 64) stay in L1 for the other rows of the pass.
constexpr int kKeySpan = 64;
// Rows the AVX-512 kernel scores and weighs together: each key row and value row it loads (and
// widens, from bf16) serves all of them.
constexpr int kRowsTogether = 4;
// Independent FMA chains per row for the scores (by dimension), so a row's dependency chains
// stay short of the FMA latency. Fixed, whatever the number of rows, so that a row's sums come
// in the same order in any pass. (Its weighted values are summed key by key in one chain per
// vector of the head.)
constexpr int kScoreChains = 4;

// Sixteen pool elements from p as floats, all of them or the lanes in `live` (the others 0,
// never read).
PIPELINE_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
PIPELINE_AVX512 inline __m512 load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
PIPELINE_AVX512 inline __m512 load16(__mmask16 live, const float* p) {
  return _mm512_maskz_loadu_ps(live, p);
}
PIPELINE_AVX512 inline __m512 load16(__mmask16 live, const uint16_t* p) {
  const __m256i bits = _mm256_maskz_loadu_epi16(live, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The lanes of the first n keys of a chunk (none for n <= 0, all for n >= 16).
inline __mmask16 first_keys(int n) {
  return n >= kKeyChunk ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Where the AVX-512 kernel finds a span's keys: per chunk of 16 positions, its first position,
// the start of its key rows (key j, dimension d at keys + d · block_size + j) and of its values
// (value j at values + j · head_dim), how many keys it holds, and the mask of those lanes.
template <class T>
struct SpanChunks {
  static constexpr int kMax = kKeySpan / kKeyChunk;
  int chunks = 0;
  int first[kMax];
  const T* keys[kMax];
  const T* values[kMax];
  int count[kMax];
  __mmask16 live[kMax];
};

// acc[r] += w[r][j] · value row j (16·VS floats at `row`) for each of R rows: the row is loaded
// once for all of them.
template <int VS, int R, class T>
PIPELINE_AVX512 inline void add_value_row(const T* row, const float* const* w, int j,
                                          __m512 (&acc)[R][VS]) {
  __m512 value[VS];
  for (int v = 0; v < VS; ++v) value[v] = load16(row + 16 * v);
  for (int r = 0; r < R; ++r) {
    const __m512 weight = _mm512_set1_ps(w[r][j]);
    for (int v = 0; v < VS; ++v) acc[r][v] = _mm512_fmadd_ps(weight, value[v], acc[r][v]);
  }
}

// Rows r0 .. r0 + R - 1 (head_dim = 16·NV) against one span: scores 16 keys per vector, one FMA
// per dimension by the keys' row d (the transposed K layout) and per row, so each key row is
// loaded once for all R rows; keys past the span's end are masked off, never read, and keys past
// a row's own end score -inf and weigh exactly 0. The weighted values are summed a slice of the
// head at a time, as many vectors as keep R·slice accumulators (at most 16) in registers.
template <int NV, int R, class T>
PIPELINE_AVX512 void attend_span(const SpanChunks<T>& span, const SpanChunks<T>& next,
                                 int block_size, float scale, const AttentionRow* rows,
                                 SoftmaxState& state, int r0) {
  constexpr int kHeadDim = 16 * NV;
  // The keys and values read after chunk c's: chunk c + 1's, or the next span's first (null at
  // the end). Each (block, KV head) holds only 2–4 KiB of keys and as much of values, anywhere in
  // the pool, and the hardware prefetcher barely starts on one before it ends; so while a chunk
  // is read, the one after it is asked for line by line, a few KiB ahead, as the matmul kernels
  // prefetch their panels.
  const auto after = [&](const T* const(&of_span)[SpanChunks<T>::kMax],
                         const T* const(&of_next)[SpanChunks<T>::kMax], int c) -> const char* {
    if (c + 1 < span.chunks) return reinterpret_cast<const char*>(of_span[c + 1]);
    return next.chunks > 0 ? reinterpret_cast<const char*>(of_next[0]) : nullptr;
  };
  constexpr int kSlice = std::min(NV, int(std::bit_floor(unsigned(16 / R))));
  static_assert(NV % kSlice == 0);
  __mmask16 live[R][SpanChunks<T>::kMax];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < span.chunks; ++c)
      live[r][c] = span.live[c] & first_keys(rows[r].num_keys - span.first[c]);

  alignas(64) float weights[R][kKeySpan];
  __m512 span_max[R];
  for (int r = 0; r < R; ++r) span_max[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int c = 0; c < span.chunks; ++c) {
    __m512 acc[R][kScoreChains];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kScoreChains; ++u) acc[r][u] = _mm512_setzero_ps();
    const char* next_keys = after(span.keys, next.keys, c);
    for (int d = 0; d < kHeadDim; d += kScoreChains) {
      if (next_keys) {
        for (int u = 0; u < kScoreChains; ++u)
          _mm_prefetch(next_keys + sizeof(T) * size_t(d + u) * block_size, _MM_HINT_T0);
      }
      for (int u = 0; u < kScoreChains; ++u) {
        const __m512 key_row = load16(span.live[c], span.keys[c] + size_t(d + u) * block_size);
        for (int r = 0; r < R; ++r)
          acc[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(rows[r].q[d + u]), key_row, acc[r][u]);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512 dot = acc[r][0];
      for (int u = 1; u < kScoreChains; ++u) dot = _mm512_add_ps(dot, acc[r][u]);
      const __m512 scores =
          _mm512_mask_blend_ps(live[r][c], _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                               _mm512_mul_ps(dot, _mm512_set1_ps(scale)));
      span_max[r] = _mm512_max_ps(span_max[r], scores);
      _mm512_store_ps(weights[r] + c * kKeyChunk, scores);
    }
  }

  float correction[R];
  for (int r = 0; r < R; ++r) {
    const float new_max = state.raise_max(r0 + r, _mm512_reduce_max_ps(span_max[r]), correction[r]);
    for (int i = 0; i < span.chunks * kKeyChunk; ++i)
      weights[r][i] = fast_exp(weights[r][i] - new_max);
    // exp(-inf) comes out of fast_exp as ~1e-38, not 0, so the keys a row does not see are
    // zeroed: they add nothing to its sum nor to its values.
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < span.chunks; ++c) {
      const __m512 w = _mm512_maskz_loadu_ps(live[r][c], weights[r] + c * kKeyChunk);
      _mm512_store_ps(weights[r] + c * kKeyChunk, w);
      sum = _mm512_add_ps(sum, w);
    }
    state.sum[r0 + r] = state.sum[r0 + r] * correction[r] + _mm512_reduce_add_ps(sum);
  }

  for (int v0 = 0; v0 < NV; v0 += kSlice) {
    __m512 acc[R][kSlice];
    for (int r = 0; r < R; ++r) {
      const float* acc_r = state.acc + (r0 + r) * kHeadDim + 16 * v0;
      for (int v = 0; v < kSlice; ++v)
        acc[r][v] = _mm512_mul_ps(_mm512_load_ps(acc_r + 16 * v), _mm512_set1_ps(correction[r]));
    }
    for (int c = 0; c < span.chunks; ++c) {
      const float* w[R];
      for (int r = 0; r < R; ++r) w[r] = weights[r] + c * kKeyChunk;
      const T* values = span.values[c] + 16 * v0;
      const char* next_values = v0 == 0 ? after(span.values, next.values, c) : nullptr;
      for (int j = 0; j < span.count[c]; ++j) {
        if (next_values) {
          for (size_t line = 0; line < sizeof(T) * kHeadDim; line += 64)
            _mm_prefetch(next_values + sizeof(T) * size_t(j) * kHeadDim + line, _MM_HINT_T0);
        }
        add_value_row<kSlice, R>(values + j * kHeadDim, w, j, acc);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* acc_r = state.acc + (r0 + r) * kHeadDim + 16 * v0;
      for (int v = 0; v < kSlice; ++v) _mm512_store_ps(acc_r + 16 * v, acc[r][v]);
    }
  }
}

// attend_span<NV, n> for a run-time n in [1, R].
template <int NV, int R, class T>
PIPELINE_AVX512 void attend_span_of(int n, const SpanChunks<T>& span, const SpanChunks<T>& next,
                                    int block_size, float scale, const AttentionRow* rows,
                                    SoftmaxState& state, int r0) {
  if constexpr (R > 0) {
    if (n == R) return attend_span<NV, R>(span, next, block_size, scale, rows, state, r0);
    attend_span_of<NV, R - 1>(n, span, next, block_size, scale, rows, state, r0);
  }
}

// The keys [first, first + kKeySpan) of KV head kv_head, cut at num_keys (none past it).
template <class T>
SpanChunks<T> span_at(const PagedKvLayer& kv, std::span<const int32_t> block_table, int kv_head,
                      int first, int num_keys) {
  SpanChunks<T> span;
  for (int pos = first; pos < std::min(num_keys, first + kKeySpan); pos += kKeyChunk) {
    const int c = span.chunks++;
    const size_t at = kv.head_block_offset(block_table[pos / kv.block_size], kv_head);
    const int slot = pos % kv.block_size;
    span.first[c] = pos;
    span.keys[c] = static_cast<const T*>(kv.k) + at + slot;
    span.values[c] = static_cast<const T*>(kv.v) + at + size_t(slot) * kv.head_dim;
    span.count[c] = std::min(kKeyChunk, num_keys - pos);
    span.live[c] = first_keys(span.count[c]);
  }
  return span;
}

// The same as attend_generic for head_dim = 16·NV and a block size that is a multiple of 16:
// span by span, the rows kRowsTogether at a time, each span's keys and values asked for while
// the one before it is read.
template <int NV, class T>
PIPELINE_AVX512 void attend_avx512(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                                   int kv_head, float scale, const AttentionRow* rows,
                                   int num_rows) {
  constexpr int kHeadDim = 16 * NV;
  const int block_size = kv.block_size;
  const int num_keys = max_keys(rows, num_rows);
  SoftmaxState state(num_rows, kHeadDim);
  SpanChunks<T> span = span_at<T>(kv, block_table, kv_head, 0, num_keys);
  for (int first = 0; first < num_keys; first += kKeySpan) {
    const SpanChunks<T> next = span_at<T>(kv, block_table, kv_head, first + kKeySpan, num_keys);
    for (int r0 = 0; r0 < num_rows; r0 += kRowsTogether) {
      // The first rows' pass asks for the next span; the others find it on its way.
      attend_span_of<NV, kRowsTogether>(std::min(kRowsTogether, num_rows - r0), span,
                                        r0 == 0 ? next : SpanChunks<T>{}, block_size, scale,
                                        rows + r0, state, r0);
    }
    span = next;
  }
  state.write(rows, num_rows, kHeadDim);
}

using AttendFn = void (*)(const PagedKvLayer&, std::span<const int32_t>, int, float,
                          const AttentionRow*, int);

// The fastest kernel for this layout and element type on this CPU.
template <class T>
AttendFn attend_function_for(const PagedKvLayer& kv) {
  static const bool avx512 = isa_supported(Isa::Avx512);
  if (avx512 && kv.block_size % kKeyChunk == 0) {
    if (kv.head_dim == 64) return attend_avx512<4, T>;
    if (kv.head_dim == 128) return attend_avx512<8, T>;
  }
  static const bool avx2 = isa_supported(Isa::Avx2);
  return avx2 ? attend_generic_avx2<T> : attend_generic_portable<T>;
}

AttendFn attend_function(const PagedKvLayer& kv) {
  return with_element_type(kv, "paged_attention", [&](auto element) {
    return attend_function_for<decltype(element)>(kv);
  });
}

}  // namespace

void paged_attention(const PagedKvLayer& kv, std::span<const AttentionSequence> seqs, int num_heads,
                     const float* q, size_t q_stride, float* out) {
  if (kv.head_dim <= 0 || kv.head_dim > kMaxAttentionHeadDim || kv.num_kv_heads <= 0 ||
      num_heads % kv.num_kv_heads != 0) {
    throw std::invalid_argument("paged_attention: head_dim " + std::to_string(kv.head_dim) +
                                " (max " + std::to_string(kMaxAttentionHeadDim) + ") or " +
                                std::to_string(num_heads) + " heads over " +
                                std::to_string(kv.num_kv_heads) + " KV heads not supported");
  }
  const int head_dim = kv.head_dim;
  const int group = num_heads / kv.num_kv_heads;
  const size_t out_stride = size_t(num_heads) * head_dim;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const AttendFn attend = attend_function(kv);

  // The rows of queries [begin, end) of s for the query heads kv_head · group + g, g < group,
  // query by query, in passes of at most kMaxRows rows.
  const auto run_queries = [&](const AttentionSequence& s, int kv_head, int begin, int end) {
    AttentionRow rows[kMaxRows];
    int num_rows = 0;
    for (int i = begin; i < end; ++i) {
      const size_t row = size_t(s.first_row + i);
      for (int g = 0; g < group; ++g) {
        const size_t head_at = size_t(kv_head * group + g) * head_dim;
        rows[num_rows++] = {q + row * q_stride + head_at, out + row * out_stride + head_at,
                            s.start_pos + i + 1};
        if (num_rows == kMaxRows) {
          attend(kv, s.block_table, kv_head, scale, rows, num_rows);
          num_rows = 0;
        }
      }
    }
    if (num_rows > 0) attend(kv, s.block_table, kv_head, scale, rows, num_rows);
  };
  const int tasks = int(seqs.size()) * kv.num_kv_heads;
  tbb::parallel_for(0, tasks, [&](int task) {
    const AttentionSequence& s = seqs[task / kv.num_kv_heads];
    const int kv_head = task % kv.num_kv_heads;
    if (s.num_queries <= kQueryChunk) {
      run_queries(s, kv_head, 0, s.num_queries);
      return;
    }
    tbb::parallel_for(
        tbb::blocked_range<int>(0, s.num_queries, kQueryChunk),
        [&](const tbb::blocked_range<int>& r) { run_queries(s, kv_head, r.begin(), r.end()); });
  });
}

}  // namespace pipeline::cpu
