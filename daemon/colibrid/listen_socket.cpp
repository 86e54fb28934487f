#include "listen_socket.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if COLIBRI_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace colibri::daemon {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

sockaddr_un make_addr(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path))
        throw startup_error("socket path '" + path + "' is longer than " + std::to_string(sizeof(addr.sun_path) - 1) +
                            " bytes");
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return addr;
}

/// true when something accepts connections on `path`.
bool someone_listens(const std::string& path) {
    const sockaddr_un addr = make_addr(path);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
}

std::string parent_dir(const std::string& path) {
    const auto slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

void ensure_directory(const std::string& dir, std::optional<gid_t> group) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) throw startup_error("'" + dir + "' exists and is not a directory");
        return;
    }
    if (errno != ENOENT) throw startup_error("cannot inspect '" + dir + "': " + errno_text(errno));
    const mode_t mode = group ? 0750 : 0700;
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST)
        throw startup_error("cannot create '" + dir + "': " + errno_text(errno));
    ::chmod(dir.c_str(), mode); // mkdir is subject to the umask
    if (group && ::chown(dir.c_str(), static_cast<uid_t>(-1), *group) != 0)
        throw startup_error("cannot give '" + dir + "' to group " + std::to_string(*group) + ": " + errno_text(errno));
}

/// Refuses a directory an attacker could have prepared (the /tmp fallback).
void check_private_directory(const std::string& dir) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) throw startup_error("cannot inspect '" + dir + "': " + errno_text(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
        throw startup_error("'" + dir + "' is not a directory owned by this user; refusing to use it");
}

} // namespace

activated_sockets take_activated_sockets() {
    std::vector<std::string> names;
#if COLIBRI_HAVE_LIBSYSTEMD
    // Checks LISTEN_PID, sets FD_CLOEXEC and clears the variables.
    char** fd_names = nullptr;
    const int n = ::sd_listen_fds_with_names(1, &fd_names);
    if (n < 0) throw startup_error(std::string("cannot take the sockets passed by systemd: ") + errno_text(-n));
    for (int i = 0; fd_names && fd_names[i]; ++i) {
        names.emplace_back(fd_names[i]);
        std::free(fd_names[i]);
    }
    std::free(fd_names);
#else
    const char* pid = std::getenv("LISTEN_PID");
    const char* fds = std::getenv("LISTEN_FDS");
    const char* fdnames = std::getenv("LISTEN_FDNAMES");
    const std::string all_names = fdnames ? fdnames : "";
    const long listen_pid = pid ? std::strtol(pid, nullptr, 10) : 0;
    long n = fds ? std::strtol(fds, nullptr, 10) : 0;
    ::unsetenv("LISTEN_PID");
    ::unsetenv("LISTEN_FDS");
    ::unsetenv("LISTEN_FDNAMES");
    if (!pid || !fds || listen_pid != ::getpid() || n < 1) n = 0;
    for (std::size_t at = 0; n > 0 && at <= all_names.size();) {
        const std::size_t colon = std::min(all_names.find(':', at), all_names.size());
        names.push_back(all_names.substr(at, colon - at));
        at = colon + 1;
    }
    for (long i = 0; i < n; ++i) ::fcntl(3 + static_cast<int>(i), F_SETFD, FD_CLOEXEC);
#endif
    activated_sockets out;
    if (n > 2) throw startup_error("systemd passed " + std::to_string(n) + " sockets; colibrid takes at most two");
    for (int i = 0; i < n; ++i) {
        const int fd = 3 + i; // SD_LISTEN_FDS_START
        const bool http = static_cast<std::size_t>(i) < names.size() && names[static_cast<std::size_t>(i)] == "http";
        int type = 0, domain = 0, listening = 0;
        socklen_t len = sizeof(int);
        const bool stream_listener = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
                                     ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 &&
                                     ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening;
        if (http) {
            if (!stream_listener || (domain != AF_UNIX && domain != AF_INET && domain != AF_INET6))
                throw startup_error("the socket named 'http' passed by systemd is not a listening stream socket");
            out.http = fd;
        } else {
            if (!stream_listener || domain != AF_UNIX)
                throw startup_error("the socket passed in LISTEN_FDS is not a listening Unix stream socket");
            if (out.protocol)
                throw startup_error("systemd passed two protocol sockets; name the HTTP one "
                                    "FileDescriptorName=http");
            out.protocol = fd;
        }
    }
    return out;
}

