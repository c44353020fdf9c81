#include "server/connection_threads.h"

namespace pipeline {

void ConnectionsAnswering::begin(const httplib::Request& req) {
  std::lock_guard lock(mutex_);
  clients_.emplace(req.remote_addr, req.remote_port);
}

void ConnectionsAnswering::end(const httplib::Request& req) {
  std::lock_guard lock(mutex_);
  clients_.erase({req.remote_addr, req.remote_port});
}

bool ConnectionsAnswering::contains(const std::string& host, int port) const {
  std::lock_guard lock(mutex_);
  return clients_.count({host, port}) != 0;
}

}  // namespace pipeline
