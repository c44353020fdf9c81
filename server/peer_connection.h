// The client connections of the HTTP server, found among the process's descriptors, because
// cpp-httplib 0.11 (Debian's) gives no handle on them:
// - the connection an HTTP request arrived on, so that a handler waiting on the engine can tell
//   that its client has left and cancel the request, rather than compute an answer nobody will
//   read (later httplib versions have Request::is_connection_closed). It is found by its two
//   ends: the client's address and port, which the request carries, and the server's own port;
// - at shutdown, every connection on the server's port, so that idle keep-alive connections end
//   at once instead of holding their threads, and the exit, until their timeout.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>

namespace pipeline {

// Ends the reading side of every idle connection accepted on local_port, so that a connection
// thread waiting for a next request on it sees its end and closes it. A connection is not idle
// while `answering(host, port)` names its client (httplib takes a socket whose reads have ended
// for a client gone and stops writing, so an answer would be cut), while a request's bytes wait
// to be read, nor when it received bytes (or opened) less than `quiet` ago: httplib may hold a
// request it read but has not routed yet. For shutdown, once the server was told to stop.
//
// With `slow`, also ends the connections that hold a thread while their client sends a request
// (bytes arrive, and a thread takes them as they come) which slow has seen sending, call after
// call, for slow->limit or longer (a call that finds bytes waiting unread starts it again): a
// client that trickles a header line more often than `quiet` is never idle, and enough of them
// would hold every thread for as long as they trickle.
//
// With `slow`, a connection seen with a request's bytes waiting unread is also not idle until
// `quiet` after the call that last saw them waiting: a connection queued for a thread keeps its
// bytes in the kernel, so once a thread has read them (and before httplib routes the request)
// the time they arrived says nothing of how long ago they were read.
struct SlowSenders {
  std::chrono::milliseconds limit;
  using Clients = std::map<std::pair<std::string, int>, std::chrono::steady_clock::time_point>;
  // The clients (host, port) seen sending, and since when; those not seen by a call are dropped.
  Clients since;
  // The clients last seen with bytes waiting, and when, for `quiet` after.
  Clients waiting;
};
void stop_reading_idle_connections(
    int local_port, std::chrono::milliseconds quiet,
    const std::function<bool(const std::string& host, int port)>& answering,
    SlowSenders* slow = nullptr);

// Shuts both directions of every connection accepted on local_port, answering or not: a thread
// blocked writing to a client that stopped reading sees the write fail at once. For the end of
// a shutdown.
void end_every_connection(int local_port);

class PeerConnection {
 public:
  // Looks for the connected socket from remote_addr:remote_port (as httplib writes them: a
  // numeric host) to local_port; without one, closed() stays false.
  PeerConnection(const std::string& remote_addr, int remote_port, int local_port);

  bool found() const { return fd_ >= 0; }
  // True once the client has closed or reset the connection. Only while the handler runs: the
  // socket is closed, and its number free for reuse, after the response is written.
  bool closed() const;
  // Shuts both directions of the connection: httplib's thread sees its end instead of a next
  // request, and closes it. Only once the answer was written (httplib's logger).
  void end() const;

 private:
  int fd_ = -1;
};

}  // namespace pipeline
