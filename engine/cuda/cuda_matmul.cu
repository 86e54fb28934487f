// Matrix products: their kernels and the backend's matmul, matmul_many, ffn_many and
// head_matmul. A warp per output row, each lane a block of 32 weights at a time (16-byte
// loads, dequantised in registers, row_dots.cuh); one token per pass over the rows for a
// decode step, up to eight for a small batch; batches of 16 tokens or more of quantised or
// f16 weights on the tensor cores, in f16 with f32 sums. A job's activations are taken by row index
// (x_rows) when given, so a batch's experts read their tokens where they are.

#include "cuda/cuda_backend_impl.cuh"
#include "cuda/row_dots.cuh"

namespace colibri::cuda_detail {
namespace {

// y[t, r] = x[t] . w[r] for rows r of the matrix and up to T tokens from blockIdx.y * T:
// a warp per row, its lanes taking blocks of 32 columns in turn. Token t's activations are
// row x_rows[t] of x when x_rows is set. cols a multiple of 32, x rows 16-byte aligned.
template <device_kind K, int T>
__global__ void matmul_kernel(const uint8_t* values, const float* scales, int64_t rows, int64_t cols, int64_t row_bytes,
                              const float* x, const int32_t* x_rows, int n, float* y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * mm_rows + (threadIdx.x >> 5);
    if (r >= rows) return; // no block-wide synchronisation below
    const int t0 = blockIdx.y * T, nt = min(T, n - t0);
    const float* xs[T];
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) xs[t] = t < nt ? x + int64_t(x_rows != nullptr ? x_rows[t0 + t] : t0 + t) * cols : x;
    float acc[T];
    row_dots<K, T>(values + r * row_bytes, scales != nullptr ? scales + r * (cols / 32) * kind_scales<K> : nullptr,
                   cols, xs, nt, acc);
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) y[int64_t(t0 + t) * rows + r] = s;
    }
}

// A batch on the tensor cores: block (bx, by) makes y for rows bx * 64.. of the matrix and
// tokens by * 32.. . Each step over 64 columns dequantises the rows' two blocks (a thread a
// block) and reads the tokens' activations, each value split into two f16 parts in shared
// memory (v = hi + lo, nearly f32's precision: a batch gives the logits and expert choices a
// step gives), then the four warps each multiply their 16 rows by the 32 tokens as
// hi.hi + hi.lo + lo.hi (wmma, f32 accumulators).
constexpr int mma_rows = 64, mma_tokens = 32, mma_cols = 64, mma_pad = 8;
constexpr int mma_min_tokens = 16; // smaller batches: matmul_kernel

