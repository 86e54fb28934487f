// One-token products of interleaved int8 weights as memory streams: every streamed
// group of a call, across matrices, cut into one part per thread and four streams per part.

#include "cpu/cpu_backend.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace colibri {

// Decode (one token per job) with interleaved int8 weights. The streamed jobs' groups,
// all jobs' in a row, are cut into one part per thread, and each part into quarters
// walked side by side a step at a time (a step: the next group of each quarter): four
// streams per thread, as long as they can be, across matrices. Streams within each
// matrix would restart every quarter matrix: a 295 KB expert of the fine-grained
// shape read as four 74 KB streams reads about 11% slower on one thread.
// The parts are balanced by taking halves of what a thread has left
// (thread_pool::parallel_parts), so the threads end within a few steps of each other
// instead of up to a 256 KB chunk apart. The rows of other jobs (f32 or plain rows) go
// first. Returns false, doing nothing, when no job is streamed.
bool cpu_backend::matmul_streamed(const matmul_job* jobs, int n_jobs, int64_t work) {
    segments_.clear();
    int64_t groups = 0, other_rows = 0;
    for (int j = 0; j < n_jobs; ++j) {
        const tensor_view& w = *jobs[j].w;
        const int64_t rows = static_cast<int64_t>(w.rows());
        if (streamed(w)) {
            add_segment(segments_, groups, w, xq_.data() + xq_begin_[size_t(j)], jobs[j].y);
        } else {
            other_rows += rows;
        }
    }
    if (groups == 0) return false;
    end_segments(segments_, groups);
    // the other jobs' rows first (a shared expert's gate: one row)
    if (other_rows > 0) {
        split(other_rows, work * other_rows / (other_rows + groups * 8), 8,
              [&](int64_t r0, int64_t r1) { other_job_rows(jobs, n_jobs, r0, r1); });
    }
    const int nth = work < min_parallel_work ? 1 : pool_.size();
    const auto part = [&](int p) { return groups * p / nth; }; // part p: groups [part(p), part(p + 1))
    pool_.parallel_parts(
        nth == 1, [&](int p) { return (part(p + 1) - part(p) + 3) / 4; },
        [&](int p, int64_t k0, int64_t k1) { run_steps(segments_, part(p), part(p + 1), k0, k1); });
    return true;
}

// A streamed job's groups after the `groups` before it.
void cpu_backend::add_segment(std::vector<segment>& segs, int64_t& groups, const tensor_view& w, const block_q8_x* x,
                              float* y) const {
    const int64_t g = static_cast<int64_t>(w.rows()) / 8;
    const x8_kernels k = int8_x8_kernels(kt_, w.type);
    segs.push_back({groups, w.data, format::x8_rows * format::row_bytes(w.type, w.cols()), x, y, g,
                    static_cast<int64_t>(w.cols()), k.streams, k.tile});
    groups += g;
}

void cpu_backend::end_segments(std::vector<segment>& segs, int64_t groups) {
    COLIBRI_ASSERT(groups < (int64_t(1) << 26)); // parallel_parts: fewer than 2^24 steps a part
    segs.push_back({groups, nullptr, 0, nullptr, nullptr, 0, 0, nullptr, nullptr});
}

// Rows [r0, r1) of the jobs that are not streamed, counted over those jobs only.
void cpu_backend::other_job_rows(const matmul_job* jobs, int n_jobs, int64_t r0, int64_t r1) const {
    int64_t first = 0; // the first row of job j among them
    for (int j = 0; j < n_jobs && first < r1; ++j) {
        if (streamed(*jobs[j].w)) continue;
        const int64_t rows = static_cast<int64_t>(jobs[j].w->rows());
        const int64_t a = std::max(r0, first), b = std::min(r1, first + rows);
        if (a < b) matmul_rows(jobs[j], xq_.data() + xq_begin_[size_t(j)], a - first, b - first);
        first += rows;
    }
}

// Steps [k0, k1) of the part of the streamed groups [pb, pe): group k of each of its
// quarters.
void cpu_backend::run_steps(const std::vector<segment>& segs, int64_t pb, int64_t pe, int64_t k0, int64_t k1) const {
    const int64_t len = pe - pb;
    struct cursor {
        const segment* seg;
        const uint8_t* w; // the group
        float* y;         // its outputs
        int64_t left;     // groups of the job from here
        int64_t count;    // groups of the quarter from step k0 on
    };
    cursor c[4];
    for (int s = 0; s < 4; ++s) {
        const int64_t q0 = pb + s * len / 4, q1 = pb + (s + 1) * len / 4; // quarter s
        const int64_t at = std::min(q0 + k0, q1);
        c[s].seg = &*std::upper_bound(segs.begin(), segs.end(), at, [](int64_t v, const segment& sg) {
            return v < sg.begin;
        }) - 1;
        const int64_t g = at - c[s].seg->begin;
        c[s].w = c[s].seg->w + uint64_t(g) * c[s].seg->group_bytes;
        c[s].y = c[s].seg->y + g * 8;
        c[s].left = c[s].seg->groups - g;
        c[s].count = std::min(q0 + k1, q1) - at;
    }
    float out[32];
    for (int64_t k = 0; k < k1 - k0; ++k) {
        bool alike = true; // four groups of one type and width: one call
        for (int s = 0; s < 4; ++s) {
            alike =
                alike && k < c[s].count && c[s].seg->streams == c[0].seg->streams && c[s].seg->cols == c[0].seg->cols;
        }
        if (alike) {
            const void* group[4] = {c[0].w, c[1].w, c[2].w, c[3].w};
            const block_q8_x* x[4] = {c[0].seg->x, c[1].seg->x, c[2].seg->x, c[3].seg->x};
            c[0].seg->streams(group, x, c[0].seg->cols, out);
        }
        for (int s = 0; s < 4; ++s) {
            if (k >= c[s].count) continue;
            const segment& sg = *c[s].seg;
            if (!alike) sg.tile(c[s].w, 0, 1, sg.x, 0, 1, sg.cols, true, out + 8 * s);
            std::memcpy(c[s].y, out + 8 * s, 8 * sizeof(float));
            c[s].w += sg.group_bytes;
            c[s].y += 8;
            if (--c[s].left == 0 && k + 1 < c[s].count) { // the next job's groups
                ++c[s].seg;
                c[s].w = c[s].seg->w;
                c[s].y = c[s].seg->y;
                c[s].left = c[s].seg->groups;
            }
        }
    }
}

} // namespace colibri
