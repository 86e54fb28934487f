// Products of weight matrices with activations: one dispatch for many jobs, and each
// weight type's row kernels (int8 tiles, f32 rows, interleaved groups) over a range of rows.

#include "cpu/cpu_backend.h"

#include "core/error.h"
#include "cpu/kernels.h"
#include "format/row_codec.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace colibri {

void cpu_backend::matmul(const tensor_view& w, const float* x, int n, float* y) {
    const matmul_job job{&w, x, n, y};
    matmul_many(&job, 1);
}

// All jobs' rows form one range split across the threads: one dispatch for, say, the
// gate and up matrices of every selected expert.
void cpu_backend::matmul_many(const matmul_job* in_jobs, int n_jobs) {
    const matmul_job* jobs = f32_rows_gathered(in_jobs, n_jobs);
    if (row_begin_.size() < size_t(n_jobs) + 1) row_begin_.resize(size_t(n_jobs) + 1); // grows, then stays
    if (xq_begin_.size() < size_t(n_jobs)) xq_begin_.resize(size_t(n_jobs));
    int64_t total = 0, work = 0;
    uint64_t bytes = 0;
    size_t xq_blocks = 0;
    int max_tokens = 0;
    for (int j = 0; j < n_jobs; ++j) {
        const matmul_job& jb = jobs[j];
        max_tokens = std::max(max_tokens, jb.n);
        COLIBRI_ASSERT(static_cast<int64_t>(jb.w->cols()) <= max_cols_);
        row_begin_[size_t(j)] = total;
        total += static_cast<int64_t>(jb.w->rows());
        work += static_cast<int64_t>(jb.w->rows() * jb.w->cols()) * jb.n;
        bytes += jb.w->rows() * format::row_bytes(jb.w->type, jb.w->cols());
        xq_begin_[size_t(j)] = xq_blocks;
        if (uses_int8(*jb.w)) xq_blocks += size_t(jb.n) * (jb.w->cols() / format::qk);
    }
    row_begin_[size_t(n_jobs)] = total;
    if (xq_blocks > 0) quantise_activations(jobs, n_jobs, xq_blocks);
    if (max_tokens == 1 && matmul_streamed(jobs, n_jobs, work)) return;
    const auto rows = [&](int64_t g0, int64_t g1) {
        for (int j = 0; j < n_jobs; ++j) {
            const int64_t b = row_begin_[size_t(j)], e = row_begin_[size_t(j) + 1];
            const int64_t r0 = std::max(g0, b), r1 = std::min(g1, e);
            if (r0 < r1) matmul_rows(jobs[j], xq_.data() + xq_begin_[size_t(j)], r0 - b, r1 - b);
        }
    };
    // chunks of about chunk_bytes of weights (decode: decode_chunk_bytes), in multiples
    // of eight rows (whole tiles and interleaved groups)
    const uint64_t chunk = max_tokens <= short_batch ? decode_chunk_bytes : chunk_bytes;
    int64_t grain = std::max<int64_t>(8, int64_t(chunk * uint64_t(total) / std::max<uint64_t>(bytes, 1)) / 8 * 8);
    if (max_tokens <= short_batch) {
        // Short batches read their weights from memory, a byte costing more than a
        // multiply-add, and even a small product (decode's f32 router) is shared.
        work = std::max<int64_t>(work, int64_t(bytes));
        grain = std::max<int64_t>(8, std::min(grain, total / pool_.size() / 8 * 8));
    }
    split(total, work, grain, rows);
}

// Jobs that take their rows of x by index but multiply f32 activations get those rows
// copied out (the f32 kernels read a job's tokens a row apart); the jobs to run.
const matmul_job* cpu_backend::f32_rows_gathered(const matmul_job* jobs, int n_jobs) {
    size_t floats = 0;
    for (int j = 0; j < n_jobs; ++j) {
        if (jobs[j].x_rows != nullptr && !uses_int8(*jobs[j].w)) floats += size_t(jobs[j].n) * jobs[j].w->cols();
    }
    if (floats == 0) return jobs;
    if (f32_rows_.size() < floats) f32_rows_.resize(floats); // prefill only; grows, then stays
    local_jobs_.assign(jobs, jobs + n_jobs);
    size_t at = 0;
    for (int j = 0; j < n_jobs; ++j) {
        matmul_job& jb = local_jobs_[size_t(j)];
        if (jb.x_rows == nullptr || uses_int8(*jb.w)) continue;
        const size_t cols = jb.w->cols();
        // the rows an earlier job took already (an expert's gate and up take the same)
        const auto same = std::find_if(jobs, jobs + j, [&](const matmul_job& o) {
            return o.x == jb.x && o.x_rows == jb.x_rows && o.n == jb.n && o.w->cols() == cols && !uses_int8(*o.w);
        });
        if (same != jobs + j) {
            jb.x = local_jobs_[size_t(same - jobs)].x;
        } else {
            float* dst = f32_rows_.data() + at;
            for (int t = 0; t < jb.n; ++t)
                std::memcpy(dst + size_t(t) * cols, jb.x + size_t(jb.x_rows[t]) * cols, cols * sizeof(float));
            jb.x = dst;
            at += size_t(jb.n) * cols;
        }
        jb.x_rows = nullptr;
    }
    return local_jobs_.data();
}

