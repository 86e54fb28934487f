// The CPU quota that caps the default thread count, read from cgroup trees laid out as
// systemd, a container and cgroup v1 lay them out.

#include "core/cpu_count.h"
#include "test_util.h"

#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <sched.h>
#include <string>
#include <utility>
#include <vector>

using namespace colibri;
using namespace colibri::test;

namespace {

// A file under the fake root, its directories made as needed.
void put(const temp_dir& root, const std::string& rel, const std::string& text) {
    const std::filesystem::path p = root.file(rel);
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
}

const char* const v2_mount =
    "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
const char* const other_mounts = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                                 "25 22 0:5 / /proc rw,nosuid shared:12 - proc proc rw\n";

} // namespace

// A cgroup tree: /proc/self/mountinfo, /proc/self/cgroup, then files under the root.
struct tree {
    const char* what;
    std::string mountinfo, cgroup;
    std::vector<std::pair<std::string, std::string>> files;
    double quota;
};

TEST_CASE("the CPU quota is the tightest on the process's cgroup and the cgroups above it") {
    const std::string v1_mounts =
        std::string(other_mounts) +
        "31 24 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
        "32 24 0:28 / /sys/fs/cgroup/cpuset rw,nosuid shared:10 - cgroup cgroup rw,cpuset\n";
    const tree trees[] = {
        {"a systemd service on cgroup v2, its own quota",
         std::string(other_mounts) + v2_mount,
         "0::/system.slice/colibrid.service\n",
         {{"sys/fs/cgroup/cpu.max", "max 100000\n"}, // what a root cgroup never has, harmless
          {"sys/fs/cgroup/system.slice/cpu.max", "max 100000\n"},
          {"sys/fs/cgroup/system.slice/colibrid.service/cpu.max", "150000 100000\n"}},
         1.5},
        {"the slice above it tighter",
         v2_mount,
         "0::/system.slice/colibrid.service\n",
         {{"sys/fs/cgroup/system.slice/cpu.max", "50000 100000\n"},
          {"sys/fs/cgroup/system.slice/colibrid.service/cpu.max", "300000 100000\n"}},
         0.5},
        {"a container whose cgroup namespace shows its cgroup as the root",
         v2_mount,
         "0::/\n",
         {{"sys/fs/cgroup/cpu.max", "200000 100000\n"}},
         2.0},
        {"a mount of part of the tree: the path below the mount's root",
         "30 24 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
         "0::/kubepods/pod1/c1\n",
         {{"sys/fs/cgroup/cpu.max", "250000 100000\n"}, {"sys/fs/cgroup/c1/cpu.max", "300000 100000\n"}},
         2.5},
        {"cgroup v1, the cpu controller mounted with cpuacct",
         v1_mounts,
         "5:cpuset:/\n4:cpu,cpuacct:/user.slice\n0::/user.slice\n",
         {{"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"},
          {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"},
          {"sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_quota_us", "150000\n"},
          {"sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_period_us", "100000\n"}},
         1.5},
        {"no quota anywhere",
         v2_mount,
         "0::/user.slice/user-1000.slice\n",
         {{"sys/fs/cgroup/user.slice/cpu.max", "max 100000\n"}},
         0.0},
        {"a quota that cannot be read",
         v2_mount,
         "0::/user.slice/user-1000.slice\n",
         {{"sys/fs/cgroup/user.slice/user-1000.slice/cpu.max", "lots 100000\n"}},
         0.0},
        {"one that cannot be read below one that can",
         v2_mount,
         "0::/user.slice/user-1000.slice\n",
         {{"sys/fs/cgroup/user.slice/cpu.max", "100000 100000\n"},
          {"sys/fs/cgroup/user.slice/user-1000.slice/cpu.max", "lots 100000\n"}},
         1.0},
    };
    for (const tree& t : trees) {
        CAPTURE(t.what);
        temp_dir root;
        put(root, "proc/self/mountinfo", t.mountinfo);
        put(root, "proc/self/cgroup", t.cgroup);
        for (const auto& [path, text] : t.files) put(root, path, text);
        CHECK(cgroup_cpu_quota(root.file("")) == doctest::Approx(t.quota));
    }
    temp_dir empty; // no procfs at all
    CHECK(cgroup_cpu_quota(empty.file("")) == 0.0);
}

TEST_CASE("the default thread count is at least one and at most the CPUs the process may run on") {
    const int n = usable_cpu_count();
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
    CHECK(n >= 1);
    CHECK(n <= CPU_COUNT(&set));
}
