// RoPE, the KV cache's stores and attention. One token's attention is split across the
// context in chunks (a block per query head and chunk), then the chunks are combined; a
// batch's is a thread block per token and query head.

#include "cuda/cuda_backend_impl.cuh"

namespace colibri::cuda_detail {
namespace {

// Pairs (i, i + head_dim / 2) of each head rotated by pos * theta^(-2i / head_dim) / ff[i]
// (ff null: 1), cos and sin times attn; the angle in double as on the CPU.
__global__ void rope_kernel(float* x, int64_t pairs, int n_heads, int head_dim, const int32_t* pos, float theta,
                            const float* ff, float attn) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= pairs) return;
    const int half = head_dim / 2;
    const int i = int(idx % half);
    const int64_t head = idx / half; // token * n_heads + h
    const int t = int(head / n_heads);
    double freq = pow(double(theta), -2.0 * i / head_dim);
    if (ff != nullptr) freq /= double(ff[i]);
    const double angle = double(pos[t]) * freq;
    const float c = float(double(attn) * cos(angle)), s = float(double(attn) * sin(angle));
    float* v = x + head * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// The batch's keys and values into each head's rows at pos[t].
__global__ void kv_store_kernel(const float* k_new, const float* v_new, void* k_cache, void* v_cache, bool f16,
                                const int32_t* pos, int n, int n_head_kv, int head_dim, int n_ctx) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t kv_dim = int64_t(n_head_kv) * head_dim;
    if (i >= int64_t(n) * kv_dim) return;
    const int64_t t = i / kv_dim, h = (i % kv_dim) / head_dim, d = i % head_dim;
    const int64_t to = (h * n_ctx + pos[t]) * head_dim + d;
    if (f16) {
        static_cast<__half*>(k_cache)[to] = __float2half_rn(k_new[i]);
        static_cast<__half*>(v_cache)[to] = __float2half_rn(v_new[i]);
    } else {
        static_cast<float*>(k_cache)[to] = k_new[i];
        static_cast<float*>(v_cache)[to] = v_new[i];
    }
}

template <bool F16>
__device__ inline float cache_at(const void* cache, int64_t i) {
    if constexpr (F16) return __half2float(static_cast<const __half*>(cache)[i]);
    else return static_cast<const float*>(cache)[i];
}

constexpr int max_head_dim = 256; // weighted_values: 8 columns a lane
constexpr int attention_warps = 4;

// Cache elements i..i+7 (i a multiple of 8) in f32, in 16-byte loads.
template <bool F16>
__device__ inline void cache_at8(const void* cache, int64_t i, float v[8]) {
    if constexpr (F16) {
        const int4 raw = *reinterpret_cast<const int4*>(static_cast<const __half*>(cache) + i);
        __half h[8];
        memcpy(h, &raw, sizeof raw);
        COLIBRI_UNROLL
        for (int e = 0; e < 8; ++e) v[e] = __half2float(h[e]);
    } else {
        const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(cache) + i);
        const float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
}

// q . k for cache row `row` (its first element's index) and the query in shared memory: the
// row in 16-byte loads, several in flight, when head_dim is a multiple of 8 (and the cache
// 16-byte aligned, as allocations are).
template <bool F16>
__device__ inline float query_dot(const float* q_s, const void* k_cache, int64_t row, int head_dim) {
    float dot = 0.0f;
    if (head_dim % 8 == 0 && reinterpret_cast<uintptr_t>(k_cache) % 16 == 0) {
        COLIBRI_UNROLL_BY(4)
        for (int d = 0; d < head_dim; d += 8) {
            float v[8];
            cache_at8<F16>(k_cache, row + d, v);
            COLIBRI_UNROLL
            for (int e = 0; e < 8; ++e) dot += q_s[d + e] * v[e];
        }
        return dot;
    }
    for (int d = 0; d < head_dim; ++d) dot += q_s[d] * cache_at<F16>(k_cache, row + d);
    return dot;
}

