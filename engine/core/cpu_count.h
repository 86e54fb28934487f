#pragma once

namespace colibri {

/// CPUs this process may actually use: its affinity mask, capped by a cgroup CPU quota
/// (cgroup v2 cpu.max or v1 cfs_quota_us/cfs_period_us), at least 1.
int usable_cpu_count();

} // namespace colibri
