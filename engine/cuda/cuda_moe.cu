// Mixture of experts on the device: one token's MoE layer routed there (moe_one: the
// routing kernel, the chosen experts' products through the layer's table of expert
// weights, their weighted sum with the shared expert's), and the weighted sums of expert
// rows a session that routes on the host asks for.

#include "cuda/cuda_backend_impl.cuh"
#include "cuda/row_dots.cuh"

namespace colibri::cuda_detail {

// One token's products with the k experts a route chose (ids[j], on the device), for
// matrices which.. of each (gate and up in one launch): blockIdx.y = m * k + j is matrix
// which + m of expert ids[j], its weights found in the layer's table; slot j's activations at
// x + j * x_stride (x_stride 0: one vector for all), its outputs at y + blockIdx.y * rows.
struct expert_ptrs {
    const uint8_t* values[3]; // gate, up, down
    const float* scales[3];
};

namespace {

template <device_kind K>
__global__ void matmul_id_kernel(const expert_ptrs* table, int which, const int32_t* ids, int k, int64_t rows,
                                 int64_t cols, int64_t row_bytes, const float* x, int64_t x_stride, float* y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * mm_rows + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int j = int(blockIdx.y) % k, m = which + int(blockIdx.y) / k;
    const expert_ptrs& e = table[ids[j]];
    const float* xs[1] = {x + j * x_stride};
    float acc[1];
    row_dots<K, 1>(e.values[m] + r * row_bytes,
                   e.scales[m] != nullptr ? e.scales[m] + r * (cols / 32) * kind_scales<K> : nullptr, cols, xs, 1, acc);
    const float s = warp_sum(acc[0]);
    if (lane == 0) y[int64_t(blockIdx.y) * rows + r] = s;
}

// The routing of one token (one thread: a router has tens of experts), as the session
// routes on the host: softmax, the k best by repeated arg-max (ties to the lower index,
// NaN never), their weights, renormalised when asked; then in index order, the order the
// session sums them in.
__global__ void route_kernel(const float* logits, int n_expert, int k, bool renorm, int n_group, int n_group_used,
                             float scale, float* probs, int32_t* ids, float* weights) {
    if (threadIdx.x != 0) return;
    float max = logits[0];
    for (int i = 1; i < n_expert; ++i) max = max < logits[i] ? logits[i] : max;
    float sum = 0.0f;
    for (int i = 0; i < n_expert; ++i) {
        probs[i] = expf(logits[i] - max);
        sum = __fadd_rn(sum, probs[i]);
    }
    const float inv = __fdiv_rn(1.0f, sum);
    for (int i = 0; i < n_expert; ++i) probs[i] = __fmul_rn(probs[i], inv);
    if (n_group > 1) { // the experts of the n_group_used groups of best expert only
        const int size = n_expert / n_group;
        uint64_t kept = 0;
        for (int j = 0; j < n_group_used; ++j) {
            int best = -1;
            float best_p = -1.0f;
            for (int g = 0; g < n_group; ++g) {
                if (kept >> g & 1) continue;
                float p = probs[g * size];
                for (int e = 1; e < size; ++e) p = fmaxf(p, probs[g * size + e]);
                if (best < 0 || p > best_p) best = g, best_p = p;
            }
            kept |= uint64_t(1) << best;
        }
        for (int e = 0; e < n_expert; ++e) {
            if (!(kept >> (e / size) & 1)) probs[e] = -1.0f;
        }
    }
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < n_expert; ++e) {
            if (probs[e] >= 0.0f && (best < 0 || probs[e] > probs[best])) best = e;
        }
        if (best < 0) best = j; // only when the router produced NaN: keep ids valid
        ids[j] = best;
        weights[j] = fmaxf(probs[best], 0.0f);
        probs[best] = -1.0f;
        total = __fadd_rn(total, weights[j]);
    }
    for (int j = 0; j < k; ++j) {
        if (renorm) weights[j] = __fdiv_rn(weights[j], total);
        if (scale != 1.0f) weights[j] = __fmul_rn(weights[j], scale);
    }
    for (int j = 1; j < k; ++j) { // insertion sort by index
        for (int i = j; i > 0 && ids[i - 1] > ids[i]; --i) {
            const int32_t id = ids[i];
            ids[i] = ids[i - 1];
            ids[i - 1] = id;
            const float w = weights[i];
            weights[i] = weights[i - 1];
            weights[i - 1] = w;
        }
    }
}

