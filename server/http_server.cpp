#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include <httplib.h>
#include <sys/socket.h>

#include "server/connection_threads.h"
#include "server/event_stream.h"
#include "server/http_counters.h"
#include "server/http_request_checks.h"
#include "server/http_routes.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/peer_connection.h"
#include "server/response_queue.h"
#include "server/token_endpoints.h"

namespace pipeline {

using json = ResponseJson;

namespace {

// After the engine ended every request: how long the last chunks may take to reach clients,
// at least (they have what is left of the grace, if more).
constexpr std::chrono::seconds kDrainLimit{1};
// What the last chunks get once a second signal ended the grace: enough for a client that reads
// (an error answer takes a millisecond), not for one that stopped.
constexpr std::chrono::milliseconds kDrainAfterGrace{250};
// How long a connection must have received nothing to count as idle (at shutdown, and when
// connections wait for a thread): a request's bytes arrive within milliseconds of each other,
// and httplib may hold them unrouted meanwhile.
constexpr std::chrono::milliseconds kRequestQuiet{500};
// How long a connection may hold a thread sending one request while other connections wait for
// a thread (httplib's own timeouts are 5 s): a client that trickles its headers is never
// quiet, and enough of them would shut everyone else out for as long as they trickle.
constexpr std::chrono::seconds kSlowRequestLimit{5};

constexpr const char* kJson = "application/json";

void reply_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(to_json_text(body), kJson);
}

void reply_error(httplib::Response& res, const RequestError& error) {
  reply_json(res, error.http_status, error_body(error));
}

// Answers a call the server answers itself, without the engine: `answer`'s JSON, or the error
// it refused the request with.
void reply_answer(httplib::Response& res, const std::function<json()>& answer) {
  try {
    reply_json(res, 200, answer());
  } catch (const ApiError& e) {
    reply_error(res, e.error());
  }
}

RequestError make_error(int status, std::string message, std::string type, std::string code) {
  RequestError error;
  error.http_status = status;
  error.message = std::move(message);
  error.type = std::move(type);
  error.code = std::move(code);
  return error;
}

}  // namespace

size_t connection_threads(const ServeConfig& config) {
  return size_t(config.scheduler.max_num_seqs) + size_t(config.server.max_queue) + 16;
}

struct HttpServer::Impl {
  explicit Impl(Engine& engine_ref)
      : engine(engine_ref),
        served(served_model(engine_ref.model_name(), engine_ref.config(), engine_ref.tokenizer())),
        tokenize_settings{engine_ref.chat_template(), engine_ref.max_model_len()},
        created(std::time(nullptr)) {
    // With fewer threads than connection_threads(), requests past them would wait unseen in
    // httplib's own queue instead of getting their place or their 503. They start as
    // connections arrive, so an idle server holds none.
    const size_t threads = connection_threads(engine.config());
    server.new_task_queue = [this, threads] {
      return new ConnectionThreads(threads,
                                   [this] { stop_reading_idle(kRequestQuiet, &slow_senders); });
    };
    // Persistent connections no longer hold threads they do not use (above), so a client may
    // keep its connection for a million requests, without a bound in practice as with uvicorn
    // (httplib's default closes it after 5).
    server.set_keep_alive_max_count(1'000'000);
    server.set_payload_max_length(kMaxRequestBytes);
    // Stream chunks are small writes: send each at once rather than wait for an ACK (Nagle).
    server.set_tcp_nodelay(true);
    // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets a second server
    // share a port in use instead of failing. And remember the listening socket (the first one
    // httplib creates) to widen its backlog.
    server.set_socket_options([this](socket_t sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      if (listen_socket < 0) listen_socket = sock;
    });
    install_routes();
    install_guards();
  }

  // A route's handler, its connection counted as answering while it runs. httplib reads a
  // request's body after the pre-routing handler and before this, so a connection still
  // sending its body is not answering yet, and shutdown may end it.
  httplib::Server::Handler answered(httplib::Server::Handler handler) {
    return
        [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
          answering.begin(req);
          if (auto refused = pending_refusal(req)) return reply_error(res, *refused);
          handler(req, res);
        };
  }

