// The CPU backend: kernels from kernels.cpp, split across a thread pool.

#include "core/error.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "cpu/kernel_table.h"
#include "format/row_codec.h"
#include "ops/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

namespace colibri {

namespace {

// Anonymous mappings: zero pages that cost memory only once touched (a long KV cache
// holds no RSS for positions never reached).
class host_buffer final : public device_buffer {
public:
    explicit host_buffer(size_t n) : n_(n), bytes_(std::max<size_t>(n * sizeof(float), 1)) {
        if (n > SIZE_MAX / (2 * sizeof(float))) throw error(errc::out_of_memory, "buffer size overflows");
        void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            throw error(errc::out_of_memory, "cannot allocate " + std::to_string(bytes_ >> 20) + " MiB of buffers");
        }
        data_ = static_cast<float*>(p);
    }
    ~host_buffer() override { ::munmap(data_, bytes_); }
    float* data() override { return data_; }
    size_t size() const override { return n_; }
    void discard(size_t first, size_t count) override {
        // Whole pages inside the range only; they come back as zero pages when touched.
        static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
        const auto begin = reinterpret_cast<uintptr_t>(data_ + std::min(first, n_));
        const auto end = reinterpret_cast<uintptr_t>(data_ + std::min(first + count, n_));
        const uintptr_t a = (begin + page - 1) / page * page, b = end / page * page;
        if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
    }

private:
    float* data_ = nullptr;
    size_t n_;
    size_t bytes_;
};

class cpu_backend final : public backend {
    // Streamed jobs in order (decode, ffn_many's decode), then one past them (begin: their
    // total groups).
    struct segment {
        int64_t begin;                 // its first group among all streamed groups
        const uint8_t* w;              // the job's weights
        uint64_t group_bytes;
        const block_q8_x* x;           // its quantised activations
        float* y;                      // its outputs
        int64_t groups, cols;
        decltype(kernel_table::streams_q4_0x8) streams;
        decltype(kernel_table::tile_q4_0x8) tile;
    };

public:
    cpu_backend(const cpu_options& o, int64_t max_cols)
        : pool_(o.n_threads), max_cols_(max_cols),
          kt_(o.kernels != nullptr ? *o.kernels : best_kernel_table()), int8_activations_(o.int8_activations) {
        row_begin_.reserve(512);
        xq_begin_.reserve(512);
        segments_.reserve(512);
        ffn_products_.reserve(512);
        for (auto* v : {&ffn_gate_up_, &ffn_down_}) v->reserve(512);
        ffn_first_.reserve(512);
        ffn_xq_at_.reserve(512);
    }

    std::string name() const override { return std::string("cpu/") + kt_.name; }
    int n_threads() const override { return pool_.size(); }

    std::unique_ptr<device_buffer> alloc(size_t n) override { return std::make_unique<host_buffer>(n); }

    void embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) override {
        format::rows_to_f32(table, ids, n, scale, out);
    }

    void matmul(const tensor_view& w, const float* x, int n, float* y) override {
        const matmul_job job{&w, x, n, y};
        matmul_many(&job, 1);
    }

