// Log lines a person can follow, on stderr: "[12:04:31.250] request chatcmpl-1 added ...".
#pragma once

namespace pipeline {

void log_line(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace pipeline
