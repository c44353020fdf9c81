// The checks and rewrites the HTTP server makes on an httplib request before a route answers
// it: its framing (where the body ends, a body cut short, an absolute-form target, a body's
// encoding), its API key, and CORS. Most run in the pre-routing handler, before httplib reads
// the body, and only mark on the request what the route answers once the body is read.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <httplib.h>

#include "graph/request.h"

namespace pipeline {

// Refusals the pre-routing handler decides are answered only once httplib has read the body:
// answered from there, a body of more than a few KiB was left unread, and the connection took
// its bytes for the next request (a body could carry a request of its own past the API key).
// They are kept on the request (httplib passes its own, non-const request to the pre-routing
// handler as const, and the same request on to the route), under names a client's own headers
// of those names are cleared from.
inline constexpr const char* kRefusedEncoding = "X-Pipeline-Refused-Content-Encoding";
inline constexpr const char* kRefusedKey = "X-Pipeline-Refused-Api-Key";
// And a connection to end once its answer is written (httplib closes one only when the request
// asked it to).
inline constexpr const char* kEndConnection = "X-Pipeline-End-Connection";

// The request httplib passed as const, to mark or rewrite before it is routed.
httplib::Request& pending(const httplib::Request& req);

// Ends the connection once `res` is written, and says so in it, so that a client does not send
// its next request down a connection about to close. (httplib still adds its Keep-Alive header,
// which Connection: close overrides, RFC 9112 9.6.)
void end_connection_after(const httplib::Request& req, httplib::Response& res);

// httplib inflates a gzip, deflate or br body as it reads it, with no bound on the inflated
// size: its payload limit holds the bytes sent, and a 1 MB gzip body of spaces grew to 3 GB. So
// every Content-Encoding header is taken off before httplib reads the body, the body is read as
// sent, within the payload limit, and answered 415 unless each coding it named is identity.
// OpenAI's clients send bodies uncompressed, and vLLM does not inflate them either.
void take_off_body_encoding(const httplib::Request& req);

// The refusal decided before the body was read, if any: a wrong or missing API key first, then
// a compressed body.
std::optional<RequestError> pending_refusal(const httplib::Request& req);

// Whether an Authorization header carries `key` as its bearer token. The scheme's case does not
// matter (RFC 7235); the key is compared in a time that does not depend on where it differs, so
// that the answers' times do not spell it out.
bool bearer_matches(const std::string& header, const std::string& key);

// CORS, as vLLM's middleware answers it: the Access-Control-Allow-Origin a request from
// `origin` (its Origin header) gets under server.allowed_origins: "*" when any origin may call,
// the origin itself when listed, none ("") otherwise.
std::string allow_origin(const std::vector<std::string>& allowed, const std::string& origin);

// A request target in absolute form ("POST http://host:port/v1/completions"), which a server
// must take (RFC 9112, 3.2.2) and some proxies send, routes by its path.
void take_path_of_absolute_form(const httplib::Request& req);

// Where the body ends is clear: one Content-Length of digits (or several that agree), and not
// beside Transfer-Encoding (RFC 9112, 6.3). Otherwise a proxy in front could take bytes of the
// body for the next request, where this server reads a body, or the other way round.
bool body_length_clear(const httplib::Request& req);

// A body that stopped arriving before its Content-Length's worth came (httplib gives up on it
// after its 5 s read timeout): 408, as the client was too slow rather than wrong. Nullopt for a
// body that came whole or has no length to fall short of (chunked).
std::optional<RequestError> body_cut_short(const httplib::Request& req);

// A browser's CORS preflight: an OPTIONS without a body that names the page's origin and the
// method it means to send.
bool is_preflight(const httplib::Request& req);

}  // namespace pipeline
