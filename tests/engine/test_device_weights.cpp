// The device layout of the weights (cuda/device_weights.h), on any machine: every type
// repacks to exactly the values the CPU reads from the file.

#include "cuda/device_weights.h"
#include "device_test_util.h"
#include "format/row_codec.h"

#include <doctest/doctest.h>

#include <cstring>

using namespace colibri;

TEST_CASE("GGUF's types repack for the device to the values the CPU reads") {
    for (format::dtype type : test::device_gguf_types) {
        CAPTURE(format::dtype_name(type));
        const int64_t rows = 16, cols = 512;
        const test::test_matrix m = test::make_matrix(type, rows, cols, 9);
        const packed_weights p = pack_for_device(m.view);
        CHECK(packed_bytes(m.view) == p.values.size() + p.scales.size() * sizeof(float));
        CHECK(packed_scale_bytes(m.view) == p.scales.size() * sizeof(float));
        CHECK(p.scales.size() == size_t(rows * cols / 32 * scale_floats(p.kind)));
        CHECK(scale_floats(p.kind) > 0);
        CHECK(p.row_value_bytes() % 16 == 0);
        const format::dtype plain = format::row_type(type);
        std::vector<uint8_t> row(format::row_bytes(plain, uint64_t(cols)));
        std::vector<float> want(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
            if (format::is_interleaved(type))
                format::x8_row(type, m.view.data, uint64_t(cols), uint64_t(r), row.data());
            else std::memcpy(row.data(), m.view.data + r * int64_t(row.size()), row.size());
            format::row_to_f32(plain, row.data(), want.data(), cols);
            packed_row_to_f32(p, r, got.data());
            CAPTURE(r);
            int differ = 0; // equal values (a zero's sign aside: the layouts add a min of 0)
            for (int64_t c = 0; c < cols; ++c) differ += want[size_t(c)] != got[size_t(c)];
            CHECK(differ == 0);
        }
    }
}

TEST_CASE("every weight type repacks for the device to the values the CPU reads") {
    for (format::dtype type : test::device_test_types) {
        CAPTURE(format::dtype_name(type));
        const test::test_matrix m = test::make_matrix(type, 16, 96, 7);
        const packed_weights p = pack_for_device(m.view);
        CHECK(packed_bytes(m.view) == p.values.size() + p.scales.size() * sizeof(float));
        CHECK(p.rows == 16);
        CHECK(p.cols == 96);
        CHECK(p.values.size() == size_t(16 * p.row_value_bytes()));
        const bool quantised = p.kind == device_kind::q8 || p.kind == device_kind::q4;
        CHECK(p.scales.size() == (quantised ? size_t(16 * 3) : 0));
        CHECK(p.row_value_bytes() % 16 == 0); // rows start on 16-byte boundaries
        const format::dtype plain = format::row_type(type);
        std::vector<uint8_t> row(format::row_bytes(plain, 96));
        std::vector<float> want(96), got(96);
        for (int64_t r = 0; r < 16; ++r) {
            if (format::is_interleaved(type)) format::x8_row(type, m.view.data, 96, uint64_t(r), row.data());
            else std::memcpy(row.data(), m.view.data + r * row.size(), row.size());
            format::row_to_f32(plain, row.data(), want.data(), 96);
            packed_row_to_f32(p, r, got.data());
            CAPTURE(r);
            CHECK(std::memcmp(want.data(), got.data(), sizeof(float) * 96) == 0);
        }
    }
}