template <device_kind K>
__global__ void matmul_mma_kernel(const uint8_t* values, const float* scales, int64_t rows, int64_t cols,
                                  int64_t row_bytes, const float* x, const int32_t* x_rows, int n, float* y) {
    namespace wmma = nvcuda::wmma;
    alignas(32) __shared__ __half w_s[2][mma_rows][mma_cols + mma_pad];   // hi, lo
    alignas(32) __shared__ __half x_s[2][mma_tokens][mma_cols + mma_pad]; // hi, lo
    alignas(32) __shared__ float y_s[mma_rows][mma_tokens + mma_pad];
    const int warp = threadIdx.x >> 5;
    const int64_t r0 = int64_t(blockIdx.x) * mma_rows;
    const int t0 = int(blockIdx.y) * mma_tokens;
    const int64_t blocks = cols / 32;
    // this thread's weight block (row, half of the step) and activations (token, 16 columns)
    const int w_row = int(threadIdx.x) >> 1, w_half = int(threadIdx.x) & 1;
    const int x_tok = int(threadIdx.x) >> 2, x_col = (int(threadIdx.x) & 3) * 16;
    const int64_t r = r0 + w_row;
    const float* xt =
        t0 + x_tok < n ? x + int64_t(x_rows != nullptr ? x_rows[t0 + x_tok] : t0 + x_tok) * cols : nullptr;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    for (int64_t b0 = 0; b0 < blocks; b0 += 2) {
        const int64_t b = b0 + w_half;
        float w[32];
        if (r < rows && b < blocks) {
            load_block<K>(values + r * row_bytes, scales != nullptr ? scales + r * blocks * kind_scales<K> : nullptr, b,
                          w);
        } else {
            COLIBRI_UNROLL
            for (int i = 0; i < 32; ++i) w[i] = 0.0f;
        }
        COLIBRI_UNROLL
        for (int i = 0; i < 32; ++i) {
            const __half hi = __float2half_rn(w[i]);
            w_s[0][w_row][w_half * 32 + i] = hi;
            w_s[1][w_row][w_half * 32 + i] = __float2half_rn(w[i] - __half2float(hi));
        }
        const int64_t c = b0 * 32 + x_col;
        COLIBRI_UNROLL
        for (int i = 0; i < 16; i += 4) {
            float4 v{0.0f, 0.0f, 0.0f, 0.0f};
            if (xt != nullptr && c + i < cols) v = *reinterpret_cast<const float4*>(xt + c + i);
            const float part[4] = {v.x, v.y, v.z, v.w};
            COLIBRI_UNROLL
            for (int e = 0; e < 4; ++e) {
                const __half hi = __float2half_rn(part[e]);
                x_s[0][x_tok][x_col + i + e] = hi;
                x_s[1][x_tok][x_col + i + e] = __float2half_rn(part[e] - __half2float(hi));
            }
        }
        __syncthreads();
        COLIBRI_UNROLL
        for (int k = 0; k < mma_cols; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[2];
            wmma::load_matrix_sync(a[0], &w_s[0][16 * warp][k], mma_cols + mma_pad);
            wmma::load_matrix_sync(a[1], &w_s[1][16 * warp][k], mma_cols + mma_pad);
            COLIBRI_UNROLL
            for (int j = 0; j < 2; ++j) {
                // B[k][t] = x_s[part][t][k]: the tokens' rows read column by column
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> xt_f[2];
                wmma::load_matrix_sync(xt_f[0], &x_s[0][16 * j][k], mma_cols + mma_pad);
                wmma::load_matrix_sync(xt_f[1], &x_s[1][16 * j][k], mma_cols + mma_pad);
                wmma::mma_sync(acc[j], a[1], xt_f[0], acc[j]); // the small terms first
                wmma::mma_sync(acc[j], a[0], xt_f[1], acc[j]);
                wmma::mma_sync(acc[j], a[0], xt_f[0], acc[j]);
            }
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(&y_s[16 * warp][0], acc[0], mma_tokens + mma_pad, wmma::mem_row_major);
    wmma::store_matrix_sync(&y_s[16 * warp][16], acc[1], mma_tokens + mma_pad, wmma::mem_row_major);
    __syncthreads();
    for (int i = int(threadIdx.x); i < mma_rows * mma_tokens; i += int(blockDim.x)) {
        const int rr = i % mma_rows, tt = i / mma_rows; // consecutive threads, consecutive rows of y
        if (r0 + rr < rows && t0 + tt < n) y[int64_t(t0 + tt) * rows + r0 + rr] = y_s[rr][tt];
    }
}

// The same for float rows whose length is not a multiple of 32 (small test models): a
// warp per row and token, element by element.
template <device_kind K>
__global__ void matmul_any_kernel(const uint8_t* values, int64_t rows, int64_t cols, int64_t row_bytes, const float* x,
                                  const int32_t* x_rows, int n, float* y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * mm_rows + (threadIdx.x >> 5);
    const int t = blockIdx.y;
    if (r >= rows || t >= n) return;
    const float* xt = x + int64_t(x_rows != nullptr ? x_rows[t] : t) * cols;
    const uint8_t* row = values + r * row_bytes;
    float acc = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) {
        float w;
        if constexpr (K == device_kind::f32) {
            w = reinterpret_cast<const float*>(row)[c];
        } else {
            const uint16_t h = reinterpret_cast<const uint16_t*>(row)[c];
            w = K == device_kind::f16 ? __half2float(__ushort_as_half(h)) : __uint_as_float(uint32_t(h) << 16);
        }
        acc += w * xt[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) y[int64_t(t) * rows + r] = acc;
}

// One warp per output of head_matmul: output o is row o % rows of head (o / rows) % n_head's
// matrix (f32 or f16) with vector o / rows of x.
template <bool F16>
__global__ void head_matmul_kernel(const uint8_t* w, int64_t row_bytes, int rows, int cols, int n_head, const float* x,
                                   int64_t x_stride, float* y, int64_t y_stride, int64_t outputs) {
    const int64_t o = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (o >= outputs) return; // a whole warp
    const int64_t i = o / rows, r = o % rows;
    const uint8_t* row = w + ((i % n_head) * rows + r) * row_bytes;
    const float* xi = x + i * x_stride;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        const float v =
            F16 ? __half2float(reinterpret_cast<const __half*>(row)[c]) : reinterpret_cast<const float*>(row)[c];
        acc += v * xi[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) y[i * y_stride + r] = acc;
}

} // namespace

void cuda_backend::matmul(const tensor_view& w, const float* x, int n, float* y) {
    select();
    product(w, x, nullptr, n, y);
}

void cuda_backend::matmul_many(const matmul_job* jobs, int n_jobs) {
    select();
    for (int j = 0; j < n_jobs; ++j) {
        const int32_t* rows = jobs[j].x_rows != nullptr ? upload(jobs[j].x_rows, size_t(jobs[j].n), 0) : nullptr;
        product(*jobs[j].w, jobs[j].x, rows, jobs[j].n, jobs[j].y);
    }
}

void cuda_backend::ffn_many(const ffn_job* jobs, int n_jobs) {
    select();
    const op_timer timer(*this, "ffn_many");
    for (int j = 0; j < n_jobs; ++j) {
        const ffn_job& f = jobs[j];
        const int32_t* rows = f.x_rows != nullptr ? upload(f.x_rows, size_t(f.n), 0) : nullptr;
        product(*f.gate, f.x, rows, f.n, f.g);
        product(*f.up, f.x, rows, f.n, f.u);
        if (f.gelu) geglu(f.g, f.u, int64_t(f.n) * int64_t(f.gate->rows()));
        else swiglu(f.g, f.u, int64_t(f.n) * int64_t(f.gate->rows()));
        product(*f.down, f.g, nullptr, f.n, f.y);
    }
}

void cuda_backend::head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                               int64_t y_stride) {
    select();
    const op_timer timer(*this, "head_matmul");
    const device_weights& d = weights(w);
    if (recording_failed()) return;
    if (d.kind != device_kind::f32 && d.kind != device_kind::f16) {
        throw error(errc::unsupported, "per-head products of f32 or f16 weights only");
    }
    const int rows = static_cast<int>(d.rows / n_head);
    const int64_t outputs = int64_t(n) * n_head * rows;
    const auto kernel = d.kind == device_kind::f16 ? head_matmul_kernel<true> : head_matmul_kernel<false>;
    COLIBRI_LAUNCH(kernel, blocks_for(outputs * 32, 256), 256, 0, stream_.get())
    (d.v(), d.row_bytes, rows, static_cast<int>(d.cols), n_head, x, x_stride, y, y_stride, outputs);
    COLIBRI_LAUNCHED("head_matmul");
}

