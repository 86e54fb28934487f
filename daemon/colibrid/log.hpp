#pragma once
/// One named spdlog logger per module, sharing the default logger's sinks and level.

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace colibri::daemon {

inline std::shared_ptr<spdlog::logger> module_logger(const std::string& name) {
    if (auto log = spdlog::get(name)) return log;
    auto log = spdlog::default_logger()->clone(name);
    spdlog::register_logger(log);
    return log;
}

} // namespace colibri::daemon
