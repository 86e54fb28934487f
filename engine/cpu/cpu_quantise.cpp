// Activations quantised to int8 blocks (block_q8_x) for the integer kernels: once per
// distinct input, shared by the jobs that read it.

#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>

namespace colibri {

// Integer dot products: each job's activations quantised once. Jobs with the same
// activations share them (gate and up; in matmul_streamed every expert). Rows that jobs take by
// index (x_rows: a prefill's experts) are quantised once for all of them, then copied
// into each job's blocks, token after token, as the kernels read them.
void cpu_backend::quantise_activations(const matmul_job* jobs, int n_jobs, size_t xq_blocks) {
    quant_src_.clear();
    indexed_.clear();
    for (int j = 0; j < n_jobs; ++j) {
        const matmul_job& jb = jobs[j];
        if (!uses_int8(*jb.w)) continue;
        const int64_t cols = static_cast<int64_t>(jb.w->cols());
        const bool k = superblock_activations(jb.w->type);
        const auto same = std::find_if(jobs, jobs + j, [&](const matmul_job& o) {
            return uses_int8(*o.w) && o.x == jb.x && o.x_rows == jb.x_rows && o.n == jb.n &&
                   int64_t(o.w->cols()) == cols && superblock_activations(o.w->type) == k;
        });
        if (same != jobs + j) {
            xq_begin_[size_t(j)] = xq_begin_[size_t(same - jobs)];
            continue;
        }
        if (jb.x_rows == nullptr) {
            quant_src_.push_back({jb.x, jb.n, cols, xq_begin_[size_t(j)], false, k});
            continue;
        }
        // the rows of x it takes: x's first rows up to the highest, quantised once
        int64_t need = 0;
        for (int t = 0; t < jb.n; ++t) need = std::max<int64_t>(need, int64_t(jb.x_rows[t]) + 1);
        auto src = std::find_if(quant_src_.begin(), quant_src_.end(), [&](const quant_source& q) {
            return q.indexed && q.x == jb.x && q.cols == cols && q.superblocks == k;
        });
        if (src == quant_src_.end()) src = quant_src_.insert(quant_src_.end(), {jb.x, 0, cols, 0, true, k});
        src->rows = std::max(src->rows, need);
        indexed_.push_back({j, size_t(src - quant_src_.begin()), 0});
    }
    for (quant_source& q : quant_src_) { // the indexed sources' blocks after the jobs'
        if (!q.indexed) continue;
        q.xq_at = xq_blocks;
        xq_blocks += size_t(q.rows) * size_t(q.cols / format::qk);
    }
    if (xq_.size() < xq_blocks) xq_.resize(xq_blocks); // grows, then stays
    quant_rows_.clear();
    int64_t rows = 0, elements = 0;
    for (const quant_source& q : quant_src_) {
        quant_rows_.push_back(rows);
        rows += q.rows;
        elements += q.rows * q.cols;
    }
    quant_rows_.push_back(rows);
    // across the threads (a few operations per element), a short batch's rows too
    split(rows, 8 * elements, std::clamp<int64_t>(rows / pool_.size(), 1, 16), [&](int64_t r0, int64_t r1) {
        size_t q = size_t(std::upper_bound(quant_rows_.begin(), quant_rows_.end(), r0) - quant_rows_.begin()) - 1;
        for (int64_t r = r0; r < r1; ++r) {
            while (r >= quant_rows_[q + 1]) ++q;
            const quant_source& src = quant_src_[q];
            const int64_t t = r - quant_rows_[q];
            (src.superblocks ? kt_.quantize_x_k : kt_.quantize_x)(
                src.x + t * src.cols, xq_.data() + src.xq_at + size_t(t) * size_t(src.cols / format::qk), src.cols);
        }
    });
    // then each indexed job's rows copied from its source, across the threads too (a
    // row's copy counted as a quarter of its quantisation's work)
    int64_t copies = 0;
    for (indexed_job& ij : indexed_) {
        ij.first_row = copies;
        copies += jobs[ij.job].n;
    }
    if (copies == 0) return;
    split(copies, copies * (elements / std::max<int64_t>(rows, 1)), 16, [&](int64_t r0, int64_t r1) {
        auto ij = std::upper_bound(indexed_.begin(), indexed_.end(), r0,
                                   [](int64_t v, const indexed_job& o) { return v < o.first_row; }) -
                  1;
        for (int64_t r = r0; r < r1; ++r) {
            while (ij + 1 != indexed_.end() && r >= (ij + 1)->first_row) ++ij;
            const quant_source& src = quant_src_[ij->source];
            const size_t nb = size_t(src.cols / format::qk), t = size_t(r - ij->first_row);
            std::memcpy(xq_.data() + xq_begin_[size_t(ij->job)] + t * nb,
                        xq_.data() + src.xq_at + size_t(jobs[ij->job].x_rows[t]) * nb, nb * sizeof(block_q8_x));
        }
    });
}

} // namespace colibri
