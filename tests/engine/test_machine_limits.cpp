// The benchmark's read-bandwidth probe.

#include "kernel_test_util.h"

TEST_CASE("the read pass sums every word of its range whatever the number of streams") {
    constexpr size_t bytes = 64 * 8 * 37; // 37 steps of every stream count
    alignas(32) std::array<uint64_t, bytes / 8> words{};
    uint64_t expected = 0;
    for (size_t i = 0; i < words.size(); ++i) expected += (words[i] = 0x9E3779B97F4A7C15ull * (i + 1));
    for (const kernel_table* kt : all_tables()) {
        for (int streams : {1, 2, 4, 8}) {
            CAPTURE(kt->name);
            CAPTURE(streams);
            CHECK(kt->read_sum(words.data(), bytes, streams) == expected);
        }
    }
}

TEST_CASE("the read probe keeps a buffer of whole 1 MiB chunks per thread and measures it again and again") {
    constexpr size_t mib = size_t(1) << 20;
    read_probe two(2, 5 * mib + 3, best_kernel_table());
    CHECK(two.bytes() == 4 * mib); // two chunks per thread
    read_probe three(3, 1, best_kernel_table());
    CHECK(three.bytes() == 3 * mib); // at least one each
    for (int i = 0; i < 3; ++i) {
        const double rate = two.measure(2);
        CHECK(rate > 1e8); // bytes/s: memory (or caches, for buffers this small) reads faster than 100 MB/s
        CHECK(rate < 1e13);
    }
    CHECK(three.measure(1) > 1e8);
    CHECK(two.measure(0) == 0.0); // no pass, no rate
}