template <device_kind K>
void cuda_backend::launch_product(const device_weights& d, const float* x, const int32_t* x_rows, int n, float* y) {
    const unsigned row_blocks = unsigned((d.rows + mm_rows - 1) / mm_rows);
    const bool aligned = d.cols % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if constexpr (0 < kind_scales<K>) {
        COLIBRI_ASSERT(aligned); // quantised rows are whole blocks; activations are buffers' rows
    } else if (!aligned) {
        const auto kernel = matmul_any_kernel<K>;
        COLIBRI_LAUNCH(kernel, dim3(row_blocks, unsigned(n)), 32 * mm_rows, 0, stream_.get())
        (d.v(), d.rows, d.cols, d.row_bytes, x, x_rows, n, y);
        COLIBRI_LAUNCHED("matmul_any");
        return;
    }
    if constexpr (0 < kind_scales<K> || K == device_kind::f16) { // f16 holds their values (f32, bf16 may not)
        if (n >= mma_min_tokens) {
            const dim3 grid(unsigned((d.rows + mma_rows - 1) / mma_rows), unsigned((n + mma_tokens - 1) / mma_tokens));
            COLIBRI_LAUNCH(matmul_mma_kernel<K>, grid, 128, 0, stream_.get())
            (d.v(), d.s(), d.rows, d.cols, d.row_bytes, x, x_rows, n, y);
            COLIBRI_LAUNCHED("matmul_mma");
            return;
        }
    }
    const auto kernel = n == 1 ? matmul_kernel<K, 1> : matmul_kernel<K, mm_tokens>;
    const unsigned token_blocks = n == 1 ? 1u : unsigned((n + mm_tokens - 1) / mm_tokens);
    COLIBRI_LAUNCH(kernel, dim3(row_blocks, token_blocks), 32 * mm_rows, 0, stream_.get())
    (d.v(), d.s(), d.rows, d.cols, d.row_bytes, x, x_rows, n, y);
    COLIBRI_LAUNCHED("matmul");
}

// y[n, rows] = x[n, cols] . w^T, token t's activations at row x_rows[t] of x (device
// memory) when set.
void cuda_backend::product(const tensor_view& w, const float* x, const int32_t* x_rows, int n, float* y) {
    if (n <= 0) return;
    const device_weights& d = weights(w);
    if (recording_failed()) return;
    static const char* const names[2][device_kind_count] = {
        {"product f32 1 token", "product f16 1 token", "product bf16 1 token", "product q8 1 token",
         "product q4 1 token", "product q4m 1 token", "product iq4 1 token", "product q8m 1 token"},
        {"product f32 batch", "product f16 batch", "product bf16 batch", "product q8 batch", "product q4 batch",
         "product q4m batch", "product iq4 batch", "product q8m batch"}};
    const op_timer timer(*this, names[n > 1][int(d.kind)]);
    with_kind(d.kind, [&](auto kind) { launch_product<kind.value>(d, x, x_rows, n, y); });
}

} // namespace colibri::cuda_detail
