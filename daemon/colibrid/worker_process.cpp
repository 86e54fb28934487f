// The worker process: fork/exec with the socketpair on fd 3, and the pid's lifetime.
#include "worker_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>
#include <utility>

#include "sd_notify.hpp"

namespace colibri::daemon {

namespace {

/// Closes a descriptor on every path out of spawn().
class unique_fd {
public:
    explicit unique_fd(int fd = -1) : fd_(fd) {}
    unique_fd(const unique_fd&) = delete;
    unique_fd& operator=(const unique_fd&) = delete;
    ~unique_fd() { close(); }
    int get() const { return fd_; }
    int release() { return std::exchange(fd_, -1); }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_;
};

} // namespace

std::string describe_exit_status(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char* abbrev = ::sigabbrev_np(sig);
        return "killed by signal " + std::to_string(sig) +
               (abbrev ? std::string(" (SIG") + abbrev + ")" : std::string());
    }
    return "ended with wait status " + std::to_string(status);
}

worker_process worker_process::spawn(const worker_launch& launch) {
    // Everything the child needs is prepared before fork(): the child only calls
    // async-signal-safe functions.
    std::vector<std::string> args;
    args.push_back(launch.exe);
    args.insert(args.end(), launch.args.begin(), launch.args.end());
    args.push_back("--fd");
    args.push_back("3");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // systemd's notification and activation variables are for the supervisor alone: a
    // worker must never be able to report READY or WATCHDOG in its place.
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) {
        const std::string_view var(*e);
        bool keep = true;
        for (const char* name : service_environment_variables) {
            const std::string_view n(name);
            if (var.size() > n.size() && var.compare(0, n.size(), n) == 0 && var[n.size()] == '=') keep = false;
        }
        if (keep) envp.push_back(*e);
    }
    envp.push_back(nullptr);

    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        throw std::system_error(errno, std::generic_category(), "cannot create the worker socketpair");
    unique_fd ours(sv[0]), theirs(sv[1]);
    int exec_pipe[2];
    if (::pipe2(exec_pipe, O_CLOEXEC) != 0)
        throw std::system_error(errno, std::generic_category(), "cannot create the worker socketpair");
    unique_fd exec_read(exec_pipe[0]), exec_write(exec_pipe[1]);

    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::close(sv[0]);
        ::close(exec_pipe[0]);
        if (sv[1] == 3) ::fcntl(3, F_SETFD, 0);
        else ::dup2(sv[1], 3); // dup2 clears FD_CLOEXEC on the copy
        if (exec_pipe[1] != 4) {
            ::dup2(exec_pipe[1], 4);
            ::fcntl(4, F_SETFD, FD_CLOEXEC);
        }
        ::dup2(2, 1); // stray prints from the engine go to the log, never to a client
        ::close_range(5, ~0U, 0);
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::signal(SIGPIPE, SIG_DFL);
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(1);
        ::execve(argv[0], argv.data(), envp.data());
        const int err = errno;
        (void)!::write(4, &err, sizeof(err));
        ::_exit(127);
    }
    const int fork_errno = errno;
    theirs.close();
    exec_write.close();
    if (pid < 0) throw std::system_error(fork_errno, std::generic_category(), "cannot fork the worker");

    worker_process proc;
    proc.pid_ = pid;
    proc.socket_fd_ = ours.release();
    // The pipe closes on a successful exec; on failure the child writes errno first.
    int exec_errno = 0;
    ssize_t n;
    do n = ::read(exec_read.get(), &exec_errno, sizeof(exec_errno));
    while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(sizeof(exec_errno))) proc.exec_errno_ = exec_errno;
    return proc;
}

worker_process::worker_process(worker_process&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), socket_fd_(std::exchange(other.socket_fd_, -1)),
      exec_errno_(std::exchange(other.exec_errno_, 0)) {}

worker_process& worker_process::operator=(worker_process&& other) noexcept {
    if (this != &other) {
        reset();
        pid_ = std::exchange(other.pid_, -1);
        socket_fd_ = std::exchange(other.socket_fd_, -1);
        exec_errno_ = std::exchange(other.exec_errno_, 0);
    }
    return *this;
}

worker_process::~worker_process() { reset(); }

void worker_process::reset() noexcept {
    if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
    if (socket_fd_ >= 0) ::close(socket_fd_);
    socket_fd_ = -1;
    exec_errno_ = 0;
}

int worker_process::take_socket() { return std::exchange(socket_fd_, -1); }

void worker_process::kill() const {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
}

} // namespace colibri::daemon
