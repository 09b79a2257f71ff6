// The value of the first /proc/cpuinfo line that starts with `key` (e.g.
// "model name", "cpu family", "model\t"), or "unknown". For the C++
// benchmarks' JSON headers; bench/common.py does the same for the Python ones.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

inline std::string cpuinfo_field(const char* key) {
  std::string out = "unknown";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, key, std::strlen(key)) == 0 && std::strchr(line, ':')) {
        out = std::strchr(line, ':') + 1;
        out.erase(0, out.find_first_not_of(" \t"));
        out.erase(out.find_last_not_of("\n ") + 1);
        break;
      }
    }
    std::fclose(f);
  }
  return out;
}
