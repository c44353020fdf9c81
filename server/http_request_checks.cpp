#include "server/http_request_checks.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace pipeline {
namespace {

bool is_identity(std::string coding) {
  coding.erase(0, coding.find_first_not_of(" \t"));
  coding.erase(coding.find_last_not_of(" \t") + 1);
  std::transform(coding.begin(), coding.end(), coding.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return coding.empty() || coding == "identity";
}

}  // namespace

httplib::Request& pending(const httplib::Request& req) {
  return const_cast<httplib::Request&>(req);
}

void end_connection_after(const httplib::Request& req, httplib::Response& res) {
  pending(req).set_header(kEndConnection, "1");
  res.set_header("Connection", "close");
}

void take_off_body_encoding(const httplib::Request& req) {
  std::string codings;
  bool identity = true;
  for (auto [it, end] = req.headers.equal_range("Content-Encoding"); it != end; ++it) {
    codings += (codings.empty() ? "" : ", ") + it->second;
    for (size_t at = 0; at != std::string::npos;) {
      const size_t comma = it->second.find(',', at);
      identity = identity && is_identity(it->second.substr(at, comma - at));
      at = comma == std::string::npos ? comma : comma + 1;
    }
  }
  pending(req).headers.erase("Content-Encoding");
  if (!identity) pending(req).set_header(kRefusedEncoding, codings);
}

std::optional<RequestError> pending_refusal(const httplib::Request& req) {
  if (req.has_header(kRefusedKey))
    return RequestError{
        401, "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'.",
        "invalid_request_error", "", "invalid_api_key"};
  if (req.has_header(kRefusedEncoding))
    return RequestError{415,
                        "Content-Encoding '" + req.get_header_value(kRefusedEncoding) +
                            "' is not supported: send the request body uncompressed.",
                        "invalid_request_error", "", "unsupported_content_encoding"};
  return std::nullopt;
}

bool bearer_matches(const std::string& header, const std::string& key) {
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() != kScheme.size() + key.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return false;
  unsigned char differs = 0;
  for (size_t i = 0; i < key.size(); ++i)
    differs |= static_cast<unsigned char>(header[kScheme.size() + i] ^ key[i]);
  return differs == 0;
}

std::string allow_origin(const std::vector<std::string>& allowed, const std::string& origin) {
  if (origin.empty()) return "";
  for (const std::string& entry : allowed)
    if (entry == "*" || entry == origin) return entry;
  return "";
}

void take_path_of_absolute_form(const httplib::Request& req) {
  for (const std::string_view scheme : {"http://", "https://"}) {
    if (!req.path.starts_with(scheme)) continue;
    const size_t path = req.path.find('/', scheme.size());
    pending(req).path = path == std::string::npos ? "/" : req.path.substr(path);
  }
}

bool body_length_clear(const httplib::Request& req) {
  const size_t lengths = req.get_header_value_count("Content-Length");
  if (lengths == 0) return true;
  if (req.has_header("Transfer-Encoding")) return false;
  const std::string first = req.get_header_value("Content-Length");
  if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) return false;
  for (size_t i = 1; i < lengths; ++i)
    if (req.get_header_value("Content-Length", i) != first) return false;
  return true;
}

std::optional<RequestError> body_cut_short(const httplib::Request& req) {
  if (!req.has_header("Content-Length")) return std::nullopt;
  const uint64_t length = req.get_header_value<uint64_t>("Content-Length");
  if (req.body.size() >= length) return std::nullopt;
  return RequestError{408,
                      "The request body stopped arriving: " + std::to_string(req.body.size()) +
                          " of its " + std::to_string(length) + " bytes came before the server's " +
                          std::to_string(CPPHTTPLIB_READ_TIMEOUT_SECOND) +
                          " s read timeout. Send the whole body without pausing.",
                      "invalid_request_error", "", "request_timeout"};
}

bool is_preflight(const httplib::Request& req) {
  return req.method == "OPTIONS" && req.has_header("Origin") &&
         req.has_header("Access-Control-Request-Method") &&
         req.get_header_value<uint64_t>("Content-Length") == 0 &&
         !req.has_header("Transfer-Encoding");
}

}  // namespace pipeline
