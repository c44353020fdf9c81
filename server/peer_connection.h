// The client connection an HTTP request arrived on, so that a handler waiting on the engine can
// tell that its client has left and cancel the request, rather than compute an answer nobody
// will read. cpp-httplib 0.11 (Debian's) gives a handler no handle on its socket (later
// versions have Request::is_connection_closed), so the socket is found among the process's
// descriptors by its two ends: the client's address and port, which the request carries, and
// the server's own port.
#pragma once

#include <string>

namespace pipeline {

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
