// run_program.h — runs a built program (or any command line) through the shell for the tests and
// returns its standard output; on failure its standard error is appended, so an assertion says why.
// Tests that check what the program reports on stderr get it whole through `err`.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace pos::test {

// A variable the test's meson entry sets: its value, or a failure and "".
inline std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) ADD_FAILURE() << name << " is not set (meson sets it)";
  return v != nullptr ? v : "";
}

// A whole file as text ("" if it cannot be read).
inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// Runs a shell command line; its stdout, with its stderr appended when it fails. `err`, when
// given, receives all of stderr.
inline std::string run_shell(std::string cmd, int* exit_code, std::string* err = nullptr) {
  *exit_code = -1;
  if (err != nullptr) err->clear();
  // One file per call: test programs run side by side (and CI beside a developer's runs), and a test
  // may run commands from several threads.
  static std::atomic<unsigned> calls{0};
  const std::string err_file = ::testing::TempDir() + "run_program_stderr-" + std::to_string(::getpid()) + "-" +
                               std::to_string(calls.fetch_add(1)) + ".txt";
  cmd += " 2>" + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run " << cmd;
    return {};
  }
  std::string out;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::string err_text;
  if (FILE* f = std::fopen(err_file.c_str(), "r")) {
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) err_text.append(buf.data(), n);
    std::fclose(f);
  }
  std::remove(err_file.c_str());
  if (*exit_code != 0) out += err_text;
  if (err != nullptr) *err = std::move(err_text);
  return out;
}

// The program is named by environment variable `env_var` (meson sets it); `prefix` goes before it
// on the command line (environment assignments).
inline std::string run_program(const char* env_var, const std::string& prefix, const std::vector<std::string>& args,
                               int* exit_code, std::string* err = nullptr) {
  *exit_code = -1;
  if (err != nullptr) err->clear();
  const char* exe = std::getenv(env_var);
  if (exe == nullptr) {
    ADD_FAILURE() << env_var << " is not set (meson sets it)";
    return {};
  }
  std::string cmd = prefix + exe;
  for (const auto& a : args) cmd += " " + a;
  return run_shell(std::move(cmd), exit_code, err);
}

}  // namespace pos::test