    // All jobs' rows form one range split across the threads: one dispatch for, say, the
    // gate and up matrices of every selected expert.
    void matmul_many(const matmul_job* in_jobs, int n_jobs) override {
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
        if (xq_blocks > 0) quantise(jobs, n_jobs, xq_blocks);
        if (max_tokens == 1 && decode(jobs, n_jobs, work)) return;
        const auto rows = [&](int64_t g0, int64_t g1) {
            for (int j = 0; j < n_jobs; ++j) {
                const int64_t b = row_begin_[size_t(j)], e = row_begin_[size_t(j) + 1];
                const int64_t r0 = std::max(g0, b), r1 = std::min(g1, e);
                if (r0 < r1) matmul_rows(jobs[j], xq_.data() + xq_begin_[size_t(j)], r0 - b, r1 - b);
            }
        };
        // chunks of about chunk_bytes of weights (decode: decode_chunk_bytes), in multiples
        // of eight rows (whole tiles and interleaved groups)
        const uint64_t chunk = max_tokens <= 4 ? decode_chunk_bytes : chunk_bytes;
        int64_t grain = std::max<int64_t>(8, int64_t(chunk * uint64_t(total) / std::max<uint64_t>(bytes, 1)) / 8 * 8);
        if (max_tokens <= 4) {
            // Short batches read their weights from memory, a byte costing more than a
            // multiply-add, and even a small product is shared: decode's 128 KB f32 router
            // of the fine-grained shape took 6.2 us on one thread, 4.6 us on two.
            work = std::max<int64_t>(work, int64_t(bytes));
            grain = std::max<int64_t>(8, std::min(grain, total / pool_.size() / 8 * 8));
        }
        split(total, work, grain, rows);
    }