// Rows [r0, r1) of one job; each weight row is read once for all of its tokens.
void cpu_backend::matmul_rows(const matmul_job& jb, const block_q8_x* xq, int64_t r0, int64_t r1) const {
    const tensor_view& w = *jb.w;
    const float* x = jb.x;
    float* y = jb.y;
    const int n = jb.n;
    const int64_t rows = static_cast<int64_t>(w.rows());
    const int64_t cols = static_cast<int64_t>(w.cols());
    const uint64_t rb = format::row_bytes(w.type, w.cols());
    const bool q8 = w.type == format::dtype::q8_0;
    if (format::is_interleaved(w.type)) {
        matmul_groups(jb, xq, r0, r1);
    } else if (uses_int8(w)) {
        const auto tile = int8_tile(kt_, w.type);
        const size_t nb = size_t(cols / format::qk);
        float out[16];
        // one row at a time (stride 0 repeats it in the tile), for the rows left over
        const auto single_row = [&](int64_t r) {
            for (int t = 0; t < n; t += 4) {
                const int nt = std::min(4, n - t);
                tile(w.data + r * rb, 0, xq + size_t(t) * nb, nb, nt, cols, out);
                for (int k = 0; k < nt; ++k) y[(t + k) * rows + r] = out[4 * k];
            }
        };
        if (n <= 4) {
            // decode and short batches: four streams a quarter of the range apart keep
            // more hardware prefetch streams busy than one sequential walk
            const int64_t q = (r1 - r0) / 4;
            for (int64_t i = 0; i < q; ++i) {
                tile(w.data + (r0 + i) * rb, size_t(q) * rb, xq, nb, n, cols, out);
                for (int t = 0; t < n; ++t) {
                    for (int k = 0; k < 4; ++k) y[t * rows + r0 + i + k * q] = out[4 * t + k];
                }
            }
            for (int64_t r = r0 + 4 * q; r < r1; ++r) single_row(r);
            return;
        }
        // prefill: tiles of four adjacent rows by four tokens. Blocks of rows and
        // chunks of tokens small enough to stay in L2 together: each block's weights
        // come from memory once and are reused from the cache for every token chunk.
        constexpr int chunk = 64;
        const int64_t block = std::max<int64_t>(4, int64_t(l2_block_bytes / rb) / 4 * 4);
        const int64_t r4 = r0 + (r1 - r0) / 4 * 4;
        for (int64_t b0 = r0; b0 < r4; b0 += block) {
            const int64_t b1 = std::min(r4, b0 + block);
            for (int t0 = 0; t0 < n; t0 += chunk) {
                const int t1 = std::min(n, t0 + chunk);
                for (int64_t r = b0; r < b1; r += 4) {
                    for (int t = t0; t < t1; t += 4) {
                        const int nt = std::min(4, t1 - t);
                        tile(w.data + r * rb, rb, xq + size_t(t) * nb, nb, nt, cols, out);
                        for (int k = 0; k < nt; ++k)
                            std::memcpy(y + (t + k) * rows + r, out + 4 * k, 4 * sizeof(float));
                    }
                }
            }
        }
        for (int64_t r = r4; r < r1; ++r) single_row(r);
    } else if (scalar_f32_rows(w.type)) { // f32 activations: the scalar rows
        for (int64_t r = r0; r < r1; ++r) {
            for (int t = 0; t < n; ++t) y[t * rows + r] = kernels::dot_row(w.type, w.data + r * rb, x + t * cols, cols);
        }
    } else if (format::is_quantized(w.type) && n == 1) {
        auto dot4 = q8 ? kt_.dot4_q8_0_f32 : kt_.dot4_q4_0_f32;
        auto dot1 = q8 ? kt_.dot_q8_0_f32 : kt_.dot_q4_0_f32;
        four_streams(
            r0, r1, y, [&](int64_t r, int64_t q, float* out) { dot4(w.data + r * rb, size_t(q) * rb, x, cols, out); },
            [&](int64_t r) { return dot1(w.data + r * rb, x, cols); });
    } else if (w.type == format::dtype::f32 && n == 1) { // decode's router
        const auto* wf = reinterpret_cast<const float*>(w.data);
        four_streams(
            r0, r1, y,
            [&](int64_t r, int64_t q, float* out) { kt_.dot4_f32(wf + r * cols, size_t(q * cols), x, cols, out); },
            [&](int64_t r) { return kt_.dot_f32(wf + r * cols, x, cols); });
    } else if (format::is_quantized(w.type)) {
        // prefill: each row is converted once per block for four tokens at a time
        for (int64_t r = r0; r < r1; ++r) f32_row_tokens(w.type, w.data + r * rb, jb, r);
    } else {
        int t0 = 0; // f32 rows (the router; an f32 model's every matrix): four tokens at a
                    // time, which stay in L1 while the rows pass
        if (w.type == format::dtype::f32) {
            for (float out[4]; t0 + 4 <= n; t0 += 4) {
                for (int64_t r = r0; r < r1; ++r) {
                    kt_.dotx4_f32(reinterpret_cast<const float*>(w.data + r * rb), x + t0 * cols, size_t(cols), cols,
                                  out);
                    for (int k = 0; k < 4; ++k) y[(t0 + k) * rows + r] = out[k];
                }
            }
        }
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t* row = w.data + r * rb;
            for (int t = t0; t < n; ++t) {
                const float* xt = x + t * cols;
                float v;
                switch (w.type) {
                case format::dtype::f16: v = kt_.dot_f16(row, xt, cols); break;
                case format::dtype::bf16: v = kt_.dot_bf16(row, xt, cols); break;
                default: v = kt_.dot_f32(reinterpret_cast<const float*>(row), xt, cols); break;
                }
                y[t * rows + r] = v;
            }
        }
    }
}

