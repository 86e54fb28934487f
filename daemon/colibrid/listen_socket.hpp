#pragma once
/// The daemon's listening Unix socket: path, permissions, single-instance lock, stale
/// socket replacement, systemd socket activation, and the peer-credential policy.

#include <sys/types.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace colibri::daemon {

/// The socket cannot be set up; the message is meant for the user.
class startup_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A listening socket and the files that come with it. When it bound the path itself it
/// removes the socket file on destruction (only if the file is still the one it bound).
/// The lock file `<path>.lock` stays: removing a lock file races with its next owner.
class listen_socket {
public:
    /// Uses `activated` (a socket systemd passed) when there is one, else binds `path`.
    /// `group`: the group allowed to connect (socket 0660, new directory 0750).
    static listen_socket open(const std::string& path, std::optional<gid_t> group,
                              std::optional<int> activated = std::nullopt);

    listen_socket(listen_socket&&) noexcept;
    listen_socket& operator=(listen_socket&&) = delete;
    listen_socket(const listen_socket&) = delete;
    ~listen_socket();

    /// Hands the descriptor over (to the acceptor); the files stay owned by this object.
    int release_fd();
    const std::string& path() const { return path_; }
    bool activated() const { return activated_; }
    /// Socket activation: the group that the socket file lets connect (mode g+w), if any.
    std::optional<gid_t> file_group() const { return file_group_; }
    /// Socket activation: the socket file lets everyone connect (mode o+w).
    bool file_world() const { return file_world_; }
    /// Removes the socket file now (idempotent).
    void remove_file();

private:
    listen_socket() = default;
    int fd_ = -1;
    int lock_fd_ = -1;
    std::string path_;
    bool activated_ = false;
    bool owns_file_ = false;
    dev_t dev_ = 0;
    ino_t ino_ = 0;
    std::optional<gid_t> file_group_;
    bool file_world_ = false;
};

/// The listening sockets systemd passed (LISTEN_PID/LISTEN_FDS), told apart by their
/// names (FileDescriptorName=): `http` is the HTTP front's, the other the protocol socket.
struct activated_sockets {
    std::optional<int> protocol;
    std::optional<int> http;
};

/// Takes them once (the variables are cleared). Throws startup_error.
activated_sockets take_activated_sockets();

/// Who may talk to the daemon.
struct peer_policy {
    uid_t owner = 0;
    std::optional<gid_t> group;
    bool anyone = false; ///< a socket unit with SocketMode=0666: the file's mode decides
};

/// Root, the owner, members of the configured group (primary or supplementary), and
/// everyone when `anyone`.
bool peer_allowed(uid_t uid, gid_t gid, const std::vector<gid_t>& groups, const peer_policy& policy);

/// Supplementary groups of a user id (empty when the user is unknown).
std::vector<gid_t> groups_of(uid_t uid, gid_t primary);

/// A group name or numeric gid. Throws startup_error when unknown.
gid_t resolve_group(const std::string& name_or_gid);

} // namespace colibri::daemon
