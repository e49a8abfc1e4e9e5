// config_test.cc — YAML configuration: defaults, sizes, validation with the offending key named.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "pos/config.h"

namespace pos {
namespace {

TEST(Config, EmptyDocumentGivesWorkingDefaults) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, "host");
  EXPECT_EQ(c->memory_quota, 0u);
  EXPECT_GT(c->queue_depth, 0u);
  EXPECT_EQ(c->checkpoint_mode, "off");
}

TEST(Config, ParsesEverySection) {
  auto c = parse_config(R"(
backend: host
log_level: debug
client: {max_clients: 8, memory_quota: 2GiB, va_size: 256GiB}
queues: {depth: 1024, spin_us: 10, record_latency: true, delayed_verdict: off}
host_backend: {device_count: 2, device_memory: 8GiB, device_name: Test}
checkpoint: {mode: async}
)");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_EQ(c->max_clients, 8u);
  EXPECT_EQ(c->memory_quota, 2ull << 30);
  EXPECT_EQ(c->va_size, 256ull << 30);
  EXPECT_EQ(c->queue_depth, 1024u);
  EXPECT_EQ(c->spin_ns, 10000u);
  EXPECT_TRUE(c->record_latency);
  EXPECT_EQ(c->delayed_verdict, VerdictLook::kImmediate);
  EXPECT_EQ(c->host_device_count, 2u);
  EXPECT_EQ(c->host_device_name, "Test");
  EXPECT_EQ(c->checkpoint_mode, "async");
}

TEST(Config, RejectsUnknownKeysAndBadValuesNamingThem) {
  auto a = parse_config("backnd: host");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("backnd"), std::string::npos);
  auto b = parse_config("client: {memory_quota: lots}");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("memory_quota"), std::string::npos);
  EXPECT_FALSE(parse_config("backend: tpu").ok());
  EXPECT_FALSE(parse_config("queues: {depth: 1}").ok());
  EXPECT_FALSE(parse_config("checkpoint: {mode: sometimes}").ok());
  auto v = parse_config("queues: {delayed_verdict: maybe}");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("delayed_verdict"), std::string::npos);
  auto d = parse_config("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->delayed_verdict, VerdictLook::kAuto);
  EXPECT_FALSE(parse_config("client: {max_clients: 4096, va_size: 1TiB}").ok());  // exceeds user VA
  EXPECT_FALSE(parse_config("[unclosed").ok());
}

TEST(Config, TheShadowPoolIsAutoByDefaultOrASizeButNeverZero) {
  auto d = parse_config("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->shadow_pool_bytes, 0u);  // auto
  auto a = parse_config("checkpoint: {shadow_pool: auto}");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shadow_pool_bytes, 0u);
  auto s = parse_config("checkpoint: {shadow_pool: 3GiB}");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shadow_pool_bytes, 3ull << 30);
  auto z = parse_config("checkpoint: {shadow_pool: 0}");
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("shadow_pool"), std::string::npos);
}

TEST(Config, PosdDevicesIsAListOfDistinctNonNegativeIndices) {
  EXPECT_TRUE(parse_config("").value().posd_devices.empty());  // default: all devices
  auto c = parse_config("posd: {devices: [0, 2]}");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->posd_devices, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(parse_config("posd: {devices: [3, 1]}").value().posd_devices, (std::vector<int32_t>{3, 1}));
  auto message = [](const std::string& yaml) {
    auto r = parse_config(yaml);
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_NE(message("posd: {devices: [0, -1]}").find("device -1 is negative"), std::string::npos);
  EXPECT_NE(message("posd: {devices: [1, 2, 1]}").find("lists device 1 twice"), std::string::npos);
  EXPECT_NE(message("posd: {devices: 2}").find("posd.devices must be a list"), std::string::npos);
  EXPECT_NE(message("posd: {devices: {a: 1}}").find("posd.devices must be a list"), std::string::npos);
  EXPECT_NE(message("posd: {devices: []}").find("posd.devices is empty"), std::string::npos);
  EXPECT_NE(message("posd: {devices: [gpu0]}").find("'gpu0' is not a device index"), std::string::npos);
  EXPECT_NE(message("posd: {devices: [1.5]}").find("'1.5' is not a device index"), std::string::npos);
  EXPECT_NE(message("posd: {devices: [[0]]}").find("is not a device index"), std::string::npos);
}

TEST(Config, PosdGroupIsAGidOrAName) {
  EXPECT_EQ(parse_config("").value().posd_group, "");
  EXPECT_EQ(parse_config("posd: {group: 44}").value().posd_group, "44");
  EXPECT_EQ(parse_config("posd: {group: video}").value().posd_group, "video");
  EXPECT_EQ(parse_config("posd: {group: -1}").value().posd_group, "");  // none, as before names
}

TEST(Config, SizesAcceptBinaryAndDecimalUnits) {
  EXPECT_EQ(parse_size("64").value(), 64u);
  EXPECT_EQ(parse_size("4KiB").value(), 4096u);
  EXPECT_EQ(parse_size("1.5GiB").value(), 3ull << 29);
  EXPECT_EQ(parse_size("2GB").value(), 2000000000u);
  EXPECT_FALSE(parse_size("GiB").ok());
  EXPECT_FALSE(parse_size("12 parsecs").ok());
}

TEST(Config, EnvironmentNamesTheFileAndOverridesTheBackend) {
  const std::string path = ::testing::TempDir() + "/pos_config_test.yaml";
  std::ofstream(path) << "log_level: info\nclient: {memory_quota: 1MiB}\n";
  setenv("POS_CONFIG", path.c_str(), 1);
  setenv("POS_BACKEND", "host", 1);
  auto c = config_from_environment();
  unsetenv("POS_CONFIG");
  unsetenv("POS_BACKEND");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->memory_quota, 1u << 20);
  EXPECT_EQ(c->log_level, LogLevel::kInfo);
  setenv("POS_CONFIG", "/nonexistent/pos.yaml", 1);
  EXPECT_FALSE(config_from_environment().ok());
  unsetenv("POS_CONFIG");
}

}  // namespace
}  // namespace pos
