#include "http_front.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "http_session.hpp"
#include "log.hpp"

namespace colibri::daemon {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using generic_endpoint = asio::generic::stream_protocol::endpoint;

namespace {

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("http");
    return log;
}

std::string read_api_key(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw startup_error("cannot read the API key file '" + path + "'");
    std::stringstream all;
    all << in.rdbuf();
    std::string key = all.str();
    const auto first = key.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) throw startup_error("the API key file '" + path + "' is empty");
    key = key.substr(first, key.find_last_not_of(" \t\r\n") - first + 1);
    if (key.find_first_of(" \t\r\n") != std::string::npos)
        throw startup_error("the API key file '" + path + "' must hold one key on one line");
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)) != 0)
        logger()->warn("the API key file '{}' is readable by other users", path);
    return key;
}

/// Compares without leaking where the first difference is.
bool same_secret(std::string_view given, std::string_view key) {
    if (given.size() != key.size()) return false;
    unsigned char diff = 0;
    for (std::size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
    return diff == 0;
}

/// Binds a Unix socket at `path`, replacing a stale socket file (one nobody listens on).
void bind_unix(asio::basic_socket_acceptor<asio::generic::stream_protocol>& acceptor, const std::string& path,
               std::optional<gid_t> group) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) throw startup_error("--http: '" + path + "' exists and is not a socket");
        asio::io_context probe_io;
        asio::local::stream_protocol::socket probe(probe_io);
        boost::system::error_code ec;
        probe.connect(asio::local::stream_protocol::endpoint(path), ec);
        if (!ec) throw startup_error("--http: another process listens on '" + path + "'");
        ::unlink(path.c_str());
    }
    const generic_endpoint ep{asio::local::stream_protocol::endpoint(path)};
    acceptor.open(ep.protocol());
    acceptor.bind(ep);
    // Owner only, or the --socket-group too, as the protocol socket.
    if (group) {
        if (::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0 || ::chmod(path.c_str(), 0660) != 0)
            throw startup_error("--http: cannot give '" + path + "' to the socket group");
    } else if (::chmod(path.c_str(), 0600) != 0) {
        throw startup_error("--http: cannot restrict '" + path + "' to its owner");
    }
    acceptor.listen();
}

} // namespace

