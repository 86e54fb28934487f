// One-token steps recorded as CUDA graphs and replayed: a session's decode step costs one
// launch instead of one per operation.

#include "cuda/cuda_backend_impl.cuh"

namespace colibri::cuda_detail {

bool cuda_backend::step_replay(const void* key, int32_t pos) {
    auto it = steps_.find(key);
    if (it == steps_.end() || !it->second.exec) return false;
    select();
    set_step_position(pos);
    COLIBRI_CUDA(cudaGraphLaunch(it->second.exec.get(), stream_.get()));
    ++steps_replayed_;
    return true;
}

// The first step of a key runs plainly (it copies weights in and sizes the scratch
// buffers), the second is recorded. Not under a weight budget: its copies follow the
// routing.
bool cuda_backend::step_begin(const void* key, int32_t pos) {
    step_graph& g = steps_[key];
    if (g.give_up || g.steps++ == 0 || expert_cache_.active() || profiling_)
        return false; // a graph hides its operations' times
    select();
    set_step_position(pos);
    COLIBRI_CUDA(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    capture_failed_ = false;
    return true;
}

bool cuda_backend::step_end(const void* key) {
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    COLIBRI_CUDA(cudaStreamEndCapture(stream_.get(), &graph));
    step_graph& g = steps_[key];
    if (capture_failed_) {
        cudaGraphDestroy(graph);
        g.give_up = true;
        ++steps_not_recorded_;
        return false;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    g.exec = cuda_graph_exec(exec);
    cudaGraphDestroy(graph);
    COLIBRI_CUDA(made);
    COLIBRI_CUDA(cudaGraphLaunch(g.exec.get(), stream_.get())); // the recorded step has not run yet
    ++steps_recorded_;
    return true;
}

void cuda_backend::step_abandon(const void* key) {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_.get(), &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError(); // the launch error the step threw on
    steps_[key].give_up = true;
    ++steps_not_recorded_;
}

void cuda_backend::step_forget(const void* key) {
    auto it = steps_.find(key);
    if (it == steps_.end()) return;
    if (it->second.exec) cudaStreamSynchronize(stream_.get()); // the graph may still run
    steps_.erase(it);
}

void cuda_backend::set_step_position(int32_t pos) {
    step_position_host_ = pos;
    COLIBRI_CUDA(cudaMemcpyAsync(step_position_.get(), &step_position_host_, sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream_.get()));
}

} // namespace colibri::cuda_detail
