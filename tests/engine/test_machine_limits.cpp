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

TEST_CASE("a CPUID signature decodes to the family, model and core the vendors name") {
    struct known {
        unsigned eax, family, model, stepping;
        const char* amd_core;
    };
    const known cpus[] = {
        {0x00A10F11, 25, 17, 1, "Zen 4"}, // EPYC 9004 (Genoa)
        {0x00B00F21, 26, 2, 1, "Zen 5"},  // EPYC 9005 (Turin)
        {0x00A00F11, 25, 1, 1, "Zen 3"},  // EPYC 7003 (Milan)
        {0x00A60F12, 25, 97, 2, "Zen 4"}, // Ryzen 7000 (Raphael)
        {0x00830F10, 23, 49, 0, "Zen 2"}, // EPYC 7002 (Rome)
        {0x00800F12, 23, 1, 2, "Zen"},    // EPYC 7001 (Naples)
        {0x000806F8, 6, 143, 8, nullptr}, // Xeon Sapphire Rapids
        {0x00050654, 6, 85, 4, nullptr},  // Xeon Skylake-SP
    };
    for (const known& k : cpus) {
        CAPTURE(k.eax);
        const cpu_signature s = decode_cpu_signature(k.eax);
        CHECK(s.family == k.family);
        CHECK(s.model == k.model);
        CHECK(s.stepping == k.stepping);
        if (k.amd_core != nullptr) CHECK(amd_core_name(s.family, s.model) == k.amd_core);
    }
    CHECK(amd_core_name(6, 85).empty());
    CHECK_FALSE(cpu_description().empty());
}
