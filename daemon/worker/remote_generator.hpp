#pragma once
/// The generator that completes by forwarding to OpenAI-compatible servers (vLLM, SGLang,
/// llama-server): `colibrid --backend openai --upstream URL`. Streams their Server-Sent
/// Events into pieces, closes the upstream request on cancel, retries other upstreams (with
/// backoff) when one cannot be reached, and applies max_lines and the indentation limits
/// itself, which those servers do not know.

#include <memory>
#include <string>
#include <vector>

#include "worker_loop.hpp"

namespace colibri::worker {

/// An upstream's address: http[s]://HOST[:PORT][/PATH]; requests go to PATH/v1/completions
/// (or PATH/completions when PATH ends with /v1).
struct upstream_url {
    std::string host, port, path;
    bool tls = false; ///< https: the certificate is checked against HOST
    std::string text; ///< as given, for messages
};

/// Parses one --upstream. Throws std::invalid_argument.
upstream_url parse_upstream_url(const std::string& url);

/// Throws std::invalid_argument for bad options (no upstream, unreadable key file).
std::unique_ptr<generator> make_remote_generator(const worker_options& opts);

} // namespace colibri::worker
