// A listening socket held on the server's address while `pipeline run` loads its model, so that
// a second server started on a port already in use fails at once, naming it, rather than after
// it has loaded gigabytes of weights (on a host with room for one model, that load got the
// running server killed for memory). Released just before the HTTP server binds the address.
#pragma once

#include <string>

namespace pipeline {

class PortClaim {
 public:
  // Listens on host:port as the HTTP server will (SO_REUSEADDR, no SO_REUSEPORT). Throws
  // std::runtime_error naming them and why when it cannot (a host that does not resolve, an
  // address in use or not this machine's). Port 0 (any free port) claims nothing once the host
  // has proved to take one.
  PortClaim(const std::string& host, int port);
  ~PortClaim();
  PortClaim(const PortClaim&) = delete;
  PortClaim& operator=(const PortClaim&) = delete;

  // Closes the socket (connections that arrived meanwhile are refused).
  void release();

 private:
  int socket_ = -1;
};

}  // namespace pipeline
