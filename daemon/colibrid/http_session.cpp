#include "http_session.hpp"

#include <ctime>
#include <random>
#include <sstream>

#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "colibri/protocol/codec.hpp"
#include "http_front.hpp"
#include "log.hpp"
#include "server.hpp"

namespace colibri::daemon {

namespace asio = boost::asio;
namespace http = boost::beast::http;
namespace p = protocol;
using nlohmann::json;

namespace {

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("http");
    return log;
}

constexpr std::size_t max_header_bytes = 16 * 1024;

std::string completion_id() {
    static std::mt19937_64 rng(std::random_device{}());
    std::ostringstream id;
    id << "cmpl-" << std::hex << rng();
    return id.str();
}

std::string_view path_of(boost::beast::string_view target) {
    const std::string_view t(target.data(), target.size());
    return t.substr(0, t.find('?'));
}

} // namespace

http_session::http_session(socket_type socket, http_front& front)
    : socket_(std::move(socket)), front_(front), timer_(socket_.get_executor()) {}

void http_session::start() { read_next(); }

void http_session::arm_timeout() {
    timer_.expires_after(std::chrono::milliseconds(front_.cfg().http_timeout_ms));
    timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
        auto self = weak.lock();
        if (ec || !self || self->responding_) return;
        logger()->debug("closing a connection that sent no whole request in time");
        self->stop();
    });
}

void http_session::read_next() {
    if (reading_ || stopped_ || held_) return;
    parser_.emplace();
    parser_->header_limit(max_header_bytes);
    parser_->body_limit(front_.cfg().max_line_bytes);
    if (!responding_) arm_timeout();
    reading_ = true;
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                                if (ec || self->stopped_) {
                                    self->reading_ = false;
                                    self->on_read(ec);
                                    return;
                                }
                                // A client that asks before sending its body (curl does above 1 MiB) is told to go on.
                                const auto expect = self->parser_->get()[http::field::expect];
                                if (!self->responding_ && boost::beast::iequals(expect, "100-continue"))
                                    self->write("HTTP/1.1 100 Continue\r\n\r\n");
                                http::async_read(self->socket_, self->buffer_, *self->parser_,
                                                 [self](boost::system::error_code ec2, std::size_t) {
                                                     self->reading_ = false;
                                                     self->on_read(ec2);
                                                 });
                            });
}

void http_session::on_read(boost::system::error_code ec) {
    if (stopped_) return;
    if (ec) {
        // While a completion runs, any end of the connection means its client is gone.
        if (responding_ || ec == http::error::end_of_stream || ec == asio::error::eof ||
            ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
            if (job_) logger()->debug("client closed the connection: cancelling its completion");
            stop();
            return;
        }
        close_after_write_ = true;
        responding_ = true;
        version_ = 11;
        keep_alive_ = false;
        if (ec == http::error::header_limit)
            respond_error(431, "too_large",
                          "the request headers exceed " + std::to_string(max_header_bytes) + " bytes");
        else if (ec == http::error::body_limit)
            respond_error(413, "too_large",
                          "the request body exceeds " + std::to_string(front_.cfg().max_line_bytes) +
                              " bytes (--max-line-bytes)");
        else respond_error(400, "invalid_request", "malformed HTTP request: " + ec.message());
        return;
    }
    request_type req = parser_->release();
    if (responding_) {
        held_ = std::move(req); // pipelined: answered in order
        return;
    }
    timer_.cancel();
    serve(std::move(req));
}

