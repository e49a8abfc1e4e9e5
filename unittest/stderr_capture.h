// stderr_capture.h — sends this process's fd 2 to a file for a while, so a test can read the log
// lines POS wrote (log_line writes to fd 2). Used by the log tests and posd's probe test.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace pos::test {

class StderrCapture {
 public:
  explicit StderrCapture(const std::string& name)
      : path_(::testing::TempDir() + name + "-" + std::to_string(::getpid()) + ".stderr") {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << "cannot create " << path_;
    saved_ = ::dup(STDERR_FILENO);
    if (fd >= 0) {
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
  }
  ~StderrCapture() { stop(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Puts fd 2 back; text() still reads what was captured.
  void stop() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string text() const {
    std::ifstream f(path_);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // The captured lines that POS logged at `level` ("warn", "error", ...).
  std::vector<std::string> lines_at(const std::string& level) const {
    const std::regex at("^\\S+ pos\\[[0-9]+\\] " + level + " ");
    std::vector<std::string> out;
    std::istringstream in(text());
    for (std::string line; std::getline(in, line);)
      if (std::regex_search(line, at)) out.push_back(line);
    return out;
  }

 private:
  std::string path_;
  int saved_ = -1;
};

}  // namespace pos::test
