// The CUDA backend's memory: activation buffers, copies to and from the host, embedding
// rows, scratch grown on demand, and weights copied to the device on first use.

#include "cuda/cuda_backend_impl.cuh"

#include "format/row_codec.h"

#include <utility>

namespace colibri::cuda_detail {
namespace {

class cuda_buffer final : public device_buffer {
public:
    cuda_buffer(size_t n, cudaStream_t stream) : n_(n), mem_(std::max<size_t>(n, 1) * sizeof(float)) {
        COLIBRI_CUDA(cudaMemsetAsync(mem_.get(), 0, mem_.bytes(), stream));
        COLIBRI_CUDA(cudaStreamSynchronize(stream));
    }
    float* data() override { return static_cast<float*>(mem_.get()); }
    size_t size() const override { return n_; }

private:
    size_t n_;
    device_memory mem_;
};

} // namespace

std::unique_ptr<device_buffer> cuda_backend::alloc(size_t n) {
    select();
    return std::make_unique<cuda_buffer>(n, stream_.get());
}

const float* cuda_backend::to_host(const float* p, size_t n, std::vector<float>& staging) {
    select();
    if (staging.size() < n) staging.resize(n);
    if (capturing_) { // the host cannot wait in a recording: the step is run plainly instead
        recording_fails("a copy to the host");
        return staging.data();
    }
    COLIBRI_CUDA(cudaMemcpyAsync(staging.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, stream_.get()));
    COLIBRI_CUDA(cudaStreamSynchronize(stream_.get()));
    return staging.data();
}

void cuda_backend::from_host(const float* src, size_t n, float* dst) {
    select();
    COLIBRI_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_.get()));
    COLIBRI_CUDA(cudaStreamSynchronize(stream_.get()));
}

void cuda_backend::embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) {
    select();
    const op_timer timer(*this, "embed");
    // the rows on the host, from the mapped table, then one copy
    embed_rows_.resize(size_t(n) * table.cols());
    format::rows_to_f32(table, ids, n, scale, embed_rows_.data());
    COLIBRI_CUDA(cudaMemcpyAsync(out, embed_rows_.data(), embed_rows_.size() * sizeof(float), cudaMemcpyHostToDevice,
                                 stream_.get()));
    COLIBRI_CUDA(cudaStreamSynchronize(stream_.get())); // embed_rows_ is reused by the next call
}

void cuda_backend::grow(device_memory& m, size_t bytes) {
    if (bytes <= m.bytes()) return;
    if (capturing_) { // not while recording: the recorded step is dropped
        recording_fails("scratch memory grown");
        return;
    }
    COLIBRI_CUDA(cudaStreamSynchronize(stream_.get()));
    m.reserve(bytes);
}

const device_weights& cuda_backend::weights(const tensor_view& w) {
    if (const device_weights* cached = expert_cache_.find(w, stream_.get())) return *cached;
    auto it = weights_.find(w.data);
    if (it != weights_.end()) return it->second;
    if (capturing_) { // no copies while recording (the first, plain step made them)
        recording_fails("weights copied in");
        static const device_weights none{};
        return none;
    }
    const packed_weights p = pack_for_device(w);
    device_weights d{p.kind,
                     p.rows,
                     p.cols,
                     p.row_value_bytes(),
                     device_memory(p.values.size()),
                     device_memory(p.scales.size() * sizeof(float))};
    COLIBRI_CUDA(
        cudaMemcpyAsync(d.values.get(), p.values.data(), p.values.size(), cudaMemcpyHostToDevice, stream_.get()));
    if (!p.scales.empty()) {
        COLIBRI_CUDA(cudaMemcpyAsync(d.scales.get(), p.scales.data(), p.scales.size() * sizeof(float),
                                     cudaMemcpyHostToDevice, stream_.get()));
    }
    COLIBRI_CUDA(cudaStreamSynchronize(stream_.get())); // before p's host memory goes
    return weights_.emplace(w.data, std::move(d)).first->second;
}

} // namespace colibri::cuda_detail
