#include "core/cpu_count.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sched.h>
#include <string>
#include <thread>

namespace colibri {

namespace {

// Quota in CPUs from the cgroup the process lives in; 0 when unlimited or unknown.
double cgroup_cpu_quota() {
    {
        std::ifstream f("/sys/fs/cgroup/cpu.max"); // cgroup v2: "<quota|max> <period>"
        std::string quota;
        double period = 0;
        if (f >> quota >> period && quota != "max" && period > 0) {
            return std::stod(quota) / period;
        }
    }
    std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); // cgroup v1
    std::ifstream p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    double quota = 0, period = 0;
    if (q >> quota && p >> period && quota > 0 && period > 0) return quota / period;
    return 0;
}

} // namespace

int usable_cpu_count() {
    int n = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    double quota = 0;
    try {
        quota = cgroup_cpu_quota();
    } catch (...) { // malformed cgroup file: ignore the quota
        quota = 0;
    }
    if (quota > 0) n = std::min(n, std::max(1, static_cast<int>(std::ceil(quota))));
    return std::max(1, n);
}

} // namespace colibri
