// log_test.cc — the log line format (UTC timestamp with ms, pid, level, component) and the sink's
// one-write-per-line output. Built into config_test: config and logs are the two hygiene pieces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>
#include <string>

#include "pos/base/log.h"
#include "unittest/stderr_capture.h"

namespace pos {
namespace {

TEST(LogTest, ALineCarriesAUtcTimestampWithMillisecondsThePidTheLevelAndTheComponent) {
  char buf[256];
  const timespec wall{1700000000, 123456789};  // 2023-11-14T22:13:20.123456789Z
  const size_t n = format_log_line(buf, sizeof(buf), LogLevel::kWarn, "posd", wall, 4242, "pid 7 sent no valid hello");
  EXPECT_EQ(std::string(buf, n), "2023-11-14T22:13:20.123Z pos[4242] warn posd: pid 7 sent no valid hello\n");
  const timespec early{86400 * 365, 5000000};  // 1971-01-01T00:00:00.005Z: milliseconds keep their zeros
  const size_t m = format_log_line(buf, sizeof(buf), LogLevel::kDebug, "ckpt", early, 1, "x");
  EXPECT_EQ(std::string(buf, m), "1971-01-01T00:00:00.005Z pos[1] debug ckpt: x\n");
}

TEST(LogTest, AClientComponentNamesTheClientAndItsJob) {
  EXPECT_EQ(client_component(3, "mlp_train"), "client 3 (job mlp_train)");
  EXPECT_EQ(client_component(65537, ""), "client 65537");
}

TEST(LogTest, AMessageTooLongForTheLineIsCutMarkedAndStillEndsTheLine) {
  char buf[64];
  const timespec wall{0, 0};
  const std::string longer(200, 'x');
  const size_t n = format_log_line(buf, sizeof(buf), LogLevel::kError, "posd", wall, 1, longer);
  const std::string line(buf, n);
  EXPECT_EQ(n, sizeof(buf) - 1);
  EXPECT_EQ(line.rfind("...\n"), line.size() - 4) << line;
  EXPECT_EQ(line.find("1970-01-01T00:00:00.000Z pos[1] error posd: xxx"), 0u) << line;
}

TEST(LogTest, LogMacrosWriteOneWholeLineToStderrAndNothingBelowTheLevel) {
  const int before = g_log_level.load();
  set_log_level(LogLevel::kWarn);
  test::StderrCapture cap("log_test");
  POS_WARN(client_component(3, "mlp_train"), "stop checkpoint failed (%s); the client runs on", "disk full");
  POS_DEBUG("posd", "not at this level");
  cap.stop();
  g_log_level.store(before);
  const std::string out = cap.text();
  const std::regex line("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z pos\\[" +
                        std::to_string(::getpid()) +
                        "\\] warn client 3 \\(job mlp_train\\): stop checkpoint failed \\(disk full\\); the client runs on\n");
  EXPECT_TRUE(std::regex_match(out, line)) << "captured: [" << out << "]";
}

}  // namespace
}  // namespace pos