// out[d] = scale * the sum over rows j in [first, last) of w[j - first] * v[j][d]: the
// block's warps take the rows in turn, each lane the columns lane, lane + 32, ... (the
// warp reads a row at once), then the warps' sums are added through `partial` (shared
// memory, warps * head_dim floats).
template <bool F16>
__device__ void weighted_values(const float* w, const void* v_cache, int64_t base, int first, int last, int head_dim,
                                float scale, float* partial, float* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float acc[max_head_dim / 32] = {};
    constexpr int rows_at_once = 4; // their loads in flight together
    int j = first + warp;
    for (; j + (rows_at_once - 1) * warps < last; j += rows_at_once * warps) {
        float v[rows_at_once][max_head_dim / 32];
        COLIBRI_UNROLL
        for (int u = 0; u < rows_at_once; ++u) {
            const int64_t row = base + int64_t(j + u * warps) * head_dim;
            COLIBRI_UNROLL
            for (int i = 0; i < max_head_dim / 32; ++i) {
                v[u][i] = lane + 32 * i < head_dim ? cache_at<F16>(v_cache, row + lane + 32 * i) : 0.0f;
            }
        }
        COLIBRI_UNROLL
        for (int u = 0; u < rows_at_once; ++u) {
            const float p = w[j + u * warps - first];
            COLIBRI_UNROLL
            for (int i = 0; i < max_head_dim / 32; ++i) acc[i] += p * v[u][i];
        }
    }
    for (; j < last; j += warps) {
        const float p = w[j - first];
        const int64_t row = base + int64_t(j) * head_dim;
        COLIBRI_UNROLL
        for (int i = 0; i < max_head_dim / 32; ++i) {
            if (lane + 32 * i < head_dim) acc[i] += p * cache_at<F16>(v_cache, row + lane + 32 * i);
        }
    }
    COLIBRI_UNROLL
    for (int i = 0; i < max_head_dim / 32; ++i) {
        if (lane + 32 * i < head_dim) partial[warp * head_dim + lane + 32 * i] = acc[i];
    }
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int k = 0; k < warps; ++k) o += partial[k * head_dim + d];
        out[d] = o * scale;
    }
}

// Token t = blockIdx.x / n_head, query head h = blockIdx.x % n_head, over cache rows
// 0..pos[t] of its KV head: scores into `scores` (n_ctx floats per block), softmax, then the
// weighted values. Dynamic shared memory: head_dim floats (the query), then warps * head_dim
// (weighted_values).
template <bool F16>
__global__ void attention_kernel(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                                 int n_head, int n_head_kv, int head_dim, int n_ctx, float scale, int window,
                                 float softcap, float* scores, float* out) {
    COLIBRI_DYNAMIC_SHARED(float, q_s);
    __shared__ float shared[32];
    float* partial = q_s + head_dim;
    const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int kvh = h / (n_head / n_head_kv);
    const int len = pos[t] + 1, lo = window > 0 ? max(0, len - window) : 0; // rows lo..len-1
    const float* qh = q + (int64_t(t) * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = qh[d];
    __syncthreads();
    const int64_t base = int64_t(kvh) * n_ctx * head_dim;
    float* s = scores + int64_t(blockIdx.x) * n_ctx;
    float m = -INFINITY;
    for (int j = lo + int(threadIdx.x); j < len; j += blockDim.x) {
        float dot = query_dot<F16>(q_s, k_cache, base + int64_t(j) * head_dim, head_dim) * scale;
        if (softcap > 0) dot = softcap * tanhf(dot / softcap);
        s[j] = dot;
        m = fmaxf(m, dot);
    }
    m = block_reduce<true>(m, shared);
    float sum = 0.0f;
    for (int j = lo + int(threadIdx.x); j < len; j += blockDim.x) {
        const float e = expf(s[j] - m);
        s[j] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, shared); // also orders the writes to s before the reads below
    weighted_values<F16>(s + lo, v_cache, base, lo, len, head_dim, 1.0f / sum, partial,
                         out + (int64_t(t) * n_head + h) * head_dim);
}

// One token's attention split across the sequence (flash-decoding): block (h, s) takes
// query head h over cache rows [s * attention_chunk, ...) up to pos[0], its scores in shared
// memory, and leaves its maximum score, the sum of exp(score - max) and the values weighted
// by those (unnormalised) in `partial` ([n_head][splits][head_dim + 2]). A split past the
// token's position leaves max -inf and nothing else. Dynamic shared memory: head_dim +
// attention_chunk + warps * head_dim floats.
constexpr int attention_chunk = 128;

template <bool F16>
__global__ void attention_split_kernel(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                                       int n_head, int n_head_kv, int head_dim, int n_ctx, float scale, int window,
                                       float softcap, float* partial) {
    COLIBRI_DYNAMIC_SHARED(float, shared_mem);
    __shared__ float shared[32];
    float* q_s = shared_mem;
    float* s = shared_mem + head_dim;
    float* sums = s + attention_chunk;
    const int h = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int kvh = h / (n_head / n_head_kv);
    const int len = pos[0] + 1, lo = window > 0 ? max(0, len - window) : 0;
    const int first = max(lo, split * attention_chunk), last = min(len, split * attention_chunk + attention_chunk);
    float* out = partial + (int64_t(h) * splits + split) * (head_dim + 2);
    if (first >= last) { // every thread the same: no synchronisation skipped by some only
        if (threadIdx.x == 0) {
            out[head_dim] = -INFINITY;
            out[head_dim + 1] = 0.0f;
        }
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) out[d] = 0.0f;
        return;
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = q[int64_t(h) * head_dim + d];
    __syncthreads();
    const int64_t base = int64_t(kvh) * n_ctx * head_dim;
    float m = -INFINITY;
    for (int j = first + int(threadIdx.x); j < last; j += blockDim.x) {
        float dot = query_dot<F16>(q_s, k_cache, base + int64_t(j) * head_dim, head_dim) * scale;
        if (softcap > 0) dot = softcap * tanhf(dot / softcap);
        s[j - first] = dot;
        m = fmaxf(m, dot);
    }
    m = block_reduce<true>(m, shared);
    float sum = 0.0f;
    for (int j = first + int(threadIdx.x); j < last; j += blockDim.x) {
        const float e = expf(s[j - first] - m);
        s[j - first] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, shared); // also orders the writes to s before the reads below
    weighted_values<F16>(s, v_cache, base, first, last, head_dim, 1.0f, sums, out);
    if (threadIdx.x == 0) {
        out[head_dim] = m;
        out[head_dim + 1] = sum;
    }
}

// The splits of each query head (blockIdx.x) put together: every split's sums rescaled to
// the largest maximum, then divided by the total.
__global__ void attention_combine_kernel(const float* partial, int splits, int head_dim, float* out) {
    const int h = blockIdx.x;
    const float* p = partial + int64_t(h) * splits * (head_dim + 2);
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, p[int64_t(s) * (head_dim + 2) + head_dim]);
    float total = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const float* ps = p + int64_t(s) * (head_dim + 2);
        if (ps[head_dim + 1] > 0.0f) total += ps[head_dim + 1] * expf(ps[head_dim] - m);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const float* ps = p + int64_t(s) * (head_dim + 2);
            if (ps[head_dim + 1] > 0.0f) acc += ps[d] * expf(ps[head_dim] - m);
        }
        out[int64_t(h) * head_dim + d] = acc / total;
    }
}

} // namespace

