#pragma once
/// Owns one engine worker process: its pid (killed and reaped on destruction) and, until
/// the channel takes it, the supervisor's end of the socketpair the worker reads as fd 3.

#include <sys/types.h>

#include <string>
#include <vector>

namespace colibri::daemon {

/// How to start the worker: executable and arguments (spawn appends --fd 3).
struct worker_launch {
    std::string exe;
    std::vector<std::string> args;
};

/// Human description of a wait() status: "exited with status 3", "killed by signal 11 (SIGSEGV)".
std::string describe_exit_status(int status);

class worker_process {
public:
    /// Forks and execs `launch` with a scrubbed environment (no systemd variables) and
    /// its end of a new socketpair as fd 3. Throws std::system_error when no process
    /// could be started (out of descriptors, fork failed). A failed exec still gives a
    /// process (it exits with 127): see exec_error().
    static worker_process spawn(const worker_launch& launch);

    worker_process() = default;
    worker_process(worker_process&& other) noexcept;
    worker_process& operator=(worker_process&& other) noexcept;
    worker_process(const worker_process&) = delete;
    worker_process& operator=(const worker_process&) = delete;
    /// SIGKILLs and reaps a child that is still running.
    ~worker_process();

    /// -1 when there is no process (none started, or already reaped).
    pid_t pid() const { return pid_; }
    bool running() const { return pid_ > 0; }
    /// errno of the child's failed execve, 0 when the worker program is running.
    int exec_error() const { return exec_errno_; }

    /// Hands over the supervisor's end of the socketpair (-1 if already taken).
    int take_socket();
    /// SIGKILL, when running. The exit is collected by whoever waits for SIGCHLD.
    void kill() const;
    /// wait() has collected the child elsewhere: forget its pid so nothing signals a reused one.
    void reaped() { pid_ = -1; }

private:
    void reset() noexcept;

    pid_t pid_ = -1;
    int socket_fd_ = -1;
    int exec_errno_ = 0;
};

} // namespace colibri::daemon
