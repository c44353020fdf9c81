// The client connections of the HTTP server, found among the process's descriptors, because
// cpp-httplib 0.11 (Debian's) gives no handle on them:
// - the connection an HTTP request arrived on, so that a handler waiting on the engine can tell
//   that its client has left and cancel the request, rather than compute an answer nobody will
//   read (later httplib versions have Request::is_connection_closed). It is found by its two
//   ends: the client's address and port, which the request carries, and the server's own port;
// - at shutdown, every connection on the server's port, so that idle keep-alive connections end
//   at once instead of holding their threads, and the exit, until their timeout.
#pragma once

#include <functional>
#include <string>

namespace pipeline {

// Ends the reading side of every idle connection accepted on local_port: not those whose
// client `answering(host, port)` names, nor those with a request's bytes waiting to be read. A
// connection thread waiting for a next request on an idle keep-alive connection sees its end
// and closes it. Not for a connection with an answer still
// to write: httplib takes a socket that reads its end for a client gone, and stops writing.
// For shutdown, once the listener has stopped.
void stop_reading_idle_connections(
    int local_port, const std::function<bool(const std::string& host, int port)>& answering);

class PeerConnection {
 public:
  // Looks for the connected socket from remote_addr:remote_port (as httplib writes them: a
  // numeric host) to local_port; without one, closed() stays false.
  PeerConnection(const std::string& remote_addr, int remote_port, int local_port);

  bool found() const { return fd_ >= 0; }
  // True once the client has closed or reset the connection. Only while the handler runs: the
  // socket is closed, and its number free for reuse, after the response is written.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace pipeline
