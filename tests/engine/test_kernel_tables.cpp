// Every SIMD kernel table against the scalar one, entry by entry, on odd and large shapes.

#include "kernel_test_util.h"

TEST_CASE("SIMD row kernels reproduce the scalar reference") {
    const kernel_table& ref = scalar_kernel_table();
    const std::vector<const kernel_table*> simd_list = simd_tables();
    if (simd_list.empty()) {
        MESSAGE("this CPU has no AVX2: only the scalar kernels run here");
        return;
    }
#if defined(COLIBRI_HAVE_AVX512_EMULATION)
    CHECK(simd_list.size() >= 3); // AVX2 and the two emulated AVX-512 tables at least
#endif
    for (const kernel_table* simd : simd_list) {
        const std::string table = simd->name;
        CAPTURE(table);
        for (int64_t n : {32, 64, 96, 256, 1024, 4096 + 32, 4096 + 256}) {
            CAPTURE(n);
            auto w = random_vec(size_t(n), 41 + n, 2.0f), x = random_vec(size_t(n), 42 + n, 3.0f);
            // activation quantisation: identical blocks
            std::vector<block_q8_x> xr(size_t(n / 32)), xs(size_t(n / 32));
            ref.quantize_x(x.data(), xr.data(), n);
            simd->quantize_x(x.data(), xs.data(), n);
            for (size_t b = 0; b < xr.size(); ++b) {
                CHECK(xs[b].d == xr[b].d);
                CHECK(xs[b].sum == xr[b].sum);
                CHECK(xs[b].sum_lo == xr[b].sum_lo);
                CHECK(xs[b].dsum == xr[b].dsum);
                CHECK(xr[b].dsum == xr[b].d * static_cast<float>(xr[b].sum));
                CHECK(std::memcmp(xs[b].qs, xr[b].qs, 32) == 0);
            }
            if (n % 256 == 0) { // one scale per 256 values: the largest |x| among them is 127
                ref.quantize_x_k(x.data(), xr.data(), n);
                simd->quantize_x_k(x.data(), xs.data(), n);
                for (size_t b = 0; b < xr.size(); ++b) {
                    CHECK(xs[b].d == xr[b].d);
                    CHECK(xs[b].d == xr[b / 8 * 8].d);
                    CHECK(xs[b].sum == xr[b].sum);
                    CHECK(xs[b].sum_lo == xr[b].sum_lo);
                    CHECK(std::memcmp(xs[b].qs, xr[b].qs, 32) == 0);
                    if (b % 2 == 0) { // the pair's int16 halves: this block's sum, the next one's
                        CHECK(int16_t(xr[b].sum_pair & 0xFFFF) == xr[b].sum);
                        CHECK((xr[b].sum_pair >> 16) == xr[b + 1].sum);
                    }
                }
                for (size_t s0 = 0; s0 < xr.size(); s0 += 8) {
                    int most = 0;
                    for (size_t b = s0; b < s0 + 8; ++b) {
                        for (int8_t v : xr[b].qs) most = std::max(most, std::abs(int(v)));
                    }
                    CHECK(most == 127);
                }
            }
            // eight quantised activation vectors for the integer tiles (up to four for q8_0 and
            // q4_0, up to eight for the interleaved types), and their values
            auto xa = random_vec(size_t(8 * n), 43 + n, 3.0f);
            std::vector<block_q8_x> xqa(size_t(8 * n / 32));
            ref.quantize_x(xa.data(), xqa.data(), 8 * n);
            std::vector<float> xva(size_t(8 * n));
            for (int64_t i = 0; i < 8 * n; ++i) xva[size_t(i)] = xqa[size_t(i / 32)].d * xqa[size_t(i / 32)].qs[i % 32];
            // the same with one scale per 256 values, for q4_k, q5_k and iq4_xs (superblock_activations)
            std::vector<block_q8_x> xqa_k(xqa.size());
            std::vector<float> xva_k(xva.size());
            if (n % 256 == 0) {
                ref.quantize_x_k(xa.data(), xqa_k.data(), 8 * n);
                for (int64_t i = 0; i < 8 * n; ++i)
                    xva_k[size_t(i)] = xqa_k[size_t(i / 32)].d * xqa_k[size_t(i / 32)].qs[i % 32];
            }
            const auto acts = [&](dtype t) { return superblock_activations(t) ? xqa_k.data() : xqa.data(); };
            const auto values = [&](dtype t) { return superblock_activations(t) ? xva_k.data() : xva.data(); };
            for (dtype t : {dtype::q8_0, dtype::q4_0}) {
                CAPTURE(format::dtype_name(t));
                auto q = quantize(t, w, 1, n);
                std::vector<float> stored(static_cast<size_t>(n));
                format::row_to_f32(t, q.data(), stored.data(), n);
                auto f_dot = t == dtype::q8_0 ? ref.dot_q8_0_f32 : ref.dot_q4_0_f32;
                auto f_simd = t == dtype::q8_0 ? simd->dot_q8_0_f32 : simd->dot_q4_0_f32;
                const double tol = dot_tolerance(stored.data(), x.data(), n, 1e-5);
                CHECK(std::fabs(f_simd(q.data(), x.data(), n) - f_dot(q.data(), x.data(), n)) <= tol);
                // integer tiles: four different rows (a stride apart, or one row repeated with
                // stride 0) by 1-4 vectors, bit-identical to the reference and within rounding of
                // the exact dot of the stored and quantised values
                auto w4 = random_vec(size_t(4 * n), 44 + n, 2.0f);
                auto q4 = quantize(t, w4, 4, n);
                const size_t rb = format::row_bytes(t, n);
                std::vector<float> stored4(size_t(4 * n));
                for (int r = 0; r < 4; ++r) format::row_to_f32(t, q4.data() + r * rb, stored4.data() + r * n, n);
                auto tile_ref = t == dtype::q8_0 ? ref.tile_q8_0 : ref.tile_q4_0;
                auto tile_simd = t == dtype::q8_0 ? simd->tile_q8_0 : simd->tile_q4_0;
                for (size_t stride : {rb, size_t(0)}) {
                    for (int n_tok = 1; n_tok <= 4; ++n_tok) {
                        CAPTURE(stride);
                        CAPTURE(n_tok);
                        float want[16], got[16];
                        tile_ref(q4.data(), stride, xqa.data(), size_t(n / 32), n_tok, n, want);
                        tile_simd(q4.data(), stride, xqa.data(), size_t(n / 32), n_tok, n, got);
                        for (int k = 0; k < n_tok; ++k) {
                            for (int r = 0; r < 4; ++r) {
                                CHECK(got[4 * k + r] == want[4 * k + r]);
                                const float* row = stored4.data() + (stride == 0 ? 0 : r) * n;
                                const float* xk = xva.data() + k * n;
                                double exact = 0;
                                for (int64_t i = 0; i < n; ++i) exact += double(row[i]) * xk[i];
                                CHECK(std::fabs(want[4 * k + r] - exact) <= dot_tolerance(row, xk, n, 1e-5));
                            }
                        }
                    }
                }
                // four rows a stride apart: the same four results as one row at a time
                std::vector<uint8_t> rows4;
                const size_t stride = q.size() * 3; // rows 0, 3, 6, 9 of a 10-row buffer
                rows4.resize(stride * 3 + q.size());
                for (int k = 0; k < 4; ++k) std::memcpy(rows4.data() + k * stride, q.data(), q.size());
                auto d4 = t == dtype::q8_0 ? simd->dot4_q8_0_f32 : simd->dot4_q4_0_f32;
                float out[4];
                d4(rows4.data(), stride, x.data(), n, out);
                for (float o : out) CHECK(std::fabs(o - f_dot(q.data(), x.data(), n)) <= tol);
                // one row with four activation vectors: bit-identical to one vector at a time
                auto dx4 = t == dtype::q8_0 ? simd->dotx4_q8_0_f32 : simd->dotx4_q4_0_f32;
                dx4(q.data(), xa.data(), size_t(n), n, out);
                for (int k = 0; k < 4; ++k) CHECK(out[k] == f_simd(q.data(), xa.data() + k * n, n));
            }
            // K-quants: four rows (a stride apart, or one repeated) by 1-4 vectors, bit-identical
            // to the reference and within rounding of the exact dot of the stored values
            for (dtype t : {dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::iq4_nl,
                            dtype::iq4_xs, dtype::q2_k, dtype::q3_k}) {
                if (n % format::block_elements(t) != 0) continue;
                CAPTURE(format::dtype_name(t));
                const auto q4 = test::random_k_rows(t, 4, n, 46 + uint64_t(n));
                const size_t rb = format::row_bytes(t, n);
                std::vector<float> stored4(size_t(4 * n));
                for (int r = 0; r < 4; ++r) format::row_to_f32(t, q4.data() + r * rb, stored4.data() + r * n, n);
                const auto pick = [&](const kernel_table& k) { return int8_tile(k, t); };
                for (size_t stride : {rb, size_t(0)}) {
                    for (int n_tok = 1; n_tok <= 4; ++n_tok) {
                        CAPTURE(stride);
                        CAPTURE(n_tok);
                        float want[16], got[16];
                        pick(ref)(q4.data(), stride, acts(t), size_t(n / 32), n_tok, n, want);
                        pick (*simd)(q4.data(), stride, acts(t), size_t(n / 32), n_tok, n, got);
                        for (int k = 0; k < n_tok; ++k) {
                            for (int r = 0; r < 4; ++r) {
                                CHECK(got[4 * k + r] == want[4 * k + r]);
                                const float* row = stored4.data() + (stride == 0 ? 0 : r) * n;
                                const float* xk = values(t) + k * n;
                                double exact = 0;
                                for (int64_t i = 0; i < n; ++i) exact += double(row[i]) * xk[i];
                                CHECK(std::fabs(want[4 * k + r] - exact) <= dot_tolerance(row, xk, n, 1e-5));
                            }
                        }
                    }
                }
            }
            // the interleaved types: four groups of eight rows (and the first again), every count
            // of groups and tokens the tiles take, bit-identical to the reference and within
            // rounding of the exact dot of the stored values
            for (dtype t :
                 {dtype::q4_0x8, dtype::q8_0x8, dtype::q4_kx8, dtype::q5_kx8, dtype::q6_kx8, dtype::iq4_xsx8,
                  dtype::q4_1x8, dtype::q5_0x8, dtype::q5_1x8, dtype::iq4_nlx8, dtype::q2_kx8, dtype::q3_kx8}) {
                if (format::row_bytes(t, uint64_t(n)) == 0) continue;
                CAPTURE(format::dtype_name(t));
                const dtype plain = format::row_type(t);
                auto w32 = random_vec(size_t(32 * n), 45 + n, 2.0f);
                const auto q32 = format::is_k_quant(plain) || format::is_read_only(plain)
                                     ? test::random_k_rows(plain, 32, n, 45 + uint64_t(n))
                                     : quantize(plain, w32, 32, n);
                const size_t rb = format::row_bytes(t, n), gb = 8 * rb;
                std::vector<uint8_t> x8(5 * gb);
                format::interleave_x8(t, q32.data(), 32, uint64_t(n), x8.data());
                std::memcpy(x8.data() + 4 * gb, x8.data(), gb);
                std::vector<float> stored32(size_t(32 * n));
                std::vector<uint8_t> row(rb);
                for (int r = 0; r < 32; ++r) {
                    format::x8_row(t, x8.data(), uint64_t(n), uint64_t(r), row.data());
                    CHECK(std::memcmp(row.data(), q32.data() + r * rb, rb) == 0);
                    format::row_to_f32(t, row.data(), stored32.data() + r * n, n);
                }
                const auto tile_ref = int8_x8_kernels(ref, t).tile, tile_simd = int8_x8_kernels(*simd, t).tile;
                // decode's four streams: groups anywhere (the fifth is the first), each with its
                // own activations or all with the same, as each group alone
                const auto streams_ref = int8_x8_kernels(ref, t).streams,
                           streams_simd = int8_x8_kernels(*simd, t).streams;
                for (bool own_x : {true, false}) {
                    CAPTURE(own_x);
                    const int order[4] = {3, 0, 4, 1}; // groups
                    const void* groups[4];
                    const block_q8_x* stream_x[4];
                    for (int s = 0; s < 4; ++s) {
                        groups[s] = x8.data() + size_t(order[s]) * gb;
                        stream_x[s] = acts(t) + size_t(own_x ? 7 - 2 * s : 5) * size_t(n / 32);
                    }
                    float want[32], got[32], alone[8];
                    streams_ref(groups, stream_x, n, want);
                    streams_simd(groups, stream_x, n, got);
                    for (int s = 0; s < 4; ++s) {
                        tile_ref(groups[s], 0, 1, stream_x[s], 0, 1, n, true, alone);
                        for (int r = 0; r < 8; ++r) {
                            CHECK(want[s * 8 + r] == alone[r]);
                            CHECK(got[s * 8 + r] == alone[r]);
                        }
                    }
                }
                for (int n_tok = 1; n_tok <= 8; ++n_tok) {
                    for (int n_groups = 1; n_groups <= 4; ++n_groups) {
                        for (size_t stride : {gb, gb * size_t(4 / n_groups), size_t(0)}) {
                            CAPTURE(n_tok);
                            CAPTURE(n_groups);
                            CAPTURE(stride);
                            float want[256], got[256];
                            // the prefetches (once) differ, never the sums
                            const bool once = n_groups % 2 == 0;
                            tile_ref(x8.data(), stride, n_groups, acts(t), size_t(n / 32), n_tok, n, once, want);
                            tile_simd(x8.data(), stride, n_groups, acts(t), size_t(n / 32), n_tok, n, once, got);
                            for (int k = 0; k < n_tok; ++k) {
                                for (int g = 0; g < n_groups; ++g) {
                                    for (int r = 0; r < 8; ++r) {
                                        const int i = (k * n_groups + g) * 8 + r;
                                        CHECK(got[i] == want[i]);
                                        const size_t group =
                                            (size_t(g) * stride / gb) % 4; // the fifth group is the first
                                        const float* wr = stored32.data() + (group * 8 + size_t(r)) * size_t(n);
                                        const float* xk = values(t) + k * n;
                                        double exact = 0;
                                        for (int64_t c = 0; c < n; ++c) exact += double(wr[c]) * xk[c];
                                        CHECK(std::fabs(want[i] - exact) <= dot_tolerance(wr, xk, n, 1e-5));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for (int64_t n : {1, 7, 33, 1000, 4099}) {
            CAPTURE(n);
            auto w = random_vec(size_t(n), 51 + n), x = random_vec(size_t(n), 52 + n);
            const double tol = dot_tolerance(w.data(), x.data(), n, 1e-5);
            CHECK(std::fabs(simd->dot_f32(w.data(), x.data(), n) - ref.dot_f32(w.data(), x.data(), n)) <= tol);
            // one row with four vectors (n + 3 apart): each the bits of dot_f32 alone
            const auto x4 = random_vec(size_t(4 * (n + 3)), 53 + n);
            float out4[4];
            simd->dotx4_f32(w.data(), x4.data(), size_t(n + 3), n, out4);
            for (int k = 0; k < 4; ++k) CHECK(out4[k] == simd->dot_f32(w.data(), x4.data() + k * (n + 3), n));
            // four rows (n + 5 apart) with one vector: each the bits of dot_f32 alone
            const auto w4 = random_vec(size_t(4 * (n + 5)), 54 + n);
            simd->dot4_f32(w4.data(), size_t(n + 5), x.data(), n, out4);
            for (int k = 0; k < 4; ++k) CHECK(out4[k] == simd->dot_f32(w4.data() + k * (n + 5), x.data(), n));
            for (dtype t : {dtype::f16, dtype::bf16}) {
                auto q = quantize(t, w, 1, n);
                auto r = t == dtype::f16 ? ref.dot_f16 : ref.dot_bf16;
                auto v = t == dtype::f16 ? simd->dot_f16 : simd->dot_bf16;
                CHECK(std::fabs(v(q.data(), x.data(), n) - r(q.data(), x.data(), n)) <= tol);
            }
        }
    }
}
