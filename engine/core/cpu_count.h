#pragma once

#include <string>

namespace colibri {

/// CPUs this process may actually use: its affinity mask, capped by the CPU quota of its
/// cgroup and of every cgroup above it (cgroup v2 cpu.max, v1 cpu.cfs_quota_us over
/// cpu.cfs_period_us), rounded up, at least 1.
int usable_cpu_count();

/// The tightest CPU quota on the process's cgroup and its ancestors, in CPUs; 0 when none
/// is set or none can be read. `root` prefixes every path read (/proc/self/mountinfo,
/// /proc/self/cgroup and the cgroup files): empty for the real system, a directory that
/// mimics it in tests.
double cgroup_cpu_quota(const std::string& root = "");

} // namespace colibri