    // Integer dot products: each job's activations quantised once. Jobs with the same
    // activations share them (gate and up; in decode every expert). Rows that jobs take by
    // index (x_rows: a prefill's experts) are quantised once for all of them, then copied
    // into each job's blocks, token after token, as the kernels read them.
    void quantise(const matmul_job* jobs, int n_jobs, size_t xq_blocks) {
        quant_src_.clear();
        indexed_.clear();
        for (int j = 0; j < n_jobs; ++j) {
            const matmul_job& jb = jobs[j];
            if (!uses_int8(*jb.w)) continue;
            const int64_t cols = static_cast<int64_t>(jb.w->cols());
            const auto same = std::find_if(jobs, jobs + j, [&](const matmul_job& o) {
                return uses_int8(*o.w) && o.x == jb.x && o.x_rows == jb.x_rows && o.n == jb.n && int64_t(o.w->cols()) == cols;
            });
            if (same != jobs + j) {
                xq_begin_[size_t(j)] = xq_begin_[size_t(same - jobs)];
                continue;
            }
            if (jb.x_rows == nullptr) {
                quant_src_.push_back({jb.x, jb.n, cols, xq_begin_[size_t(j)], false});
                continue;
            }
            // the rows of x it takes: x's first rows up to the highest, quantised once
            int64_t need = 0;
            for (int t = 0; t < jb.n; ++t) need = std::max<int64_t>(need, int64_t(jb.x_rows[t]) + 1);
            auto src = std::find_if(quant_src_.begin(), quant_src_.end(),
                                    [&](const quant_source& q) { return q.indexed && q.x == jb.x && q.cols == cols; });
            if (src == quant_src_.end()) src = quant_src_.insert(quant_src_.end(), {jb.x, 0, cols, 0, true});
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
        // prefill's batches across the threads (a few operations per element)
        split(rows, 4 * elements, 16, [&](int64_t r0, int64_t r1) {
            size_t q = size_t(std::upper_bound(quant_rows_.begin(), quant_rows_.end(), r0) - quant_rows_.begin()) - 1;
            for (int64_t r = r0; r < r1; ++r) {
                while (r >= quant_rows_[q + 1]) ++q;
                const quant_source& src = quant_src_[q];
                const int64_t t = r - quant_rows_[q];
                kt_.quantize_x(src.x + t * src.cols, xq_.data() + src.xq_at + size_t(t) * size_t(src.cols / format::qk), src.cols);
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
                                       [](int64_t v, const indexed_job& o) { return v < o.first_row; }) - 1;
            for (int64_t r = r0; r < r1; ++r) {
                while (ij + 1 != indexed_.end() && r >= (ij + 1)->first_row) ++ij;
                const quant_source& src = quant_src_[ij->source];
                const size_t nb = size_t(src.cols / format::qk), t = size_t(r - ij->first_row);
                std::memcpy(xq_.data() + xq_begin_[size_t(ij->job)] + t * nb,
                            xq_.data() + src.xq_at + size_t(jobs[ij->job].x_rows[t]) * nb, nb * sizeof(block_q8_x));
            }
        });
    }

    // Jobs that take their rows of x by index but multiply f32 activations get those rows
    // copied out (the f32 kernels read a job's tokens a row apart); the jobs to run.
    const matmul_job* f32_rows_gathered(const matmul_job* jobs, int n_jobs) {
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
                for (int t = 0; t < jb.n; ++t) std::memcpy(dst + size_t(t) * cols, jb.x + size_t(jb.x_rows[t]) * cols, cols * sizeof(float));
                jb.x = dst;
                at += size_t(jb.n) * cols;
            }
            jb.x_rows = nullptr;
        }
        return local_jobs_.data();
    }

    // Quantised rows without SIMD kernels for f32 activations (all but q8_0 and q4_0):
    // kernels::dot_row.
    static bool scalar_f32_rows(format::dtype t) { return format::is_k_quant(t) || format::is_read_only(t); }

    bool uses_int8(const tensor_view& w) const { return int8_activations_ && format::is_quantized(w.type); }

    bool streamed(const tensor_view& w) const { return format::is_interleaved(w.type) && uses_int8(w); }

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
    bool decode(const matmul_job* jobs, int n_jobs, int64_t work) {
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
    void add_segment(std::vector<segment>& segs, int64_t& groups, const tensor_view& w, const block_q8_x* x, float* y) const {
        const int64_t g = static_cast<int64_t>(w.rows()) / 8;
        const x8_kernels k = int8_x8_kernels(kt_, w.type);
        segs.push_back({groups, w.data, format::x8_rows * format::row_bytes(w.type, w.cols()), x, y, g,
                        static_cast<int64_t>(w.cols()), k.streams, k.tile});
        groups += g;
    }

    static void end_segments(std::vector<segment>& segs, int64_t groups) {
        COLIBRI_ASSERT(groups < (int64_t(1) << 26)); // parallel_parts: fewer than 2^24 steps a part
        segs.push_back({groups, nullptr, 0, nullptr, nullptr, 0, 0, nullptr, nullptr});
    }

    // Feed-forwards. In decode, when whole jobs share out evenly across the threads (eight
    // experts on two), each thread runs its jobs from start to end: gate and up, swiglu and
    // the down products' activations, then down, as four streams, with no synchronisation
    // between the products. Otherwise the products, swiglu and the products as three
    // operations.
    void ffn_many(const ffn_job* jobs, int n_jobs) override {
        if (ffn_decode(jobs, n_jobs)) return;
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
            for (; e < n_jobs && jobs[e].g == jobs[j].g + n && jobs[e].u == jobs[j].u + n && jobs[e].gelu == jobs[j].gelu; ++e) {
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

    // ffn_many's decode: one token per job, every product streamed, the same activations;
    // the jobs cut into one run per thread, each within a tenth of an equal share of the
    // bytes (else false, doing nothing).
    bool ffn_decode(const ffn_job* jobs, int n_jobs) {
        if (n_jobs == 0) return false;
        const int64_t cols = static_cast<int64_t>(jobs[0].gate->cols());
        uint64_t total = 0;
        int64_t work = 0;
        for (int j = 0; j < n_jobs; ++j) {
            const ffn_job& f = jobs[j];
            if (f.n != 1 || f.x_rows != nullptr || f.x != jobs[0].x || !streamed(*f.gate) || !streamed(*f.up) ||
                !streamed(*f.down) || static_cast<int64_t>(f.gate->cols()) != cols) {
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
        if (xq_.size() < blocks) xq_.resize(blocks); // grows, then stays
        kt_.quantize_x(jobs[0].x, xq_.data(), cols);
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
                kt_.quantize_x(f.g, xq_.data() + ffn_xq_at_[size_t(j)], n_ff);
            }
        };
        const auto down_steps = [&](int p) { return (down_begin(p + 1) - down_begin(p) + 3) / 4; };
        const auto down = [&](int p, int64_t k0, int64_t k1) { run_steps(ffn_down_, down_begin(p), down_begin(p + 1), k0, k1); };
        if (nth == 1) {
            gate_up(0);
            down(0, 0, down_steps(0));
        } else {
            pool_.parallel_parts_after(gate_up, down_steps, down);
        }
        return true;
    }

    // Rows [r0, r1) of the jobs that are not streamed, counted over those jobs only.
    void other_job_rows(const matmul_job* jobs, int n_jobs, int64_t r0, int64_t r1) const {
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
    void run_steps(const std::vector<segment>& segs, int64_t pb, int64_t pe, int64_t k0, int64_t k1) const {
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
            c[s].seg = &*std::upper_bound(segs.begin(), segs.end(), at,
                                          [](int64_t v, const segment& sg) { return v < sg.begin; }) - 1;
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
                alike = alike && k < c[s].count && c[s].seg->streams == c[0].seg->streams && c[s].seg->cols == c[0].seg->cols;
            }
            if (alike) {
                const void* group[4] = {c[0].w, c[1].w, c[2].w, c[3].w};
                const block_q8_x* x[4] = {c[0].seg->x, c[1].seg->x, c[2].seg->x, c[3].seg->x};
                c[0].seg->streams(group, x, c[0].seg->cols, out);
            }
            for (int s = 0; s < 4; ++s) {
                if (k >= c[s].count) continue;
                const segment& sg = *c[s].seg;
                if (!alike) sg.tile(c[s].w, 0, 1, sg.x, 0, 1, sg.cols, out + 8 * s);
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

    // Rows [r0, r1) of one job; each weight row is read once for all of its tokens.
    void matmul_rows(const matmul_job& jb, const block_q8_x* xq, int64_t r0, int64_t r1) const {
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
                            for (int k = 0; k < nt; ++k) std::memcpy(y + (t + k) * rows + r, out + 4 * k, 4 * sizeof(float));
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
            four_streams(r0, r1, y, [&](int64_t r, int64_t q, float* out) { dot4(w.data + r * rb, size_t(q) * rb, x, cols, out); },
                         [&](int64_t r) { return dot1(w.data + r * rb, x, cols); });
        } else if (w.type == format::dtype::f32 && n == 1) { // decode's router
            const auto* wf = reinterpret_cast<const float*>(w.data);
            four_streams(r0, r1, y, [&](int64_t r, int64_t q, float* out) { kt_.dot4_f32(wf + r * cols, size_t(q * cols), x, cols, out); },
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
                        kt_.dotx4_f32(reinterpret_cast<const float*>(w.data + r * rb), x + t0 * cols, size_t(cols), cols, out);
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

    // Decode's rows [r0, r1) of a product walked as four streams a quarter of the range
    // apart, which keeps more hardware prefetch streams busy than one sequential walk:
    // dot4(r, q, out) gives rows r, r + q, r + 2q and r + 3q; dot1(r) one of the rows left.
    template <class Dot4, class Dot1>
    static void four_streams(int64_t r0, int64_t r1, float* y, Dot4&& dot4, Dot1&& dot1) {
        const int64_t q = (r1 - r0) / 4;
        float out[4];
        for (int64_t i = 0; i < q; ++i) {
            dot4(r0 + i, q, out);
            for (int k = 0; k < 4; ++k) y[r0 + i + k * q] = out[k];
        }
        for (int64_t r = r0 + 4 * q; r < r1; ++r) y[r] = dot1(r);
    }

    // Row r of a q8_0 or q4_0 product (its bytes at `row`) with every token's f32
    // activations: four tokens at a time, then one, each bit-identical to one at a time.
    void f32_row_tokens(format::dtype row_type, const uint8_t* row, const matmul_job& jb, int64_t r) const {
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
    void matmul_groups(const matmul_job& jb, const block_q8_x* xq, int64_t r0, int64_t r1) const {
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
                for (int r = 0; r < 8; ++r) format::x8_row(w.type, w.data, w.cols(), uint64_t(g * 8 + r), plain.data() + r * rb);
                for (int r = 0; r < 8; ++r) f32_row_tokens(format::row_type(w.type), plain.data() + r * rb, jb, g * 8 + r);
            }
            return;
        }
        const size_t nb = size_t(cols / format::qk);
        const auto tile = int8_x8_kernels(kt_, w.type).tile;
        float out[8 * 4 * 8]; // the most a tile call returns: 8 tokens by 4 groups
        if (n <= 4) {
            // short batches (decode walks its groups in decode()): 4 / n groups a share of
            // the range apart, which keeps several hardware prefetch streams busy
            const int streams = 4 / n;
            const int64_t q = (g1 - g0) / streams;
            for (int64_t i = 0; i < q; ++i) {
                tile(w.data + uint64_t(g0 + i) * gb, size_t(q) * gb, streams, xq, nb, n, cols, out);
                for (int t = 0; t < n; ++t) {
                    for (int s = 0; s < streams; ++s) std::memcpy(y_at(t, (g0 + i + s * q) * 8), out + (t * streams + s) * 8, 8 * sizeof(float));
                }
            }
            // the groups left over (fewer than `streams`), together
            const int64_t g = g0 + streams * q;
            const int rest = static_cast<int>(g1 - g);
            if (rest > 0) {
                tile(w.data + uint64_t(g) * gb, gb, rest, xq, nb, n, cols, out);
                for (int t = 0; t < n; ++t) std::memcpy(y_at(t, g * 8), out + t * rest * 8, size_t(rest) * 8 * sizeof(float));
            }
            return;
        }
        // prefill: blocks of groups that stay in L2 while every chunk of tokens passes
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
                        tile(w.data + uint64_t(g) * gb, gb, ng, xq + size_t(t) * nb, nb, nt, cols, out);
                        for (int k = 0; k < nt; ++k) {
                            // a row group at a time: a copy of constant size is a few vector moves
                            for (int i = 0; i < ng; ++i) std::memcpy(y_at(t + k, (g + i) * 8), out + (k * ng + i) * 8, 8 * sizeof(float));
                        }
                    }
                }
            }
        }
    }

    void head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                     int64_t y_stride) override {
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

    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows, int cols) override {
        for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, sizeof(float) * size_t(cols));
    }

    void rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) override {
        const auto* wf = reinterpret_cast<const float*>(w.data);
        // a prefill batch's rows across the threads (about three operations per element)
        split(n, 3LL * n * dim, 1, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) kernels::rmsnorm(out + t * dim, x + t * dim, wf, dim, eps);
        });
    }

    void layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                   float* out) override {
        const auto* wf = reinterpret_cast<const float*>(w.data);
        const auto* bf = reinterpret_cast<const float*>(b.data);
        split(n, 4LL * n * dim, 1, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) kernels::layernorm(out + t * dim, x + t * dim, wf, bf, dim, eps);
        });
    }

    void gelu(float* x, int64_t n) override {
        split(n, 8 * n, 1024, [&](int64_t b, int64_t e) { kernels::gelu(x + b, e - b); });
    }

    void geglu(float* gate, const float* up, int64_t n) override {
        split(n, 8 * n, 1024, [&](int64_t b, int64_t e) { kernels::geglu(gate + b, up + b, e - b); });
    }

    void softcap(float* x, int64_t n, float cap) override {
        split(n, 8 * n, 4096, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) x[i] = cap * std::tanh(x[i] / cap);
        });
    }

    void add_bias(float* y, const tensor_view& b, int n, int dim) override {
        const auto* bf = reinterpret_cast<const float*>(b.data);
        for (int t = 0; t < n; ++t) {
            for (int i = 0; i < dim; ++i) y[t * dim + i] += bf[i];
        }
    }

    void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& p) override {
        const int half = head_dim / 2;
        const float* factors = p.freq_factors != nullptr ? reinterpret_cast<const float*>(p.freq_factors->data) : nullptr;
        // The angles depend on the position only: computed once per batch for every head
        // and layer (the same positions come back for k, and for every layer).
        const bool same = rope_theta_ == p.theta && rope_factors_ == factors && rope_attn_ == p.attn_factor &&
                          rope_half_ == half && rope_pos_.size() == size_t(n) &&
                          std::equal(pos, pos + n, rope_pos_.begin());
        if (!same) {
            rope_theta_ = p.theta;
            rope_factors_ = factors;
            rope_attn_ = p.attn_factor;
            rope_half_ = half;
            rope_pos_.assign(pos, pos + n);
            rope_cs_.resize(size_t(n) * size_t(half) * 2); // grows, then stays
            for (int t = 0; t < n; ++t) {
                float* cs = rope_cs_.data() + size_t(t) * size_t(half) * 2;
                for (int i = 0; i < half; ++i) {
                    double freq = std::pow(static_cast<double>(p.theta), -2.0 * i / head_dim);
                    if (factors != nullptr) freq /= factors[i];
                    const double angle = pos[t] * freq;
                    cs[i] = static_cast<float>(p.attn_factor * std::cos(angle));
                    cs[half + i] = static_cast<float>(p.attn_factor * std::sin(angle));
                }
            }
        }
        // the rotations of a prefill batch's tokens across the threads (the same code for any
        // split, so a token's result does not depend on it)
        split(n, 2LL * n * n_heads * head_dim, 1, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) {
                const float* c = rope_cs_.data() + size_t(t) * size_t(half) * 2;
                const float* sn = c + half;
                for (int h = 0; h < n_heads; ++h) {
                    float* v = x + (t * n_heads + h) * head_dim;
                    for (int i = 0; i < half; ++i) {
                        const float a = v[i], b = v[i + half];
                        v[i] = a * c[i] - b * sn[i];
                        v[i + half] = b * c[i] + a * sn[i];
                    }
                }
            }
        });
    }

    void attention(const attention_args& a) override {
        const int group = a.n_head / a.n_head_kv;
        const int64_t q_stride = static_cast<int64_t>(a.n_head) * a.head_dim;
        const int64_t kv_dim = static_cast<int64_t>(a.n_head_kv) * a.head_dim;
        // store the batch's keys and values, each head's positions in a row
        for (int t = 0; t < a.n; ++t) {
            for (int h = 0; h < a.n_head_kv; ++h) {
                const int64_t from = t * kv_dim + static_cast<int64_t>(h) * a.head_dim;
                const int64_t to = (static_cast<int64_t>(h) * a.n_ctx + a.pos[t]) * a.head_dim;
                if (a.kv_f16) {
                    kt_.to_f16(a.k_new + from, static_cast<uint16_t*>(a.k_cache) + to, a.head_dim);
                    kt_.to_f16(a.v_new + from, static_cast<uint16_t*>(a.v_cache) + to, a.head_dim);
                } else {
                    std::memcpy(static_cast<float*>(a.k_cache) + to, a.k_new + from, sizeof(float) * size_t(a.head_dim));
                    std::memcpy(static_cast<float*>(a.v_cache) + to, a.v_new + from, sizeof(float) * size_t(a.head_dim));
                }
            }
        }
        const int64_t jobs = static_cast<int64_t>(a.n) * a.n_head_kv; // a token's query heads of one kv head
        int64_t work = 0; // multiply-adds: two per cached key and head dimension
        for (int t = 0; t < a.n; ++t) work += 2LL * (a.pos[t] + 1) * a.head_dim * a.n_head;
        // job: the keys' and values' offset in the caches, and their count
        // a sliding window's first row, and from it the keys a job reads
        const auto first = [&](int64_t job) {
            const int p = a.pos[job / a.n_head_kv];
            return a.window > 0 ? std::max(0, p - a.window + 1) : 0;
        };
        const auto kv_off = [&](int64_t job) { return ((job % a.n_head_kv) * a.n_ctx + first(job)) * a.head_dim; };
        const auto keys = [&](int64_t job) { return a.pos[job / a.n_head_kv] + 1 - first(job); };
        if (a.softcap > 0) { // Gemma 2's capped scores: the scalar kernel
            pool_.run([&](int ith, int nth) {
                float* scores = a.scratch + static_cast<int64_t>(ith) * group * a.n_ctx;
                for (int64_t job = ith; job < jobs; job += nth) {
                    const int t = static_cast<int>(job / a.n_head_kv), kvh = static_cast<int>(job % a.n_head_kv);
                    const int64_t head0 = t * q_stride + static_cast<int64_t>(kvh) * group * a.head_dim;
                    kernels::attend_softcapped(a.q + head0, group, a.k_cache, a.v_cache, a.kv_f16, kv_off(job), keys(job),
                                               a.head_dim, a.scale, a.softcap, scores, a.out + head0);
                }
            });
            return;
        }
        // fewer jobs than threads (one token over few KV heads: latent attention's one) split
        // each job's query heads into parts, every part reading the job's keys
        const int nth_max = pool_.size();
        const int parts = jobs < nth_max ? std::min<int>(group, int((nth_max + jobs - 1) / jobs)) : 1;
        const int64_t items = jobs * parts;
        auto body = [&](int ith, int nth) {
            float* scores = a.scratch + static_cast<int64_t>(ith) * group * a.n_ctx;
            for (int64_t item = ith; item < items; item += nth) {
                const int64_t job = item / parts;
                const int part = static_cast<int>(item % parts), h0 = part * group / parts, h1 = (part + 1) * group / parts;
                const int t = static_cast<int>(job / a.n_head_kv), kvh = static_cast<int>(job % a.n_head_kv);
                const int64_t head0 = t * q_stride + (static_cast<int64_t>(kvh) * group + h0) * a.head_dim;
                // the thread's next job, whose keys the kernel asks for as it ends
                const int64_t next = item + nth < items ? (item + nth) / parts : -1;
                if (a.kv_f16) {
                    const auto* k = static_cast<const uint16_t*>(a.k_cache);
                    kt_.attend_f16(a.q + head0, h1 - h0, k + kv_off(job), static_cast<const uint16_t*>(a.v_cache) + kv_off(job),
                                   keys(job), a.head_dim, a.scale, scores, a.out + head0,
                                   next >= 0 ? k + kv_off(next) : nullptr, next >= 0 ? keys(next) : 0);
                } else {
                    const auto* k = static_cast<const float*>(a.k_cache);
                    kt_.attend(a.q + head0, h1 - h0, k + kv_off(job), static_cast<const float*>(a.v_cache) + kv_off(job),
                               keys(job), a.head_dim, a.scale, scores, a.out + head0, next >= 0 ? k + kv_off(next) : nullptr,
                               next >= 0 ? keys(next) : 0);
                }
            }
        };
        if (work < min_parallel_work) body(0, 1);
        else pool_.run(body);
    }

    void swiglu(float* gate, const float* up, int64_t n) override {
        // an exponential each, counted as four multiply-adds for the split threshold: worth
        // the threads for a prefill batch, not for one token's experts (a few thousand
        // elements take under a microsecond, less than a dispatch)
        split(n, 4 * n, 1024, [&](int64_t b, int64_t e) { kt_.swiglu(gate + b, up + b, e - b); });
    }

    void add_scaled(float* x, const float* y, int64_t n, float s) override {
        split(n, n, 4096, [&](int64_t b, int64_t e) { add_scaled_row(x + b, y + b, e - b, s); });
    }

    void scale(float* x, int64_t n, float s) override {
        split(n, n, 4096, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) x[i] *= s;
        });
    }

    void weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n, int k,
                           int dim) override {
        split(n, int64_t(n) * k * dim, 4, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) {
                float* o = out + t * dim;
                std::fill_n(o, dim, 0.0f);
                for (int i = 0; i < k; ++i) add_scaled_row(o, rows + int64_t(index[t * k + i]) * dim, dim, weight[t * k + i]);
            }
        });
    }

