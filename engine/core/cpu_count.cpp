#include "core/cpu_count.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sched.h>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace colibri {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, sep);) out.push_back(item);
    return out;
}

// Where the cgroup hierarchy that holds the quota is mounted, from /proc/self/mountinfo:
// the cgroup2 mount (v2), or the v1 mount whose controllers include cpu. Its mount point,
// and the cgroup path its root stands for (not "/" inside a cgroup namespace that mounted
// its own part of the tree). False when there is none.
bool cgroup_mount(const std::string& root, bool v2, std::string& mount_point, std::string& mount_root) {
    std::ifstream f(root + "/proc/self/mountinfo");
    for (std::string line; std::getline(f, line);) {
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        const auto fields = split(line, ' ');
        const auto dash = std::find(fields.begin(), fields.end(), "-");
        if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
        const std::string& fstype = dash[1];
        const auto opts = split(dash[3], ',');
        if (v2 ? fstype == "cgroup2" : fstype == "cgroup" && std::find(opts.begin(), opts.end(), "cpu") != opts.end()) {
            mount_root = fields[3];
            mount_point = fields[4];
            return true;
        }
    }
    return false;
}

// The process's path in the v2 hierarchy ("0::/path") or in the v1 hierarchy that holds
// the cpu controller ("N:cpu,cpuacct:/path"), from /proc/self/cgroup.
bool cgroup_path(const std::string& root, bool v2, std::string& path) {
    std::ifstream f(root + "/proc/self/cgroup");
    for (std::string line; std::getline(f, line);) {
        const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) continue;
        const auto controllers = split(line.substr(a + 1, b - a - 1), ',');
        const bool match = v2 ? line.compare(0, a, "0") == 0 && controllers.empty()
                              : std::find(controllers.begin(), controllers.end(), "cpu") != controllers.end();
        if (match) {
            path = line.substr(b + 1);
            return true;
        }
    }
    return false;
}

// One cgroup's quota in CPUs; 0 when unlimited or unreadable.
double quota_at(const std::string& dir, bool v2) {
    if (v2) {
        std::ifstream f(dir + "/cpu.max"); // "<quota|max> <period>"
        std::string quota;
        double period = 0;
        if (!(f >> quota >> period) || period <= 0) return 0;
        char* end = nullptr;
        const double q = std::strtod(quota.c_str(), &end); // "max" (or anything else unreadable): none
        return end != quota.c_str() && *end == '\0' && q > 0 ? q / period : 0;
    }
    std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us"); // quota -1: unlimited
    double quota = 0, period = 0;
    if (q >> quota && p >> period && quota > 0 && period > 0) return quota / period;
    return 0;
}

// The tightest quota from the process's cgroup up to the top of what is mounted.
double hierarchy_quota(const std::string& root, bool v2) {
    std::string mount_point, mount_root, path;
    if (!cgroup_mount(root, v2, mount_point, mount_root) || !cgroup_path(root, v2, path)) return 0;
    // the part of the path below the mount's root ("/" in a namespace that mounted only its part)
    if (mount_root != "/") {
        const bool below = path.compare(0, mount_root.size(), mount_root) == 0 &&
                           (path.size() == mount_root.size() || path[mount_root.size()] == '/');
        if (!below) return 0;
        path = path.substr(mount_root.size());
    }
    double best = 0;
    for (;;) {
        const double q = quota_at(root + mount_point + (path == "/" ? "" : path), v2);
        if (q > 0) best = best > 0 ? std::min(best, q) : q;
        if (path.empty() || path == "/") break;
        path = path.substr(0, path.find_last_of('/'));
    }
    return best;
}

} // namespace

double cgroup_cpu_quota(const std::string& root) {
    const double v2 = hierarchy_quota(root, true), v1 = hierarchy_quota(root, false);
    if (v2 > 0 && v1 > 0) return std::min(v2, v1);
    return std::max(v2, v1);
}

int usable_cpu_count() {
    int n = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    const double quota = cgroup_cpu_quota();
    if (quota > 0) n = std::min(n, std::max(1, static_cast<int>(std::ceil(quota))));
    return std::max(1, n);
}

} // namespace colibri
