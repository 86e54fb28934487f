// The expert cache (cuda_expert_cache.cuh): its slots planned from the weight budget, and
// the copies of routed experts into them.

#include "cuda/cuda_expert_cache.cuh"

#include <algorithm>
#include <string>

namespace colibri::cuda_detail {

void expert_cache::plan(const cuda_options& o) {
    experts_ = o.experts;
    if (experts_.empty()) return;
    std::unordered_map<const uint8_t*, int> expert_data;
    int layers = 0;
    std::vector<uint64_t> expert_bytes; // by layer
    std::vector<int> per_layer;         // experts by layer
    for (const expert_tensors& e : experts_) {
        layers = std::max(layers, e.layer + 1);
        if (expert_bytes.size() < size_t(layers)) {
            expert_bytes.resize(size_t(layers), 0);
            per_layer.resize(size_t(layers), 0);
        }
        uint64_t b = 0;
        for (int m = 0; m < 3; ++m) {
            b += packed_bytes(*matrix(e, m));
            expert_data[matrix(e, m)->data] = 1;
        }
        expert_bytes[size_t(e.layer)] = std::max(expert_bytes[size_t(e.layer)], b);
        ++per_layer[size_t(e.layer)];
    }
    uint64_t dense = 0, one_of_each = 0;
    for (const tensor_view* t : o.tensors) {
        if (!expert_data.count(t->data)) dense += packed_bytes(*t);
    }
    for (uint64_t b : expert_bytes) one_of_each += b;
    const auto mib = [](uint64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB"; };
    if (dense + one_of_each > o.weight_budget) {
        throw error(errc::out_of_memory, "device weight budget of " + mib(o.weight_budget) +
                                             ": the weights other than the routed experts take " + mib(dense) +
                                             ", and one expert per layer " + mib(one_of_each) + " more");
    }
    const int most = *std::max_element(per_layer.begin(), per_layer.end());
    const int slots = int(std::min<uint64_t>(uint64_t(most), (o.weight_budget - dense) / one_of_each));
    stats_.slots_per_layer = slots;
    if (slots >= most) return; // every expert fits: all stay once used
    layer_cache_.resize(size_t(layers));
    for (int l = 0; l < layers; ++l) {
        if (per_layer[size_t(l)] == 0) continue;
        layer_cache_[size_t(l)].resize(size_t(slots));
    }
    for (const expert_tensors& e : experts_) {
        for (int m = 0; m < 3; ++m) expert_of_[matrix(e, m)->data] = expert_ref{&e, m};
        // each layer's slots sized for its largest matrices
        for (expert_slot& slot : layer_cache_[size_t(e.layer)]) {
            for (int m = 0; m < 3; ++m) {
                const tensor_view& t = *matrix(e, m);
                const uint64_t scales = packed_scale_bytes(t), values = packed_bytes(t) - scales;
                if (slot.m[m].values.bytes() < values) slot.m[m].values = device_memory(values);
                if (slot.m[m].scales.bytes() < scales) slot.m[m].scales = device_memory(scales);
            }
        }
    }
}

const device_weights* expert_cache::find(const tensor_view& w, cudaStream_t stream) {
    if (expert_of_.empty()) return nullptr;
    auto e = expert_of_.find(w.data);
    return e != expert_of_.end() ? &cached_expert(e->second, stream) : nullptr;
}

// Matrix `which` of an expert, its layer's least recently used slot taken for it (and the
// expert copied in) when it is not there. The stream runs in order, so a slot is
// overwritten only after the products queued on what it held.
const device_weights& expert_cache::cached_expert(const expert_ref& r, cudaStream_t stream) {
    std::vector<expert_slot>& slots = layer_cache_[size_t(r.e->layer)];
    expert_slot* slot = nullptr;
    for (expert_slot& s : slots) {
        if (s.holds == r.e) slot = &s;
    }
    if (slot != nullptr) {
        if (r.which == 0) ++stats_.hits; // a feed-forward starts with its gate
    } else {
        slot = &*std::min_element(slots.begin(), slots.end(),
                                  [](const expert_slot& a, const expert_slot& b) { return a.last_use < b.last_use; });
        for (int m = 0; m < 3; ++m) {
            const packed_weights p = pack_for_device(*matrix(*r.e, m));
            device_weights& d = slot->m[m];
            d.kind = p.kind;
            d.rows = p.rows;
            d.cols = p.cols;
            d.row_bytes = p.row_value_bytes();
            COLIBRI_CUDA(
                cudaMemcpyAsync(d.values.get(), p.values.data(), p.values.size(), cudaMemcpyHostToDevice, stream));
            if (!p.scales.empty()) {
                COLIBRI_CUDA(cudaMemcpyAsync(d.scales.get(), p.scales.data(), p.scales.size() * sizeof(float),
                                             cudaMemcpyHostToDevice, stream));
            }
            COLIBRI_CUDA(cudaStreamSynchronize(stream)); // before p's host memory goes
            stats_.bytes_copied += p.values.size() + p.scales.size() * sizeof(float);
        }
        slot->holds = r.e;
        ++stats_.misses;
    }
    slot->last_use = ++tick_;
    return slot->m[r.which];
}

} // namespace colibri::cuda_detail