// out[d] = the k experts' outputs y[j] weighted and summed in order, then the shared
// expert's (weight 1, or sigmoid of its gate's output when it has one).
__global__ void moe_sum_kernel(float* out, const float* y, const float* weights, int k, int dim, const float* shared_y,
                               const float* shared_gate) {
    const int d = int(blockIdx.x) * blockDim.x + threadIdx.x;
    if (d >= dim) return;
    float o = 0.0f;
    for (int j = 0; j < k; ++j) o = __fadd_rn(o, __fmul_rn(weights[j], y[int64_t(j) * dim + d]));
    if (shared_y != nullptr) {
        const float w = shared_gate != nullptr ? __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-shared_gate[0]))) : 1.0f;
        o = __fadd_rn(o, __fmul_rn(w, shared_y[d]));
    }
    out[d] = o;
}

// out[t, d] = sum over i < k of weight[t * k + i] * rows[index[t * k + i], d], in order of i.
__global__ void weighted_sum_kernel(float* out, const float* rows, const int32_t* index, const float* weight, int n,
                                    int k, int dim) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(n) * dim) return;
    const int64_t t = i / dim, d = i % dim;
    float o = 0.0f;
    for (int j = 0; j < k; ++j)
        o = __fadd_rn(o, __fmul_rn(weight[t * k + j], rows[int64_t(index[t * k + j]) * dim + d]));
    out[i] = o;
}

} // namespace

void cuda_backend::weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n,
                                     int k, int dim) {
    select();
    const op_timer timer(*this, "weighted_sum_rows");
    const int32_t* idx = upload(index, size_t(n) * size_t(k), 2);
    const float* wt = upload(weight, size_t(n) * size_t(k), 3);
    const int64_t total = int64_t(n) * dim;
    COLIBRI_LAUNCH(weighted_sum_kernel, blocks_for(total, 256), 256, 0, stream_.get())(out, rows, idx, wt, n, k, dim);
    COLIBRI_LAUNCHED("weighted_sum_rows");
}

// Routing on the device: the router's product, route_kernel, the chosen experts' products
// through the layer's table of expert weights (no wait for the host), the shared expert,
// the weighted sum. Left to the session under a weight budget (the expert cache copies on
// the host's schedule) and for layers whose experts differ in shape or type.
bool cuda_backend::moe_one(const moe_step& st) {
    if (expert_cache_.active()) return false;
    select();
    const op_timer timer(*this, "moe_one");
    const expert_table* table = table_for(st);
    if (table == nullptr) return false;
    const int k = st.k;
    const int64_t dim = static_cast<int64_t>(st.router->cols()), n_ff = table->gate.rows;
    moe_.logits.reserve_floats(*this, size_t(st.n_expert));
    moe_.probs.reserve_floats(*this, size_t(st.n_expert));
    moe_.weights.reserve_floats(*this, size_t(k));
    moe_.ids.reserve_floats(*this, size_t(k)); // int32 in float-sized cells
    moe_.gu.reserve_floats(*this, 2 * size_t(k) * size_t(n_ff));
    moe_.y.reserve_floats(*this, size_t(k) * size_t(dim));
    float* logits = moe_.logits.f();
    auto* ids = reinterpret_cast<int32_t*>(moe_.ids.f());
    product(*st.router, st.x, nullptr, 1, logits);
    COLIBRI_LAUNCH(route_kernel, 1, 32, 0, stream_.get())
    (logits, st.n_expert, k, st.renorm, st.n_group, st.n_group_used, st.scale, moe_.probs.f(), ids, moe_.weights.f());
    COLIBRI_LAUNCHED("route");
    const auto* ptrs = static_cast<const expert_ptrs*>(table->ptrs.get());
    float* g = moe_.gu.f();
    float* u = g + int64_t(k) * n_ff;
    if (table->gate == table->up) {
        launch_by_id(table->gate, ptrs, 0, 2, ids, k, st.x, 0, g);
    } else {
        launch_by_id(table->gate, ptrs, 0, 1, ids, k, st.x, 0, g);
        launch_by_id(table->up, ptrs, 1, 1, ids, k, st.x, 0, u);
    }
    swiglu(g, u, int64_t(k) * n_ff);
    launch_by_id(table->down, ptrs, 2, 1, ids, k, g, n_ff, moe_.y.f());
    const float* shared_y = nullptr;
    const float* shared_gate = nullptr;
    if (st.shared != nullptr) {
        const int64_t sff = static_cast<int64_t>(st.shared->gate->rows());
        moe_.sg.reserve_floats(*this, size_t(sff));
        moe_.su.reserve_floats(*this, size_t(sff));
        moe_.sy.reserve_floats(*this, size_t(dim));
        const ffn_job job{st.shared->gate, st.shared->up, st.shared->down, st.x,       1,
                          nullptr,         moe_.sg.f(),   moe_.su.f(),     moe_.sy.f()};
        ffn_many(&job, 1);
        shared_y = moe_.sy.f();
        if (st.shared_gate != nullptr) {
            moe_.sgate.reserve_floats(*this, 1);
            product(*st.shared_gate, st.x, nullptr, 1, moe_.sgate.f());
            shared_gate = moe_.sgate.f();
        }
    }
    COLIBRI_LAUNCH(moe_sum_kernel, blocks_for(dim, 256), 256, 0, stream_.get())
    (st.out, moe_.y.f(), moe_.weights.f(), k, int(dim), shared_y, shared_gate);
    COLIBRI_LAUNCHED("moe_sum");
    return true;
}

