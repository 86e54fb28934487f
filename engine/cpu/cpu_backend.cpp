// The CPU backend's construction, buffers and embedding lookup; its operations are in the
// files cpu_backend.h lists.

#include "cpu/cpu_backend.h"

#include "cpu/host_buffer.h"
#include "format/row_codec.h"

namespace colibri {

cpu_backend::cpu_backend(const cpu_options& o, int64_t max_cols)
    : pool_(o.n_threads), max_cols_(max_cols), kt_(o.kernels != nullptr ? *o.kernels : best_kernel_table()),
      int8_activations_(o.int8_activations) {
    row_begin_.reserve(512);
    xq_begin_.reserve(512);
    segments_.reserve(512);
    ffn_products_.reserve(512);
    for (auto* v : {&ffn_gate_up_, &ffn_down_}) v->reserve(512);
    ffn_first_.reserve(512);
    ffn_xq_at_.reserve(512);
}

std::unique_ptr<device_buffer> cpu_backend::alloc(size_t n) { return std::make_unique<host_buffer>(n); }

void cpu_backend::embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) {
    format::rows_to_f32(table, ids, n, scale, out);
}

std::unique_ptr<backend> make_cpu_backend(const cpu_options& options, int64_t max_cols) {
    return std::make_unique<cpu_backend>(options, max_cols);
}

} // namespace colibri
