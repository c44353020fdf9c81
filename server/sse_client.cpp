#include "server/sse_client.h"

#include <exception>
#include <regex>

#include <httplib.h>

namespace pipeline {

namespace {

// An error answer's body goes into the message, cut to this many bytes.
constexpr size_t kErrorBodyShown = 500;

std::string shown_body(const std::string& body) {
  return body.size() <= kErrorBodyShown ? body : body.substr(0, kErrorBodyShown) + "...";
}

}  // namespace

// ---- SseParser

std::vector<std::string> SseParser::push(std::string_view bytes) {
  std::vector<std::string> events;
  for (size_t end; (end = bytes.find('\n')) != std::string_view::npos;) {
    line_.append(bytes.substr(0, end));
    bytes.remove_prefix(end + 1);
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    take_line(line_, events);
    line_.clear();
  }
  line_.append(bytes);
  return events;
}

void SseParser::take_line(std::string_view line, std::vector<std::string>& events) {
  if (line.empty()) {  // the blank line that ends an event
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    in_event_ = false;
    return;
  }
  in_event_ = true;
  if (line.front() == ':') return;  // a comment, e.g. a keep-alive
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    if (has_data_) data_ += '\n';
    data_.append(value);
    has_data_ = true;
  } else if (field != "id" && field != "event" && field != "retry") {
    throw SseClientError("malformed server-sent event: the line '" + std::string(line) +
                         "' is neither data, id, event, retry nor a comment");
  }
}

// ---- SseClient

SseClient::SseClient(const std::string& url, SseClientOptions options)
    : url_(url), options_(std::move(options)) {
  static const std::regex http_url(R"(http://([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})/?)");
  std::smatch match;
  if (!std::regex_match(url, match, http_url) || std::stoi(match[2].str()) > 65535)
    throw std::invalid_argument("expected a server's root URL, http://HOST:PORT, got '" + url +
                                "'");
  host_ = match[1].str();
  if (host_.front() == '[') host_ = host_.substr(1, host_.size() - 2);
  port_ = std::stoi(match[2].str());
  if (url_.back() == '/') url_.pop_back();
}

namespace {

httplib::Client make_client(const std::string& host, int port, const SseClientOptions& options) {
  httplib::Client client(host, port);
  client.set_connection_timeout(options.connect_timeout);
  client.set_read_timeout(options.read_timeout);
  client.set_write_timeout(options.read_timeout);
  return client;
}

httplib::Headers auth_headers(const SseClientOptions& options) {
  if (options.api_key.empty()) return {};
  return {{"Authorization", "Bearer " + options.api_key}};
}

std::string failure(const std::string& what, const std::string& url, httplib::Error error,
                    const SseClientOptions& options) {
  std::string reason;
  switch (error) {
    case httplib::Error::Connection:
      reason = "cannot connect";
      break;
    case httplib::Error::ConnectionTimeout:
      reason = "no connection within " + std::to_string(options.connect_timeout.count()) + " s";
      break;
    case httplib::Error::Read:
      reason = "the connection broke, or no bytes came for " +
               std::to_string(options.read_timeout.count()) + " s";
      break;
    default:
      reason = "httplib error " + httplib::to_string(error);
  }
  return what + ": no answer from " + url + ": " + reason;
}

}  // namespace

std::string SseClient::get(const std::string& path) const {
  httplib::Client client = make_client(host_, port_, options_);
  const httplib::Result result = client.Get(path, auth_headers(options_));
  if (!result) throw SseClientError(failure("GET " + path, url_, result.error(), options_));
  if (result->status != 200)
    throw SseClientError("GET " + url_ + path + ": HTTP " + std::to_string(result->status) + ": " +
                         shown_body(result->body));
  return result->body;
}

void SseClient::post_stream(const std::string& path, const std::string& json_body,
                            const std::function<void(std::string_view data)>& on_event) const {
  const std::string what = "POST " + url_ + path;
  httplib::Client client = make_client(host_, port_, options_);
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.headers = auth_headers(options_);
  request.set_header("Accept", "text/event-stream");
  request.set_header("Content-Type", "application/json");
  request.body = json_body;

  int status = 0;
  bool is_event_stream = false;
  std::string error_body;  // the body of an answer that is not a stream
  SseParser parser;
  std::exception_ptr thrown;  // from the parser or on_event, rethrown after the request ended
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    is_event_stream = response.get_header_value("Content-Type").starts_with("text/event-stream");
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status != 200 || !is_event_stream) {
      error_body.append(data, std::min(size, kErrorBodyShown + 1));
      return error_body.size() <= kErrorBodyShown;
    }
    try {
      for (const std::string& event : parser.push(std::string_view(data, size))) on_event(event);
      return true;
    } catch (...) {
      thrown = std::current_exception();
      return false;
    }
  };

  const httplib::Result result = client.send(request);
  if (thrown) std::rethrow_exception(thrown);
  if (status != 0 && status != 200)
    throw SseClientError(what + ": HTTP " + std::to_string(status) + ": " + shown_body(error_body));
  if (status == 200 && !is_event_stream)
    throw SseClientError(what +
                         ": the answer is not a text/event-stream: " + shown_body(error_body));
  if (!result) throw SseClientError(failure(what, url_, result.error(), options_));
  if (parser.inside_event())
    throw SseClientError(what + ": the stream ended inside an event (no blank line after it)");
}

}  // namespace pipeline