  void install_routes() {
    server.Post("/v1/chat/completions",
                answered([this](const httplib::Request& req, httplib::Response& res) {
                  handle_completion(Endpoint::ChatCompletions, req, res);
                }));
    server.Post("/v1/completions",
                answered([this](const httplib::Request& req, httplib::Response& res) {
                  handle_completion(Endpoint::Completions, req, res);
                }));
    server.Post("/tokenize", answered([this](const httplib::Request& req, httplib::Response& res) {
                  reply_answer(res, [&] {
                    return tokenize_response(parse_json_body(req.body), served, tokenize_settings);
                  });
                }));
    server.Post(
        "/detokenize", answered([this](const httplib::Request& req, httplib::Response& res) {
          reply_answer(res, [&] { return detokenize_response(parse_json_body(req.body), served); });
        }));
    server.Get(
        "/v1/models", answered([this](const httplib::Request&, httplib::Response& res) {
          reply_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
        }));
    server.Get("/v1/models/(.+)",
               answered([this](const httplib::Request& req, httplib::Response& res) {
                 if (req.matches[1] == served.name) return reply_json(res, 200, model_object());
                 reply_error(
                     res, make_error(404, "The model '" + req.matches[1].str() + "' does not exist",
                                     "invalid_request_error", "model_not_found"));
               }));
    server.Get("/health", answered([this](const httplib::Request&, httplib::Response& res) {
                 if (const auto why = engine.failure())
                   return reply_json(res, 503, {{"status", "engine_failed"}, {"error", *why}});
                 if (stopping.load()) return reply_json(res, 503, {{"status", "shutting_down"}});
                 reply_json(res, 200, {{"status", "ok"}});
               }));
    server.Get("/metrics", answered([this](const httplib::Request&, httplib::Response& res) {
                 res.set_content(engine.metrics_text() + counters.prometheus_text(active.load()),
                                 "text/plain; version=0.0.4");
               }));
  }