private:
    static void add_scaled_row(float* x, const float* y, int64_t n, float s) {
        for (int64_t i = 0; i < n; ++i) x[i] += s * y[i];
    }

    // Below this many multiply-adds an operation runs on the calling thread: waking the
    // pool costs more than it saves (small models, short contexts).
    static constexpr int64_t min_parallel_work = 1 << 16;
    // The last rows of a product are handed to the threads in chunks of about this many
    // bytes of weights (see split). Up to four tokens (plain rows in decode, short batches)
    // read each chunk as four streams, which start cold: their chunks are larger (measured
    // when decode of interleaved rows went this way too: fine-grained 4-bit 1.07-1.09x at
    // 256 KB against 64 KB, 0.96x at 1 MB against 256 KB; prefill 0.94-1.06x, so it keeps
    // 64 KB). Decode of interleaved rows has its own split (decode()).
    static constexpr uint64_t chunk_bytes = 64 << 10;
    static constexpr uint64_t decode_chunk_bytes = 256 << 10;
    // Prefill walks a matrix in blocks of rows of about this many bytes, which stay in
    // L2 while every chunk of tokens passes over them.
    static constexpr uint64_t l2_block_bytes = 64 << 10;

    // items [0, n) on the calling thread below min_parallel_work, else across the pool:
    // the threads share the memory unevenly, so after equal shares of most of the items
    // the rest goes in chunks of `grain` to whichever thread is free, and no thread waits
    // long for another at the end of an operation.
    template <class F>
    void split(int64_t items, int64_t work, int64_t grain, F&& f) {
        if (work < min_parallel_work) f(int64_t(0), items);
        else pool_.parallel_balanced(items, grain, f);
    }

    thread_pool pool_;
    int64_t max_cols_;
    const kernel_table& kt_;
    bool int8_activations_;
    std::vector<block_q8_x> xq_;      // quantised activations of every job
    struct quant_source {             // rows quantised into xq_
        const float* x;
        int64_t rows, cols;
        size_t xq_at;                 // its first block
        bool indexed;                 // rows that jobs take by index (copied to them after)
    };
    std::vector<quant_source> quant_src_;
    std::vector<int64_t> quant_rows_; // the rows before each source, then their total
    struct indexed_job {              // a job that copies its blocks from a source
        int job;
        size_t source;
        int64_t first_row;            // its rows' place among all copied rows
    };
    std::vector<indexed_job> indexed_;
    std::vector<float> f32_rows_;     // rows taken by index for the f32 kernels
    std::vector<matmul_job> local_jobs_;
    std::vector<int64_t> row_begin_;  // [n_jobs + 1] first global row of each job
    std::vector<segment> segments_;
    std::vector<matmul_job> ffn_products_; // ffn_many's products, stepwise
    // ffn_many's decode: each thread's first job (then n_jobs), the first block of each
    // job's down activations
    std::vector<int> ffn_first_;
    std::vector<size_t> ffn_xq_at_;
    std::vector<segment> ffn_gate_up_, ffn_down_;
    std::vector<size_t> xq_begin_;    // [n_jobs] first block of each job in xq_
    // rotary angles of the last positions seen: [n][cos of half pairs, sin of half pairs]
    std::vector<int32_t> rope_pos_;
    std::vector<float> rope_cs_;
    float rope_theta_ = 0.0f;
    const float* rope_factors_ = nullptr;
    float rope_attn_ = 1.0f;
    int rope_half_ = 0;
};

} // namespace

std::unique_ptr<backend> make_cpu_backend(const cpu_options& options, int64_t max_cols) {
    return std::make_unique<cpu_backend>(options, max_cols);
}

} // namespace colibri