// The layer's table (every expert copied to the device first), or null when its experts
// differ in shape or type, or have rows the warp-per-row kernel does not take.
const cuda_backend::expert_table* cuda_backend::table_for(const moe_step& st) {
    if (auto it = tables_.find(st.experts); it != tables_.end()) return it->second.get();
    if (capturing_) { // made by a plain step, which copies the experts in
        recording_fails("an expert table made");
        return nullptr;
    }
    std::vector<expert_ptrs> ptrs(size_t(st.n_expert));
    matrix_shape shapes[3]{};
    bool usable = true;
    for (int e = 0; e < st.n_expert && usable; ++e) {
        const tensor_view* m[3] = {st.experts[e].gate, st.experts[e].up, st.experts[e].down};
        for (int w = 0; w < 3; ++w) {
            const device_weights& d = weights(*m[w]);
            const matrix_shape s{d.kind, d.rows, d.cols, d.row_bytes};
            if (e == 0) shapes[w] = s;
            usable = usable && s.kind == shapes[w].kind && s.rows == shapes[w].rows && s.cols == shapes[w].cols &&
                     s.cols % 32 == 0;
            ptrs[size_t(e)].values[w] = d.v();
            ptrs[size_t(e)].scales[w] = d.s();
        }
    }
    std::unique_ptr<expert_table> t;
    if (usable) {
        t = std::make_unique<expert_table>(
            expert_table{shapes[0], shapes[1], shapes[2], device_memory(ptrs.size() * sizeof(expert_ptrs))});
        COLIBRI_CUDA(cudaMemcpyAsync(t->ptrs.get(), ptrs.data(), ptrs.size() * sizeof(expert_ptrs),
                                     cudaMemcpyHostToDevice, stream_.get()));
        COLIBRI_CUDA(cudaStreamSynchronize(stream_.get()));
    }
    return (tables_[st.experts] = std::move(t)).get();
}

void cuda_backend::launch_by_id(const matrix_shape& m, const expert_ptrs* table, int which, int n_which,
                                const int32_t* ids, int k, const float* x, int64_t x_stride, float* y) {
    const dim3 grid(unsigned((m.rows + mm_rows - 1) / mm_rows), unsigned(k * n_which));
    with_kind(m.kind, [&](auto kind) {
        const auto kernel = matmul_id_kernel<kind.value>;
        COLIBRI_LAUNCH(kernel, grid, 32 * mm_rows, 0, stream_.get())
        (table, which, ids, k, m.rows, m.cols, m.row_bytes, x, x_stride, y);
    });
    COLIBRI_LAUNCHED("matmul_id");
}

} // namespace colibri::cuda_detail