  // Authentication, OpenAI-style bodies for httplib's own errors, counters, and which
  // connections are answering.
  void install_guards() {
    // Decides what to refuse before httplib reads the body; the route (or the error handler,
    // for a request no route took) answers it after (pending_refusal).
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      pending(req).headers.erase(kEndConnection);
      if (is_preflight(req) && !engine.config().server.allowed_origins.empty())
        return answer_preflight(req, res);
      if (!body_length_clear(req)) {
        // Unread, the body's bytes would be taken for a next request: the connection ends.
        end_connection_after(req, res);
        reply_error(res, make_error(400,
                                    "The request's body length is unclear: Content-Length must be "
                                    "one number, and not beside Transfer-Encoding.",
                                    "invalid_request_error", ""));
        return httplib::Server::HandlerResponse::Handled;
      }
      pending(req).headers.erase(kRefusedEncoding);
      pending(req).headers.erase(kRefusedKey);
      take_off_body_encoding(req);
      take_path_of_absolute_form(req);
      // As vLLM's --api-key: the API's /v1 routes need the key; /health, /metrics (a Prometheus
      // scrape carries no key) and the token routes do not.
      const std::string& key = engine.config().server.api_key;
      if (!key.empty() && req.path.starts_with("/v1") &&
          !bearer_matches(req.get_header_value("Authorization"), key))
        pending(req).set_header(kRefusedKey, "1");
      // A POST without Content-Length or Transfer-Encoding has no body (RFC 9112, 6.3), which
      // httplib would wait for until its read timeout (5 s): refused now, as it would be then
      // (the error handler words it).
      if (req.method == "POST" && !req.has_header("Content-Length") &&
          !req.has_header("Transfer-Encoding")) {
        res.status = 400;
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    const httplib::Server::HandlerWithResponse on_error = [this](const httplib::Request& req,
                                                                 httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      answering.begin(req);
      // Without the key nothing is said about the routes, as before any route was looked up.
      if (auto refused = pending_refusal(req); refused && refused->http_status == 401)
        reply_error(res, *refused);
      else
        reply_unanswered(req, res);
      return httplib::Server::HandlerResponse::Handled;
    };
    server.set_error_handler(on_error);
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr thrown) {
          std::string message = "internal error";
          try {
            std::rethrow_exception(thrown);
          } catch (const std::exception& e) {
            message += ": " + std::string(e.what());
          } catch (...) {
          }
          reply_error(res, make_error(500, message, "server_error", ""));
        });
    // Counted before the response is written (the logger runs after it), so a client that
    // reads /metrics right after an answer finds that answer counted.
    server.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      counters.count(route_label(req.path), res.status);
      const std::string origin =
          allow_origin(engine.config().server.allowed_origins, req.get_header_value("Origin"));
      if (origin.empty()) return;
      res.set_header("Access-Control-Allow-Origin", origin);
      if (origin != "*") res.set_header("Vary", "Origin");
    });
    server.set_logger([this](const httplib::Request& req, const httplib::Response&) {
      answering.end(req);
      if (req.has_header(kEndConnection))
        PeerConnection(req.remote_addr, req.remote_port, port).end();
    });
  }

  // Answered before the API key is asked for, which a preflight never carries; its
  // Access-Control-Allow-Origin comes with every answer's (post-routing handler).
  httplib::Server::HandlerResponse answer_preflight(const httplib::Request& req,
                                                    httplib::Response& res) const {
    const std::string origin = req.get_header_value("Origin");
    if (allow_origin(engine.config().server.allowed_origins, origin).empty()) {
      reply_error(res, make_error(400,
                                  "Disallowed CORS origin: " + origin +
                                      " is not in the server's server.allowed_origins.",
                                  "invalid_request_error", "cors_origin_not_allowed"));
      return httplib::Server::HandlerResponse::Handled;
    }
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string headers = req.get_header_value("Access-Control-Request-Headers");
    if (!headers.empty()) res.set_header("Access-Control-Allow-Headers", headers);
    res.set_header("Access-Control-Max-Age", "600");
    return httplib::Server::HandlerResponse::Handled;
  }

  // httplib answered without a handler (res.status says how): no route, a known route with
  // another method (405, with the Allow header), or a protocol-level refusal such as 413.
  static void reply_unanswered(const httplib::Request& req, httplib::Response& res) {
    const std::string allowed = allowed_method(req.path);
    // httplib refuses a POST whose body it cannot read (no Content-Length, say) before routing,
    // with a 400 that says nothing of the route: the route's own 404 or 405 comes first.
    if (res.status == 400 || res.status == 404) {
      if (allowed.empty())
        return reply_error(
            res, make_error(404, "Unknown request URL: " + req.method + " " + req.path + ".",
                            "invalid_request_error", "unknown_url"));
      if (req.method != allowed) {
        res.set_header("Allow", allowed);
        return reply_error(
            res, make_error(
                     405, req.method + " is not allowed on " + req.path + "; use " + allowed + ".",
                     "invalid_request_error", "method_not_allowed"));
      }
      if (auto cut = body_cut_short(req)) {
        // The rest of the body may still come, and would be read as a next request.
        end_connection_after(req, res);
        return reply_error(res, *cut);
      }
      // A GET has no body to blame: its request line or headers were what httplib could not read.
      if (req.method == "GET")
        return reply_error(res, make_error(400,
                                           "The request could not be read: a header is malformed "
                                           "or longer than the 8 KiB a header line may hold.",
                                           "invalid_request_error", ""));
      // A body httplib gave up on part-way (a malformed chunk) leaves the connection at an
      // unknown place in it: what follows would be read as a next request.
      if (req.has_header("Transfer-Encoding") || req.has_header("Content-Length"))
        end_connection_after(req, res);
      return reply_error(res, make_error(400,
                                         "The request body could not be read: a " + req.method +
                                             " needs a body with a Content-Length header (or "
                                             "chunked), all of it, uncompressed, and header lines "
                                             "of at most 8 KiB.",
                                         "invalid_request_error", ""));
    }
    reply_error(res,
                make_error(res.status, refusal_message(res.status), "invalid_request_error", ""));
  }

  // What httplib's other refusals mean, with its limits (Debian's build: a URL of 8 KiB).
  static std::string refusal_message(int status) {
    if (status == 413)
      return "The request body is larger than the " + std::to_string(kMaxRequestBytes >> 20) +
             " MiB a request may hold.";
    if (status == 414) return "The request URL is longer than the 8 KiB this server reads.";
    return "The request was refused (HTTP " + std::to_string(status) + ").";
  }

  // OpenAI's model object, and vLLM's max_model_len, which clients size prompts by.
  json model_object() const {
    return {{"id", served.name},
            {"object", "model"},
            {"created", created},
            {"owned_by", "llm-pipeline"},
            {"max_model_len", tokenize_settings.max_model_len}};
  }

  void handle_completion(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    auto active_response = std::make_unique<ActiveResponse>(active);
    ParsedRequest parsed;
    try {
      parsed = parse_openai_request(endpoint, parse_json_body(req.body), served);
    } catch (const ApiError& e) {
      return reply_error(res, e.error());
    }
    auto queue = std::make_shared<ResponseQueue>();
    auto requests = choice_requests(parsed);
    for (size_t i = 0; i < requests.size(); ++i) requests[i]->sink = queue->sink_for(int(i));
    if (stopping.load()) return reply_error(res, shutting_down_error());
    switch (engine.submit(requests)) {
      case SubmitStatus::Accepted:
        break;
      case SubmitStatus::QueueFull:
        for (const auto& request : requests)
          if (auto refusal = engine.refusal_whatever_the_load(*request))
            return reply_error(res, *refusal);
        // As RFC 9110 suggests for a 503; the openai SDKs wait that long before their retry.
        res.set_header("Retry-After", "1");
        return reply_error(res, make_error(503,
                                           "The server is overloaded: its queue of " +
                                               std::to_string(engine.config().server.max_queue) +
                                               " waiting sequences (one per choice) has no room "
                                               "for this request. Retry later.",
                                           "server_error", "queue_full"));
      case SubmitStatus::ShuttingDown:
        return reply_error(res, shutting_down_error());
      case SubmitStatus::EngineFailed:
        return reply_error(res, engine_failed_error(engine.failure().value_or("")));
    }
    auto choices = std::make_shared<CallChoices>(engine, std::move(requests));
    ResponseBuilder builder(parsed, served.name,
                            [this](int32_t token) { return engine.tokenizer().token_text(token); });
    const PeerConnection peer(req.remote_addr, req.remote_port, port);
    ClientWatch client(peer);
    // Nothing is committed before the first event, so an error the pipeline raises before the
    // first token (a prompt longer than the context, say) still gets its own status; but a
    // stream that waits longer than its keep-alive interval starts without it.
    const std::chrono::seconds keepalive(engine.config().server.sse_keepalive_s);
    const bool stream_may_start = parsed.options.stream && keepalive.count() > 0;
    Waited waited = wait_event(*queue, client, *choices,
                               stream_may_start ? std::optional(keepalive) : std::nullopt);
    if (waited.client_left) return reply_error(res, client_gone_error());
    std::optional<ChoiceEvent>& first = waited.event;
    if (first)
      if (auto* error = std::get_if<RequestError>(&first->event)) {
        choices->end_all(*error);
        return reply_error(res, *error);
      }
    if (!parsed.options.stream)
      return reply_whole(res, *queue, client, *choices, builder, std::move(*first));
    // From here the stream's writes tell whether the client is still there.
    auto stream = std::make_shared<EventStream>(
        std::move(choices), std::move(queue), std::move(builder), parsed.options.include_usage,
        std::move(first), keepalive, std::move(active_response));
    res.set_header("Cache-Control", "no-cache");
    auto next = [stream](size_t, httplib::DataSink& out) { return stream->write_next(out); };
    auto released = [stream](bool success) { stream->released(success); };
    // HTTP/1.0 has no chunked encoding, and nginx, whose proxying speaks it by default, refuses
    // a chunked answer: there the stream is the body up to the connection's end, which httplib
    // closes after an HTTP/1.0 request that did not ask to be kept alive.
    if (req.version == "HTTP/1.0" && req.get_header_value("Connection") != "Keep-Alive")
      res.set_content_provider("text/event-stream", std::move(next), std::move(released));
    else
      res.set_chunked_content_provider("text/event-stream", std::move(next), std::move(released));
  }

  // What waiting for a call's next event came to: the event, none within the limit, or the
  // client gone (and then every choice is cancelled).
  struct Waited {
    std::optional<ChoiceEvent> event;
    bool client_left = false;
  };

  Waited wait_event(ResponseQueue& queue, ClientWatch& client, CallChoices& choices,
                    std::optional<std::chrono::seconds> limit = std::nullopt) {
    const auto until = std::chrono::steady_clock::now() + limit.value_or(std::chrono::seconds(0));
    while (true) {
      std::optional<ChoiceEvent> event = queue.next(kEventPoll);
      if (client.left()) {
        choices.cancel_all();
        return {std::nullopt, true};
      }
      if (event || (limit && std::chrono::steady_clock::now() >= until)) return {std::move(event)};
    }
  }

  // Collects every choice's whole answer, or gives up when the client leaves or a choice fails.
  void reply_whole(httplib::Response& res, ResponseQueue& queue, ClientWatch& client,
                   CallChoices& choices, ResponseBuilder& builder, ChoiceEvent event) {
    while (true) {
      if (auto* delta = std::get_if<Delta>(&event.event)) {
        builder.append(*delta, event.choice);
      } else if (auto* completion = std::get_if<Completion>(&event.event)) {
        if (choices.finish(event.choice, *completion))
          return reply_json(res, 200, builder.whole_response(choices.completions()));
      } else {
        const auto& error = std::get<RequestError>(event.event);
        choices.end_all(error);
        return reply_error(res, error);
      }
      Waited next = wait_event(queue, client, choices);
      if (next.client_left) return reply_error(res, client_gone_error());
      event = std::move(*next.event);
    }
  }

  static RequestError client_gone_error() {
    return make_error(kClientGoneStatus, "The client closed the connection.",
                      "invalid_request_error", "cancelled");
  }

  // Ends the reading side of each connection that holds a thread without a request to answer
  // and received nothing for `quiet` (or, with `slow`, has been sending one for its limit): its
  // thread sees the end and closes it.
  void stop_reading_idle(std::chrono::milliseconds quiet, SlowSenders* slow = nullptr) {
    stop_reading_idle_connections(
        port, quiet,
        [this](const std::string& host, int client_port) {
          return answering.contains(host, client_port);
        },
        slow);
  }

  static RequestError shutting_down_error() {
    return make_error(503, "The server is shutting down.", "server_error", "shutting_down");
  }

  Engine& engine;
  ServedModel served;
  TokenizeSettings tokenize_settings;
  int64_t created;
  httplib::Server server;
  int listen_socket = -1;
  int port = 0;  // the port bound, which identifies a request's connection (PeerConnection)
  HttpCounters counters;
  ConnectionsAnswering answering;
  SlowSenders slow_senders{kSlowRequestLimit, {}, {}};  // the relieving thread's alone
  std::atomic<int64_t> active{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> grace_ended{false};
  std::mutex serve_mutex;  // orders serve() against shutdown()
  bool serving = false;    // serve() was entered (under serve_mutex)
  std::atomic<bool> serve_returned{false};
};