void cuda_backend::rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& rp) {
    select();
    const op_timer timer(*this, "rope");
    const int32_t* p = upload(pos, size_t(n), position_slot);
    const float* ff = rp.freq_factors != nullptr ? weights(*rp.freq_factors).f32() : nullptr;
    const int64_t pairs = int64_t(n) * n_heads * (head_dim / 2);
    COLIBRI_LAUNCH(rope_kernel, blocks_for(pairs, 256), 256, 0, stream_.get())
    (x, pairs, n_heads, head_dim, p, rp.theta, ff, rp.attn_factor);
    COLIBRI_LAUNCHED("rope");
}

void cuda_backend::attention(const attention_args& a) {
    select();
    const op_timer timer(*this, "attention");
    if (a.head_dim > max_head_dim) {
        throw error(errc::unsupported, "attention heads of " + std::to_string(a.head_dim) + " dimensions (at most " +
                                           std::to_string(max_head_dim) + " on CUDA)");
    }
    const int32_t* p = upload(a.pos, size_t(a.n), position_slot);
    const int64_t stored = int64_t(a.n) * a.n_head_kv * a.head_dim;
    COLIBRI_LAUNCH(kv_store_kernel, blocks_for(stored, 256), 256, 0, stream_.get())
    (a.k_new, a.v_new, a.k_cache, a.v_cache, a.kv_f16, p, a.n, a.n_head_kv, a.head_dim, a.n_ctx);
    COLIBRI_LAUNCHED("kv_store");
    if (a.n == 1) {
        // split across the whole context, so that the grid is the same at every position
        // (a recorded step replays it) and a long context keeps every multiprocessor busy
        const int splits = (a.n_ctx + attention_chunk - 1) / attention_chunk;
        grow(scores_, size_t(a.n_head) * size_t(splits) * size_t(a.head_dim + 2) * sizeof(float));
        float* partial = static_cast<float*>(scores_.get());
        const size_t shared = size_t(a.head_dim + attention_chunk + attention_warps * a.head_dim) * sizeof(float);
        const auto kernel = a.kv_f16 ? attention_split_kernel<true> : attention_split_kernel<false>;
        COLIBRI_LAUNCH(kernel, dim3(unsigned(a.n_head), unsigned(splits)), 32 * attention_warps, shared, stream_.get())
        (a.q, a.k_cache, a.v_cache, p, a.n_head, a.n_head_kv, a.head_dim, a.n_ctx, a.scale, a.window, a.softcap,
         partial);
        COLIBRI_LAUNCHED("attention_split");
        COLIBRI_LAUNCH(attention_combine_kernel, a.n_head, 128, 0, stream_.get())(partial, splits, a.head_dim, a.out);
        COLIBRI_LAUNCHED("attention_combine");
        return;
    }
    const int heads = a.n * a.n_head;
    grow(scores_, size_t(heads) * size_t(a.n_ctx) * sizeof(float));
    float* scores = static_cast<float*>(scores_.get());
    const size_t shared = size_t(a.head_dim + attention_warps * a.head_dim) * sizeof(float);
    const auto kernel = a.kv_f16 ? attention_kernel<true> : attention_kernel<false>;
    COLIBRI_LAUNCH(kernel, heads, 32 * attention_warps, shared, stream_.get())
    (a.q, a.k_cache, a.v_cache, p, a.n_head, a.n_head_kv, a.head_dim, a.n_ctx, a.scale, a.window, a.softcap, scores,
     a.out);
    COLIBRI_LAUNCHED("attention");
}

} // namespace colibri::cuda_detail