void http_session::serve(request_type req) {
    responding_ = true;
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    const std::string_view path = path_of(req.target());
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    logger()->debug("{} {}", std::string(req.method_string()), path);

    if (path == "/health" || path == "/v1/health") { // public, as llama-server's
        if (!get) return respond_error(405, "invalid_request", "use GET");
        const json h = front_.srv().health_event(nullptr);
        const std::string status = h.value("status", "");
        if (status == "ok") return respond(200, {{"status", "ok"}});
        const std::string message =
            status == "starting" ? "Loading model" : h.value("message", "the daemon is " + status);
        return respond_error(503, "unavailable", message);
    }
    const bool known = path == "/v1/models" || path == "/models" || path == "/infill" || path == "/completion" ||
                       path == "/completions" || path == "/v1/completions";
    if (!known) return respond_error(404, "not_found", "no such endpoint: " + std::string(path));
    if (!front_.authorized(req))
        return respond_error(401, "unauthorized", "a valid API key is required (Authorization: Bearer KEY)");
    if (path == "/v1/models" || path == "/models") {
        if (!get) return respond_error(405, "invalid_request", "use GET");
        const json model = {{"id", front_.srv().model_name()},
                            {"object", "model"},
                            {"created", front_.srv().started_at()},
                            {"owned_by", "colibri"},
                            {"meta", front_.srv().model_info()}};
        return respond(200, {{"object", "list"}, {"data", json::array({model})}});
    }
    if (!post) return respond_error(405, "invalid_request", "use POST");
    if (path == "/infill") return serve_completion(http_api::infill, req);
    if (path == "/v1/completions") return serve_completion(http_api::openai_completion, req);
    return serve_completion(http_api::completion, req);
}

void http_session::serve_completion(http_api api, const request_type& req) {
    auto parsed = parse_http_completion(api, req.body(), front_.limits());
    if (auto* err = std::get_if<p::request_error>(&parsed)) {
        return respond_error(http_status(err->code), p::to_string(err->code), err->message);
    }
    completion_ = std::move(std::get<http_completion>(parsed));
    outcome_ = {};
    const json& info = front_.srv().model_info(); // null until the first worker is ready
    reply_ = {api,
              front_.srv().model_name(),
              completion_id(),
              static_cast<std::int64_t>(std::time(nullptr)),
              http_generation_settings(completion_.req, info.is_object() ? info.value("n_ctx", 0) : 0),
              completion_.response_fields};
    if (api == http_api::openai_completion && !completion_.model.empty()) reply_.model = completion_.model;

    auto j = std::make_shared<job>(front_.io());
    j->id = front_.next_job_id();
    j->key = j->id.dump();
    j->req = completion_.req;
    j->sink = shared_from_this();
    j->owner = this;
    if (auto err = front_.srv().submit_job(j)) {
        return respond_error(http_status(err->code), p::to_string(err->code), err->message);
    }
    job_ = std::move(j);
    read_next(); // a closed connection cancels the completion
}

void http_session::send(const json& event) {
    if (stopped_ || !job_) return;
    const std::string kind = event.value("event", "");
    if (kind == p::event::piece) on_piece(event.value("text", ""));
    else if (kind == p::event::done) on_done(event);
    else if (kind == p::event::error) on_error(event);
}

void http_session::forget(const std::string&) { job_.reset(); }

void http_session::on_piece(std::string_view text) {
    if (outcome_.time_limited) return; // pieces already on their way when the job was ended
    if (outcome_.text.empty()) first_piece_ = clock::now();
    outcome_.text.append(text);
    ++outcome_.usage.completion_tokens;
    if (completion_.stream) {
        if (!headers_sent_) begin_stream();
        stream_chunk(http_piece_event(reply_, text, outcome_.usage.completion_tokens));
    }
    // llama-server's t_max_predict_ms: past the time, end with a piece that holds a newline,
    // so that the text ends at a line's end
    if (completion_.max_predict_ms > 0 && job_ && text.find('\n') != std::string_view::npos &&
        std::chrono::duration<double, std::milli>(clock::now() - first_piece_).count() >= completion_.max_predict_ms) {
        outcome_.time_limited = true;
        front_.srv().end_job(job_); // its done event follows at once
    }
}

void http_session::on_done(const json& event) {
    const p::done_event d = p::parse_done_event(event);
    outcome_.reason = d.reason;
    outcome_.timings = d.timings;
    if (d.reason != p::finish_reason::cancelled) outcome_.usage = d.usage;
    if (d.reason == p::finish_reason::cancelled) {
        // Only the daemon cancels an HTTP completion its client still waits for: it is shutting down.
        if (!headers_sent_) return respond_error(503, "unavailable", "the daemon is shutting down");
        stream_chunk(sse_event(http_error_body(503, "unavailable", "the daemon is shutting down")));
        return end_stream();
    }
    if (!completion_.stream) return respond(200, http_final_body(reply_, outcome_));
    if (!headers_sent_) begin_stream();
    stream_chunk(http_final_events(reply_, outcome_, completion_.include_usage));
    end_stream();
}

