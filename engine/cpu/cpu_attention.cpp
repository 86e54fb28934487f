// Rotary position embedding and attention over the KV cache.

#include "cpu/cpu_backend.h"

#include "cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace colibri {

void cpu_backend::rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& p) {
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

void cpu_backend::attention(const attention_args& a) {
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
            float* scores = a.scratch + static_cast<int64_t>(ith) * attention_scratch_rows(group) * a.n_ctx;
            for (int64_t job = ith; job < jobs; job += nth) {
                const int t = static_cast<int>(job / a.n_head_kv), kvh = static_cast<int>(job % a.n_head_kv);
                const int64_t head0 = t * q_stride + static_cast<int64_t>(kvh) * group * a.head_dim;
                kernels::attend_softcapped(a.q + head0, group, a.k_cache, a.v_cache, a.kv_f16, kv_off(job), keys(job),
                                           a.head_dim, a.scale, a.softcap, scores, a.out + head0);
            }
        });
        return;
    }
    // Items: a block of the batch's tokens (consecutive ones that read the same keys, as many
    // as attention_rows take with `per` heads) by a KV head's query heads in parts of `per`,
    // three where three divide them, else two (the kernels share each key's and value's load
    // among a call's rows), ordered by KV head, then block, so that a thread's items mostly
    // reread the keys and values it has just read, and each thread takes a run of items of
    // about equal work (a token's work grows with its keys). A single token's items are single
    // heads, a thread's heads of one KV head then going to the kernel together, up to `per`:
    // so one token over three KV heads splits evenly between two threads.
    const int per = std::min(group, group % 3 == 0 ? 3 : 2), unit = a.n == 1 ? 1 : per;
    const int parts = (group + unit - 1) / unit, block_tokens = std::max(1, attention_rows / per);
    blocks_.clear(); // first token of each block, then a.n
    for (int t = 0; t < a.n; ++t) {
        const int b0 = blocks_.empty() ? -1 : blocks_.back();
        if (b0 < 0 || t - b0 == block_tokens || first(t * a.n_head_kv) != first(b0 * a.n_head_kv) ||
            a.pos[t] < a.pos[t - 1])
            blocks_.push_back(t);
    }
    const int64_t n_blocks = int64_t(blocks_.size());
    blocks_.push_back(a.n);
    const int64_t items = a.n_head_kv * n_blocks * parts;
    // an item's KV head, tokens [t0, t1) and query heads [h0, h1) of the group
    struct item_rows {
        int kvh, t0, t1, h0, h1;
    };
    const auto rows_of = [&](int64_t item) {
        const int64_t b = item / parts % n_blocks;
        const int part = static_cast<int>(item % parts);
        return item_rows{static_cast<int>(item / (n_blocks * parts)), blocks_[size_t(b)], blocks_[size_t(b) + 1],
                         unit * part, std::min(group, unit * part + unit)};
    };
    const auto item_work = [&](int64_t item) {
        const item_rows r = rows_of(item);
        int64_t w = 0;
        for (int t = r.t0; t < r.t1; ++t) w += keys(int64_t(t) * a.n_head_kv);
        return w * (r.h1 - r.h0);
    };
    int64_t total = 0;
    for (int64_t item = 0; item < items; ++item) total += item_work(item);
    auto body = [&](int ith, int nth) {
        // this thread's run: the items whose work starts in its share of the total
        int64_t item = 0, done = 0;
        const int64_t from = total * ith / nth, to = total * (ith + 1) / nth;
        for (; item < items && done + item_work(item) / 2 < from; ++item) done += item_work(item);
        float* scores = a.scratch + static_cast<int64_t>(ith) * attention_scratch_rows(group) * a.n_ctx;
        int n_keys[attention_rows];
        while (item < items && done + item_work(item) / 2 < to) {
            done += item_work(item);
            item_rows r = rows_of(item++);
            // the run's next heads of the same block, up to `per` (single heads only)
            for (; item < items && r.h1 - r.h0 < per && done + item_work(item) / 2 < to; ++item) {
                const item_rows more = rows_of(item);
                if (more.kvh != r.kvh || more.t0 != r.t0 || more.h0 != r.h1) break;
                r.h1 = more.h1;
                done += item_work(item);
            }
            const int64_t job = int64_t(r.t0) * a.n_head_kv + r.kvh; // the block's first token's
            for (int t = r.t0; t < r.t1; ++t) n_keys[t - r.t0] = keys(int64_t(t) * a.n_head_kv + r.kvh);
            const int64_t head0 = r.t0 * q_stride + (static_cast<int64_t>(r.kvh) * group + r.h0) * a.head_dim;
            // the thread's next item's keys, which the kernel asks for as it ends
            int64_t next = -1;
            if (item < items) {
                const item_rows nr = rows_of(item);
                next = int64_t(nr.t0) * a.n_head_kv + nr.kvh;
            }
            if (a.kv_f16) {
                const auto* k = static_cast<const uint16_t*>(a.k_cache);
                kt_.attend_f16(a.q + head0, q_stride, r.h1 - r.h0, r.t1 - r.t0, k + kv_off(job),
                               static_cast<const uint16_t*>(a.v_cache) + kv_off(job), n_keys, a.head_dim, a.scale,
                               scores, a.out + head0, q_stride, next >= 0 ? k + kv_off(next) : nullptr,
                               next >= 0 ? keys(next) : 0);
            } else {
                const auto* k = static_cast<const float*>(a.k_cache);
                kt_.attend(a.q + head0, q_stride, r.h1 - r.h0, r.t1 - r.t0, k + kv_off(job),
                           static_cast<const float*>(a.v_cache) + kv_off(job), n_keys, a.head_dim, a.scale, scores,
                           a.out + head0, q_stride, next >= 0 ? k + kv_off(next) : nullptr, next >= 0 ? keys(next) : 0);
            }
        }
    };
    if (work < min_parallel_work) body(0, 1);
    else pool_.run(body);
}

} // namespace colibri
