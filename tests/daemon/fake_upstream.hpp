#pragma once
/// An OpenAI-compatible completion server in the test process, for the remote backend's
/// tests: it answers POST /v1/completions with the Server-Sent Events vLLM and
/// llama-server send (a chunk per piece, a finish_reason, a usage chunk, [DONE]), records
/// what it was asked, and notices a client that hangs up mid-stream.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/ssl.h>

namespace colibri::test {

class fake_upstream {
public:
    struct script {
        std::vector<std::string> pieces = {"def", " f", "(x):\n", "    return x\n"};
        int delay_ms = 0; ///< before each piece
        int status = 200; ///< anything else: an error body with this status
        std::string error_message = "bad request";
        std::string cert_file, key_file; ///< both set: https with this certificate
    };

    /// Listens on 127.0.0.1 (`port` 0: any free port).
    explicit fake_upstream(script s, int port = 0) : script_(std::move(s)) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const int one = 1;
        ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(static_cast<uint16_t>(port));
        if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd_, 16) != 0)
            throw std::runtime_error(std::string("fake upstream: cannot listen: ") + std::strerror(errno));
        socklen_t len = sizeof(addr);
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
        port_ = ntohs(addr.sin_port);
        if (!script_.cert_file.empty()) {
            tls_ = ::SSL_CTX_new(::TLS_server_method());
            if (::SSL_CTX_use_certificate_file(tls_, script_.cert_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
                ::SSL_CTX_use_PrivateKey_file(tls_, script_.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
                throw std::runtime_error("fake upstream: cannot load the certificate");
        }
        thread_ = std::thread([this] { serve(); });
    }
    ~fake_upstream() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
        if (tls_) ::SSL_CTX_free(tls_);
    }
    fake_upstream(const fake_upstream&) = delete;
    fake_upstream& operator=(const fake_upstream&) = delete;

    int port() const { return port_; }
    std::string url() const {
        return tls_ ? "https://localhost:" + std::to_string(port_) : "http://127.0.0.1:" + std::to_string(port_);
    }
    /// The request bodies received, in order.
    std::vector<nlohmann::json> requests() const {
        std::lock_guard lock(mu_);
        return requests_;
    }
    /// Streams whose client hung up before the end.
    int hung_up() const { return hung_up_; }

private:
    void serve() {
        while (!stop_) {
            pollfd pfd{fd_, POLLIN, 0};
            if (::poll(&pfd, 1, 20) <= 0) continue;
            const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) continue;
            if (tls_) {
                ssl_ = ::SSL_new(tls_);
                ::SSL_set_fd(ssl_, c);
                if (::SSL_accept(ssl_) == 1) answer(c);
                ::SSL_free(ssl_);
                ssl_ = nullptr;
            } else {
                answer(c);
            }
            ::close(c);
        }
    }

    void answer(int c) {
        std::string in;
        char buf[8192];
        std::size_t body_at = std::string::npos, length = 0;
        while (body_at == std::string::npos || in.size() < body_at + length) {
            pollfd pfd{c, POLLIN, 0};
            if (!(ssl_ && ::SSL_pending(ssl_) > 0) && ::poll(&pfd, 1, 2000) <= 0) return;
            const ssize_t n = ssl_ ? ::SSL_read(ssl_, buf, sizeof(buf)) : ::recv(c, buf, sizeof(buf), 0);
            if (n <= 0) return;
            in.append(buf, static_cast<std::size_t>(n));
            if (body_at == std::string::npos && (body_at = in.find("\r\n\r\n")) != std::string::npos) {
                body_at += 4;
                const auto cl = in.find("Content-Length: ");
                length = cl == std::string::npos ? 0 : std::stoul(in.substr(cl + 16));
            }
        }
        {
            std::lock_guard lock(mu_);
            requests_.push_back(nlohmann::json::parse(in.substr(body_at, length), nullptr, false));
        }
        if (script_.status != 200) {
            const std::string body =
                nlohmann::json{{"error", {{"message", script_.error_message}, {"code", script_.status}}}}.dump();
            send_all(c, "HTTP/1.1 " + std::to_string(script_.status) +
                            " Error\r\nContent-Type: application/json\r\n"
                            "Content-Length: " +
                            std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
            return;
        }
        if (!send_all(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                         "Connection: close\r\n\r\n"))
            return;
        auto event = [&](const nlohmann::json& j) { return chunk("data: " + j.dump() + "\n\n"); };
        auto choice = [](const std::string& text, const nlohmann::json& reason) {
            return nlohmann::json{{"id", "cmpl-1"},
                                  {"object", "text_completion"},
                                  {"choices", {{{"text", text}, {"index", 0}, {"finish_reason", reason}}}}};
        };
        for (const auto& piece : script_.pieces) {
            if (script_.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(script_.delay_ms));
            if (!send_all(c, event(choice(piece, nullptr)))) {
                ++hung_up_;
                return;
            }
        }
        nlohmann::json usage = choice("", nullptr);
        usage["choices"] = nlohmann::json::array();
        usage["usage"] = {{"prompt_tokens", 7},
                          {"completion_tokens", static_cast<int>(script_.pieces.size())},
                          {"total_tokens", 7 + static_cast<int>(script_.pieces.size())}};
        send_all(c, event(choice("", "length")) + event(usage) + chunk("data: [DONE]\n\n") + "0\r\n\r\n");
    }

    static std::string chunk(const std::string& data) {
        char size[32];
        std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
        return size + data + "\r\n";
    }

    /// false when the client has gone (its reset makes a later send fail).
    bool send_all(int c, const std::string& bytes) {
        if (ssl_) return ::SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) > 0;
        std::size_t off = 0;
        while (off < bytes.size()) {
            const ssize_t n = ::send(c, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
            if (n <= 0) return false;
            off += static_cast<std::size_t>(n);
        }
        // A client that closed answers with a reset: look for it before going on.
        pollfd pfd{c, POLLIN, 0};
        if (::poll(&pfd, 1, 0) > 0) {
            char b;
            if (::recv(c, &b, 1, MSG_DONTWAIT) <= 0) return false;
        }
        return true;
    }

    script script_;
    SSL_CTX* tls_ = nullptr;
    SSL* ssl_ = nullptr; ///< the connection being answered, over TLS
    int fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int> hung_up_{0};
    mutable std::mutex mu_;
    std::vector<nlohmann::json> requests_;
    std::thread thread_;
};

} // namespace colibri::test
