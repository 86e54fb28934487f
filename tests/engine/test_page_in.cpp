// The background page-in maps a file's pages into the process, and a file cut short under
// it ends the walk quietly instead of crashing the process.

#include "api/runtime.h"
#include "convert/convert.h"
#include "core/mapped_file.h"
#include "core/page_in.h"
#include "test_util.h"

#include <doctest/doctest.h>
#include <filesystem>
#include <string>
#include <unistd.h>

using namespace colibri;
using namespace colibri::test;

namespace {

// Kilobytes of the mapping that holds addr mapped into this process.
long mapped_kib(const void* addr) {
    const long kib = mapping_kib(addr, "Rss");
    REQUIRE(kib >= 0);
    return kib;
}

// More than one step of the walk (8 MiB), ending in a partial page.
constexpr size_t file_bytes = (size_t(9) << 20) + 100;

} // namespace

TEST_CASE("a page-in maps every page of the file into the process, by madvise or by reading each page") {
    temp_dir dir;
    const std::string path = dir.file("weights");
    std::vector<uint8_t> bytes(file_bytes);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 131 >> 7);
    write_bytes(path, bytes);
    const long page_kib = ::sysconf(_SC_PAGESIZE) / 1024;
    const long all_kib = long((file_bytes + size_t(page_kib) * 1024 - 1) / (size_t(page_kib) * 1024)) * page_kib;
    for (const auto how : {page_in::method::populate, page_in::method::touch}) {
        CAPTURE(int(how));
        mapped_file m(path); // a new mapping: none of its pages mapped in yet
        CHECK(mapped_kib(m.data()) == 0);
        page_in p(m.data(), m.size(), how);
        p.wait();
        CHECK(p.done());
        CHECK(p.bytes() == file_bytes);
        CHECK(mapped_kib(m.data()) == all_kib);
        CHECK(std::equal(bytes.begin(), bytes.end(), m.data())); // the pages read what the file holds
    }
}

TEST_CASE("a page-in over a file cut short after it was mapped stops where the file ends") {
    temp_dir dir;
    const std::string path = dir.file("weights");
    write_bytes(path, std::vector<uint8_t>(file_bytes, 7));
    mapped_file m(path);
    std::filesystem::resize_file(path, size_t(3) << 20); // what another process may do to a model in use
    page_in p(m.data(), m.size());
    p.wait();
    CHECK(p.done());
    // the steps before the one that met the end: none past it
    CHECK(p.bytes() == 0);
    CHECK(mapped_kib(m.data()) <= 3 * 1024);
}

TEST_CASE("a model's page-in starts only when the file fits in the memory available") {
    temp_dir dir;
    const std::string path = dir.file("m.colibri");
    write_random_model(small_random_model(), path, format::dtype::q8_0, {});
    const uint64_t size = std::filesystem::file_size(path);
    {
        auto rt = load_runtime(path, "cpu", 1);
        CHECK_FALSE(start_page_in(*rt, size - 1)); // larger than what is available
        CHECK(rt->paging == nullptr);
        CHECK(mapped_kib(rt->mdl->file().bytes().data()) < long(size / 1024)); // only what loading read
    }
    for (const uint64_t available : {size, uint64_t(0)}) { // exactly fits; unknown
        CAPTURE(available);
        auto rt = load_runtime(path, "cpu", 1);
        REQUIRE(start_page_in(*rt, available));
        rt->paging->wait();
        CHECK(rt->paging->bytes() == size);
        CHECK(mapped_kib(rt->mdl->file().bytes().data()) * 1024 >= long(size));
    }
    CHECK(available_memory() > 0); // this machine's /proc/meminfo
}