http_front::http_front(asio::io_context& io, const daemon_config& cfg, server& srv, const peer_policy& policy,
                       std::optional<int> activated)
    : io_(io), cfg_(cfg), server_(srv), policy_(policy), acceptor_(io), accept_retry_(io) {
    limits_.max_tokens = cfg.max_tokens;
    limits_.allow_fault_injection = cfg.enable_fault_injection;
    if (!cfg.api_key_file.empty()) api_key_ = read_api_key(cfg.api_key_file);
    auto require_key_off_loopback = [&](const asio::ip::tcp::endpoint& ep) {
        if (ep.address().is_loopback() || api_key_) return;
        throw startup_error("HTTP on " + ep.address().to_string() +
                            " is reachable from other machines: give "
                            "--api-key-file, or listen on a loopback address such as 127.0.0.1:" +
                            std::to_string(ep.port()));
    };
    try {
        if (activated) {
            // The socket unit decided the address; the same rules hold for it.
            sockaddr_storage addr{};
            socklen_t len = sizeof(addr);
            if (::getsockname(*activated, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
                throw startup_error("cannot inspect the HTTP socket systemd passed");
            const int family = addr.ss_family;
            acceptor_.assign(asio::generic::stream_protocol(family, family == AF_UNIX ? 0 : IPPROTO_TCP), *activated);
            activated_ = true;
            address_.unix_socket = family == AF_UNIX;
        } else {
            address_ = parse_http_address(cfg.http);
            if (address_.unix_socket) {
                bind_unix(acceptor_, address_.path, policy.group);
            } else {
                asio::ip::tcp::resolver resolver(io);
                const auto results = resolver.resolve(address_.host, std::to_string(address_.port),
                                                      asio::ip::tcp::resolver::numeric_service);
                require_key_off_loopback(results.begin()->endpoint());
                const generic_endpoint gep{results.begin()->endpoint()};
                acceptor_.open(gep.protocol());
                acceptor_.set_option(asio::socket_base::reuse_address(true));
                acceptor_.bind(gep);
                acceptor_.listen();
            }
        }
        const generic_endpoint local = acceptor_.local_endpoint();
        if (address_.unix_socket) {
            const auto* un = reinterpret_cast<const sockaddr_un*>(local.data());
            where_ = "unix:" + std::string(local.size() > offsetof(sockaddr_un, sun_path) ? un->sun_path : "");
        } else {
            asio::ip::tcp::endpoint ep;
            std::memcpy(ep.data(), local.data(), local.size());
            ep.resize(local.size());
            require_key_off_loopback(ep); // a socket systemd passed
            std::ostringstream w;
            w << ep;
            where_ = w.str();
        }
    } catch (const boost::system::system_error& e) {
        throw startup_error("--http " + cfg.http + ": " + e.code().message());
    }
}

http_front::~http_front() {
    if (address_.unix_socket && !activated_ && acceptor_.is_open()) ::unlink(address_.path.c_str());
}

void http_front::start() {
    logger()->info("HTTP on {}{}", where_, api_key_ ? " (API key required)" : "");
    do_accept();
}

void http_front::stop(bool close_sessions) {
    if (!stopped_) {
        stopped_ = true;
        boost::system::error_code ignored;
        accept_retry_.cancel();
        acceptor_.close(ignored);
        if (address_.unix_socket && !activated_) ::unlink(address_.path.c_str());
    }
    if (!close_sessions) return;
    auto all = sessions_;
    for (auto& s : all) s->stop();
}

bool http_front::authorized(const http::request<http::string_body>& req) const {
    if (!api_key_) return true;
    std::string_view given;
    if (auto it = req.find(http::field::authorization); it != req.end()) {
        // "Bearer KEY", or the key alone as llama-server also takes it
        const std::string_view v(it->value().data(), it->value().size());
        given = v.size() > 7 && (v.substr(0, 7) == "Bearer " || v.substr(0, 7) == "bearer ") ? v.substr(7) : v;
    } else if (auto key = req.find("X-Api-Key"); key != req.end()) {
        given = std::string_view(key->value().data(), key->value().size());
    }
    return same_secret(given, *api_key_);
}

bool http_front::peer_ok(int fd) const {
    if (!address_.unix_socket) return true; // TCP: loopback or the API key decide
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
    return peer_allowed(cred.uid, cred.gid, policy_.group ? groups_of(cred.uid, cred.gid) : std::vector<gid_t>{},
                        policy_);
}

void http_front::do_accept() {
    if (stopped_) return;
    acceptor_.async_accept([this](boost::system::error_code ec, http_session::socket_type sock) {
        if (stopped_) return;
        if (ec) {
            if (ec == asio::error::operation_aborted) return;
            logger()->warn("accept failed: {}", ec.message());
            accept_retry_.expires_after(std::chrono::milliseconds(50));
            accept_retry_.async_wait([this](boost::system::error_code e) {
                if (!e) do_accept();
            });
            return;
        }
        if (!peer_ok(sock.native_handle())) {
            logger()->warn("refused an HTTP connection from a user who may not use this colibrid");
        } else if (sessions_.size() >= cfg_.max_connections) {
            logger()->warn("HTTP connection limit ({}) reached", cfg_.max_connections);
        } else {
            if (!address_.unix_socket) {
                boost::system::error_code ignored;
                sock.set_option(asio::ip::tcp::no_delay(true), ignored); // every SSE event at once
            }
            auto s = std::make_shared<http_session>(std::move(sock), *this);
            sessions_.insert(s);
            s->start();
        }
        do_accept();
    });
}

} // namespace colibri::daemon
