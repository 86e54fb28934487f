// Feed-forwards as a MoE layer runs them: its selected experts' (a dense FFN is one job) in
// one call (ffn_many), and the weighted sum of the experts' outputs.

#include "cpu/cpu_backend.h"

#include "cpu/kernels.h"

#include <algorithm>

namespace colibri {

// Feed-forwards. In matmul_streamed, when whole jobs share out evenly across the threads (eight
// experts on two), each thread runs its jobs from start to end: gate and up, swiglu and
// the down products' activations, then down, as four streams, with no synchronisation
// between the products. Otherwise the products, swiglu and the products as three
// operations.
void cpu_backend::ffn_many(const ffn_job* jobs, int n_jobs) {
    if (ffn_streamed(jobs, n_jobs)) return;
    ffn_products_.clear();
    for (int j = 0; j < n_jobs; ++j) {
        const ffn_job& f = jobs[j];
        ffn_products_.push_back({f.gate, f.x, f.n, f.g, f.x_rows});
        ffn_products_.push_back({f.up, f.x, f.n, f.u, f.x_rows});
    }
    matmul_many(ffn_products_.data(), static_cast<int>(ffn_products_.size()));
    for (int j = 0; j < n_jobs;) { // runs of jobs whose buffers follow one another: one call
        const auto len = [&](int i) { return int64_t(jobs[i].n) * int64_t(jobs[i].gate->rows()); };
        int64_t n = len(j);
        int e = j + 1;
        for (; e < n_jobs && jobs[e].g == jobs[j].g + n && jobs[e].u == jobs[j].u + n && jobs[e].gelu == jobs[j].gelu;
             ++e) {
            n += len(e);
        }
        if (jobs[j].gelu) geglu(jobs[j].g, jobs[j].u, n);
        else swiglu(jobs[j].g, jobs[j].u, n);
        j = e;
    }
    ffn_products_.clear();
    for (int j = 0; j < n_jobs; ++j) ffn_products_.push_back({jobs[j].down, jobs[j].g, jobs[j].n, jobs[j].y});
    matmul_many(ffn_products_.data(), static_cast<int>(ffn_products_.size()));
}

// ffn_many's matmul_streamed: one token per job, every product streamed, the same activations;
// the jobs cut into one run per thread, each within a tenth of an equal share of the
// bytes (else false, doing nothing).
bool cpu_backend::ffn_streamed(const ffn_job* jobs, int n_jobs) {
    if (n_jobs == 0) return false;
    const int64_t cols = static_cast<int64_t>(jobs[0].gate->cols());
    uint64_t total = 0;
    int64_t work = 0;
    for (int j = 0; j < n_jobs; ++j) {
        const ffn_job& f = jobs[j];
        if (f.n != 1 || f.x_rows != nullptr || f.x != jobs[0].x || !streamed(*f.gate) || !streamed(*f.up) ||
            !streamed(*f.down) || static_cast<int64_t>(f.gate->cols()) != cols ||
            quantiser(*f.gate) != quantiser(*jobs[0].gate) || quantiser(*f.up) != quantiser(*jobs[0].gate)) {
            return false;
        }
        for (const tensor_view* w : {f.gate, f.up, f.down}) {
            total += w->size;
            work += static_cast<int64_t>(w->rows() * w->cols());
        }
    }
    const int nth = work < min_parallel_work ? 1 : pool_.size();
    ffn_first_.assign(1, 0);
    uint64_t bytes = 0, most = 0, part = 0;
    for (int j = 0; j < n_jobs; ++j) { // a new run where the bytes pass the next share
        const ffn_job& f = jobs[j];
        const uint64_t b = f.gate->size + f.up->size + f.down->size;
        if (j > 0 && int(ffn_first_.size()) < nth && bytes + b / 2 > total * ffn_first_.size() / uint64_t(nth)) {
            ffn_first_.push_back(j);
            most = std::max(most, part);
            part = 0;
        }
        bytes += b;
        part += b;
    }
    most = std::max(most, part);
    if (int(ffn_first_.size()) < nth || most * uint64_t(nth) * 10 > total * 11) return false;
    ffn_first_.push_back(n_jobs);
    // the activations once; each job's down activations after them
    size_t blocks = size_t(cols / format::qk);
    ffn_xq_at_.clear();
    for (int j = 0; j < n_jobs; ++j) {
        ffn_xq_at_.push_back(blocks);
        blocks += jobs[j].down->cols() / format::qk;
    }
    if (xq_.size() < blocks) xq_.resize(blocks);             // grows, then stays
    const auto gate_up_quantiser = quantiser(*jobs[0].gate); // every job's gate's and up's, as checked above
    gate_up_quantiser(jobs[0].x, xq_.data(), cols);
    ffn_gate_up_.clear();
    ffn_down_.clear();
    int64_t gu = 0, dn = 0;
    for (int j = 0; j < n_jobs; ++j) { // job j: gate and up segments 2j and 2j + 1, down segment j
        add_segment(ffn_gate_up_, gu, *jobs[j].gate, xq_.data(), jobs[j].g);
        add_segment(ffn_gate_up_, gu, *jobs[j].up, xq_.data(), jobs[j].u);
        add_segment(ffn_down_, dn, *jobs[j].down, xq_.data() + ffn_xq_at_[size_t(j)], jobs[j].y);
    }
    end_segments(ffn_gate_up_, gu);
    end_segments(ffn_down_, dn);
    // thread p's experts: their gate and up products and down activations, then their
    // down groups, of which a thread done with its own takes halves (the threads read at
    // different rates when each has its own path to memory: with whole experts alone
    // they ended 8-16 us apart per layer, fine-grained q4_0x8)
    const auto first_job = [&](int p) { return ffn_first_[size_t(p)]; };
    const auto down_begin = [&](int p) { return ffn_down_[size_t(first_job(p))].begin; };
    const auto gate_up = [&](int p) {
        const int j0 = first_job(p), j1 = first_job(p + 1);
        const int64_t g0 = ffn_gate_up_[size_t(2 * j0)].begin, g1 = ffn_gate_up_[size_t(2 * j1)].begin;
        run_steps(ffn_gate_up_, g0, g1, 0, (g1 - g0 + 3) / 4);
        for (int j = j0; j < j1; ++j) {
            const ffn_job& f = jobs[j];
            const int64_t n_ff = static_cast<int64_t>(f.gate->rows());
            if (f.gelu) kernels::geglu(f.g, f.u, n_ff);
            else kt_.swiglu(f.g, f.u, n_ff);
            const auto down_quantiser = quantiser(*f.down);
            down_quantiser(f.g, xq_.data() + ffn_xq_at_[size_t(j)], n_ff);
        }
    };
    const auto down_steps = [&](int p) { return (down_begin(p + 1) - down_begin(p) + 3) / 4; };
    const auto down = [&](int p, int64_t k0, int64_t k1) {
        run_steps(ffn_down_, down_begin(p), down_begin(p + 1), k0, k1);
    };
    if (nth == 1) {
        gate_up(0);
        down(0, 0, down_steps(0));
    } else {
        pool_.parallel_parts_after(gate_up, down_steps, down);
    }
    return true;
}

void cpu_backend::weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n,
                                    int k, int dim) {
    split(n, int64_t(n) * k * dim, 4, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            float* o = out + t * dim;
            std::fill_n(o, dim, 0.0f);
            for (int i = 0; i < k; ++i)
                add_scaled_row(o, rows + int64_t(index[t * k + i]) * dim, dim, weight[t * k + i]);
        }
    });
}

} // namespace colibri