listen_socket listen_socket::open(const std::string& path, std::optional<gid_t> group, std::optional<int> activated) {
    listen_socket s;
    if (auto fd = activated) {
        s.fd_ = *fd;
        s.activated_ = true;
        sockaddr_un addr{};
        socklen_t len = sizeof(addr);
        if (::getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && len > offsetof(sockaddr_un, sun_path))
            s.path_ = addr.sun_path; // empty for an abstract socket
        // Who may connect was decided by the socket unit (SocketMode=, SocketGroup=).
        struct stat st {};
        if (!s.path_.empty() && ::stat(s.path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
            if ((st.st_mode & 0020) != 0) s.file_group_ = st.st_gid;
            s.file_world_ = (st.st_mode & 0002) != 0;
        }
        return s;
    }

    s.path_ = path;
    const sockaddr_un addr = make_addr(path);
    const std::string dir = parent_dir(path);
    ensure_directory(dir, group);
    if (!std::getenv("XDG_RUNTIME_DIR") && dir.rfind("/tmp/colibri-", 0) == 0) check_private_directory(dir);

    // Single instance: whoever holds the lock owns the path.
    const std::string lock_path = path + ".lock";
    s.lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (s.lock_fd_ < 0) throw startup_error("cannot open lock file '" + lock_path + "': " + errno_text(errno));
    if (::flock(s.lock_fd_, LOCK_EX | LOCK_NB) != 0) {
        char buf[32] = {};
        const ssize_t n = ::pread(s.lock_fd_, buf, sizeof(buf) - 1, 0);
        const std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "?";
        throw startup_error("another colibrid (pid " + pid + ") is serving " + path +
                            "; refusing to take over its socket");
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(s.lock_fd_, 0) != 0 || ::pwrite(s.lock_fd_, pid.data(), pid.size(), 0) < 0) {
        // The pid is only informative; a failure here is not worth refusing to start.
    }

    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            throw startup_error("'" + path + "' exists and is not a socket; refusing to replace it");
        if (someone_listens(path))
            throw startup_error("a server is already listening on " + path + "; refusing to take over its socket");
        if (::unlink(path.c_str()) != 0)
            throw startup_error("cannot remove stale socket '" + path + "': " + errno_text(errno));
    }

    s.fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s.fd_ < 0) throw startup_error("socket(): " + errno_text(errno));
    const mode_t old_mask = ::umask(0177); // the socket is born 0600
    const int rc = ::bind(s.fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    const int bind_errno = errno;
    ::umask(old_mask);
    if (rc != 0) throw startup_error("cannot bind '" + path + "': " + errno_text(bind_errno));
    s.owns_file_ = true;
    if (::lstat(path.c_str(), &st) == 0) {
        s.dev_ = st.st_dev;
        s.ino_ = st.st_ino;
    }
    if (group) {
        if (::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0 || ::chmod(path.c_str(), 0660) != 0)
            throw startup_error("cannot give '" + path + "' to group " + std::to_string(*group) + ": " +
                                errno_text(errno));
    }
    if (::listen(s.fd_, SOMAXCONN) != 0) throw startup_error("listen(): " + errno_text(errno));
    return s;
}

listen_socket::listen_socket(listen_socket&& o) noexcept
    : fd_(o.fd_), lock_fd_(o.lock_fd_), path_(std::move(o.path_)), activated_(o.activated_), owns_file_(o.owns_file_),
      dev_(o.dev_), ino_(o.ino_), file_group_(o.file_group_), file_world_(o.file_world_) {
    o.fd_ = -1;
    o.lock_fd_ = -1;
    o.owns_file_ = false;
}

listen_socket::~listen_socket() {
    remove_file();
    if (fd_ >= 0) ::close(fd_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
}

int listen_socket::release_fd() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
}

void listen_socket::remove_file() {
    if (!owns_file_) return;
    owns_file_ = false;
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
}

bool peer_allowed(uid_t uid, gid_t gid, const std::vector<gid_t>& groups, const peer_policy& policy) {
    if (uid == 0 || uid == policy.owner || policy.anyone) return true;
    if (!policy.group) return false;
    if (gid == *policy.group) return true;
    for (gid_t g : groups)
        if (g == *policy.group) return true;
    return false;
}

std::vector<gid_t> groups_of(uid_t uid, gid_t primary) {
    passwd pw{};
    passwd* result = nullptr;
    std::vector<char> buf(16384);
    if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &result) != 0 || !result) return {};
    int n = 64;
    std::vector<gid_t> groups(static_cast<std::size_t>(n));
    if (::getgrouplist(pw.pw_name, primary, groups.data(), &n) < 0) {
        groups.resize(static_cast<std::size_t>(n));
        if (::getgrouplist(pw.pw_name, primary, groups.data(), &n) < 0) return {};
    }
    groups.resize(static_cast<std::size_t>(n));
    return groups;
}

gid_t resolve_group(const std::string& name_or_gid) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(name_or_gid.c_str(), &end, 10);
    if (!name_or_gid.empty() && end && *end == '\0') return static_cast<gid_t>(v);
    group gr{};
    group* result = nullptr;
    std::vector<char> buf(16384);
    if (::getgrnam_r(name_or_gid.c_str(), &gr, buf.data(), buf.size(), &result) != 0 || !result)
        throw startup_error("unknown group '" + name_or_gid + "'");
    return gr.gr_gid;
}

} // namespace colibri::daemon