void http_session::on_error(const json& event) {
    const auto code = p::error_code_from_string(event.value("code", "")).value_or(p::error_code::internal);
    const std::string message = event.value("message", "");
    if (!headers_sent_) return respond_error(http_status(code), p::to_string(code), message);
    stream_chunk(sse_event(http_error_body(http_status(code), p::to_string(code), message)));
    end_stream();
}

void http_session::respond(unsigned status, const json& body) {
    http::response<http::string_body> res{static_cast<http::status>(status), version_};
    res.set(http::field::server, "colibrid");
    res.set(http::field::content_type, "application/json");
    if (status == 401) res.set(http::field::www_authenticate, "Bearer");
    res.keep_alive(keep_alive_ && !close_after_write_);
    res.body() = p::dump_line(body);
    res.prepare_payload();
    std::ostringstream bytes;
    bytes << res;
    headers_sent_ = true;
    write(bytes.str());
    pending_done_ = true;
    do_write();
}

void http_session::respond_error(unsigned status, std::string_view type, std::string_view message) {
    logger()->debug("answering {}: {}", status, message);
    respond(status, http_error_body(status, type, message));
}

void http_session::begin_stream() {
    headers_sent_ = true;
    chunked_ = version_ >= 11;
    if (!chunked_ || !keep_alive_) close_after_write_ = true; // an HTTP/1.0 stream ends at the close
    std::string head = "HTTP/1." + std::to_string(version_ % 10) +
                       " 200 OK\r\nServer: colibrid\r\n"
                       "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
    if (chunked_) head += "Transfer-Encoding: chunked\r\n";
    if (close_after_write_) head += "Connection: close\r\n";
    write(head + "\r\n");
}

void http_session::stream_chunk(const std::string& data) {
    if (!chunked_) return write(data);
    std::ostringstream size;
    size << std::hex << data.size() << "\r\n";
    write(size.str() + data + "\r\n");
}

void http_session::end_stream() {
    if (chunked_) write("0\r\n\r\n");
    pending_done_ = true;
    do_write();
}

void http_session::write(std::string bytes) {
    if (stopped_) return;
    out_bytes_ += bytes.size();
    out_.push_back(std::move(bytes));
    if (out_bytes_ > front_.cfg().max_write_buffer_bytes) {
        logger()->warn("dropping an HTTP client that does not read its output ({} bytes pending)", out_bytes_);
        stop();
        return;
    }
    do_write();
}

void http_session::do_write() {
    if (write_active_ || stopped_) return;
    if (out_.empty()) {
        if (pending_done_) {
            pending_done_ = false;
            response_done();
        }
        return;
    }
    writing_.clear();
    for (auto& s : out_) writing_ += s;
    out_.clear();
    write_active_ = true;
    asio::async_write(socket_, asio::buffer(writing_),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                          self->write_active_ = false;
                          self->out_bytes_ -= std::min(self->out_bytes_, n);
                          if (self->stopped_) return;
                          if (ec) {
                              self->stop(); // the client is gone
                              return;
                          }
                          self->do_write();
                      });
}

void http_session::response_done() {
    responding_ = false;
    headers_sent_ = false;
    chunked_ = false;
    if (close_after_write_ || !keep_alive_) {
        boost::system::error_code ignored;
        socket_.shutdown(socket_type::shutdown_send, ignored);
        stop();
        return;
    }
    if (held_) {
        request_type req = std::move(*held_);
        held_.reset();
        serve(std::move(req));
        return;
    }
    if (reading_) arm_timeout(); // the next request's read is already waiting
    else read_next();
}

void http_session::stop() {
    if (stopped_) return;
    stopped_ = true;
    timer_.cancel();
    if (auto j = std::move(job_)) front_.srv().cancel_job(j, false);
    boost::system::error_code ignored;
    socket_.close(ignored);
    front_.on_closed(shared_from_this());
}

} // namespace colibri::daemon