// Row r of a q8_0 or q4_0 product (its bytes at `row`) with every token's f32
// activations: four tokens at a time, then one, each bit-identical to one at a time.
void cpu_backend::f32_row_tokens(format::dtype row_type, const uint8_t* row, const matmul_job& jb, int64_t r) const {
    const int64_t rows = static_cast<int64_t>(jb.w->rows()), cols = static_cast<int64_t>(jb.w->cols());
    if (scalar_f32_rows(row_type)) {
        for (int t = 0; t < jb.n; ++t) jb.y[t * rows + r] = kernels::dot_row(row_type, row, jb.x + t * cols, cols);
        return;
    }
    const bool q8 = row_type == format::dtype::q8_0;
    const auto dotx4 = q8 ? kt_.dotx4_q8_0_f32 : kt_.dotx4_q4_0_f32;
    const auto dot1 = q8 ? kt_.dot_q8_0_f32 : kt_.dot_q4_0_f32;
    int t = 0;
    for (float out[4]; t + 4 <= jb.n; t += 4) {
        dotx4(row, jb.x + t * cols, size_t(cols), cols, out);
        for (int k = 0; k < 4; ++k) jb.y[(t + k) * rows + r] = out[k];
    }
    for (; t < jb.n; ++t) jb.y[t * rows + r] = dot1(row, jb.x + t * cols, cols);
}