HttpServer::HttpServer(Engine& engine) : impl_(std::make_unique<Impl>(engine)) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? impl_->server.bind_to_any_port(host)
                              : (impl_->server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) +
                             " (address in use or not available)");
  impl_->port = bound;
  // httplib 0.11 listens with a backlog of 5: a burst of clients connecting at once would
  // overflow it and wait a second for TCP to retry. Listening again only widens the backlog.
  ::listen(impl_->listen_socket, SOMAXCONN);
  return bound;
}

bool HttpServer::serve() {
  {
    std::lock_guard lock(impl_->serve_mutex);
    if (impl_->stopping.load()) return true;
    impl_->serving = true;
  }
  const bool stopped = impl_->server.listen_after_bind();
  impl_->serve_returned.store(true);
  return stopped;
}

void HttpServer::end_grace() {
  impl_->grace_ended.store(true);
  impl_->engine.end_grace();
}

void HttpServer::shutdown(std::chrono::milliseconds grace) {
  bool serving = false;
  {
    std::lock_guard lock(impl_->serve_mutex);
    impl_->stopping.store(true);
    serving = impl_->serving;
  }
  const auto grace_end = std::chrono::steady_clock::now() + grace;
  impl_->engine.shutdown(grace);
  // Every request has ended in the engine; give connection threads time to write the ends.
  auto deadline = std::max(grace_end, std::chrono::steady_clock::now() + kDrainLimit);
  bool grace_ended = false;
  while (impl_->active.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    if (!grace_ended && impl_->grace_ended.load()) {
      grace_ended = true;
      deadline = std::min(deadline, std::chrono::steady_clock::now() + kDrainAfterGrace);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A thread still answering writes to a client that stopped reading: each write would wait
  // out httplib's 5 s timeout. Its answer is lost either way.
  if (impl_->active.load() > 0) end_every_connection(impl_->port);
  // httplib's stop() does nothing before its accept loop runs: repeat it until serve() returned.
  // serve() returns when every connection thread has: a thread on an idle keep-alive connection
  // would wait out its 5 s timeout for a next request, so idle connections stop reading.
  // At first only quiet ones: a request whose bytes just came may not be routed yet. After
  // kRequestQuiet every connection not answering: a request still arriving (a body sent byte by
  // byte) would only be refused, and its connection thread would hold the exit for as long as
  // the client kept sending.
  const auto reading_any_after = std::chrono::steady_clock::now() + kRequestQuiet;
  while (serving && !impl_->serve_returned.load()) {
    impl_->server.stop();
    const bool any = std::chrono::steady_clock::now() >= reading_any_after;
    impl_->stop_reading_idle(any ? std::chrono::milliseconds(0) : kRequestQuiet);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace pipeline