// The q4_0x8 or q8_0x8 groups of eight rows whose first row lies in [r0, r1) (every group
// in the range that holds its first row: the ranges of a product cover each group once).
void cpu_backend::matmul_groups(const matmul_job& jb, const block_q8_x* xq, int64_t r0, int64_t r1) const {
    const tensor_view& w = *jb.w;
    const int n = jb.n;
    const int64_t rows = static_cast<int64_t>(w.rows()), cols = static_cast<int64_t>(w.cols());
    const uint64_t gb = format::x8_rows * format::row_bytes(w.type, w.cols()); // bytes of a group
    const int64_t g0 = (r0 + 7) / 8, g1 = (r1 + 7) / 8;
    const auto y_at = [&](int t, int64_t row) { return jb.y + t * rows + row; };
    if (!uses_int8(w)) {
        // f32 activations: each group back in plain rows (q4_0, q8_0, q4_k...), then their row kernels
        const uint64_t rb = gb / format::x8_rows;
        std::vector<uint8_t> plain(gb);
        for (int64_t g = g0; g < g1; ++g) {
            for (int r = 0; r < 8; ++r)
                format::x8_row(w.type, w.data, w.cols(), uint64_t(g * 8 + r), plain.data() + r * rb);
            for (int r = 0; r < 8; ++r) f32_row_tokens(format::row_type(w.type), plain.data() + r * rb, jb, g * 8 + r);
        }
        return;
    }
    const size_t nb = size_t(cols / format::qk);
    const auto tile = int8_x8_kernels(kt_, w.type).tile;
    float out[8 * 4 * 8]; // the most a tile call returns: 8 tokens by 4 groups
    if (n <= short_batch) {
        // short batches (decode walks its groups in matmul_streamed()), each weight read once: 4 /
        // n groups a share of the range apart, which keeps several hardware prefetch streams busy;
        // at least two, as the kernels take groups in pairs (a single group is a pair with itself,
        // done twice)
        const int streams = std::max(2, 4 / n);
        const int64_t q = (g1 - g0) / streams;
        for (int64_t i = 0; i < q; ++i) {
            tile(w.data + uint64_t(g0 + i) * gb, size_t(q) * gb, streams, xq, nb, n, cols, true, out);
            for (int t = 0; t < n; ++t) {
                for (int s = 0; s < streams; ++s)
                    std::memcpy(y_at(t, (g0 + i + s * q) * 8), out + (t * streams + s) * 8, 8 * sizeof(float));
            }
        }
        // the groups left over (fewer than `streams`), together
        const int64_t g = g0 + streams * q;
        const int rest = static_cast<int>(g1 - g);
        if (rest > 0) {
            tile(w.data + uint64_t(g) * gb, gb, rest, xq, nb, n, cols, true, out);
            for (int t = 0; t < n; ++t)
                std::memcpy(y_at(t, g * 8), out + t * rest * 8, size_t(rest) * 8 * sizeof(float));
        }
        return;
    }
    // prefill: blocks of groups that stay in L2 while every chunk of tokens passes (the first
    // tile on a pair of groups reads them from memory: once)
    constexpr int chunk = 64;
    const int64_t block = std::max<int64_t>(1, int64_t(l2_block_bytes / gb));
    for (int64_t b0 = g0; b0 < g1; b0 += block) {
        const int64_t b1 = std::min(g1, b0 + block);
        for (int t0 = 0; t0 < n; t0 += chunk) {
            const int t1 = std::min(n, t0 + chunk);
            for (int64_t g = b0; g < b1; g += x8_prefill_groups) {
                const int ng = static_cast<int>(std::min<int64_t>(x8_prefill_groups, b1 - g));
                for (int t = t0; t < t1; t += x8_prefill_tokens) {
                    const int nt = std::min(x8_prefill_tokens, t1 - t);
                    tile(w.data + uint64_t(g) * gb, gb, ng, xq + size_t(t) * nb, nb, nt, cols, t == 0, out);
                    for (int k = 0; k < nt; ++k) {
                        // a row group at a time: a copy of constant size is a few vector moves
                        for (int i = 0; i < ng; ++i)
                            std::memcpy(y_at(t + k, (g + i) * 8), out + (k * ng + i) * 8, 8 * sizeof(float));
                    }
                }
            }
        }
    }
}

void cpu_backend::head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                              int64_t y_stride) {
    const int64_t rows = int64_t(w.rows()) / n_head, cols = int64_t(w.cols());
    const int64_t rb = int64_t(format::row_bytes(w.type, uint64_t(cols)));
    const bool f16 = w.type == format::dtype::f16;
    // one (head, token) pair per item, a head's tokens one after another while its rows are in cache
    split(int64_t(n) * n_head, 2LL * n * int64_t(w.rows()) * cols, 1, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) {
            const int64_t h = j / n, i = (j % n) * n_head + h;
            const float* xi = x + i * x_stride;
            float* yi = y + i * y_stride;
            for (int64_t r = 0; r < rows; ++r) {
                const uint8_t* row = w.data + (h * rows + r) * rb;
                yi[r] = f16 ? kt_.dot_f16(row, xi, cols) : kt_.dot_f32(reinterpret_cast<const float*>(row), xi, cols);
            }
        }
    });
}

} // namespace colibri
