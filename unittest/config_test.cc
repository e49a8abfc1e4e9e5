// config_test.cc — YAML configuration: defaults, sizes, validation with the offending key named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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
}

TEST(Config, ParsesEverySection) {
  auto c = parse_config(R"(
backend: host
log_level: debug
client: {max_clients: 8, memory_quota: 2GiB, va_size: 256GiB}
queues: {depth: 1024, spin_us: 10, record_latency: true, delayed_verdict: off}
host_backend: {device_count: 2, device_memory: 8GiB, device_name: Test}
checkpoint: {shadow_pool: 1GiB}
posd: {socket: /tmp/p.sock, arena: 64MiB, arena_max: 1GiB}
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
  EXPECT_EQ(c->shadow_pool_bytes, 1ull << 30);
  EXPECT_EQ(c->posd_socket, "/tmp/p.sock");
  EXPECT_EQ(c->posd_arena_bytes, 64ull << 20);
  EXPECT_EQ(c->posd_arena_max, 1ull << 30);
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
  auto s = parse_config("posd: {checkpoint_staging_ahead: often}");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("checkpoint_staging_ahead"), std::string::npos) << s.status().message();
}

// Sessions page-lock their checkpoint staging as they start when posd.checkpoint_staging_ahead
// says so (posd sets it for the jobs its checkpoint_policy names; off otherwise: 128 MiB of
// page-locked memory per job on a 16-core host).
TEST(Config, CheckpointStagingAheadIsOffByDefaultAndThePolicysPatternsNameItsJobs) {
  auto c = parse_config("posd:\n  checkpoint_staging_ahead: true\n  checkpoint_policy: {jobs: [\"train-*\", eval], dir: /tmp}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->posd_checkpoint_staging_ahead);
  EXPECT_FALSE(Config{}.posd_checkpoint_staging_ahead);
  EXPECT_TRUE(policy_names_job(*c, "train-7"));
  EXPECT_TRUE(policy_names_job(*c, "eval"));
  EXPECT_FALSE(policy_names_job(*c, "evaluate"));
  EXPECT_FALSE(policy_names_job(Config{}, "train-7"));
}

// Shadows kept between checkpoints hold device memory: auto keeps them only where posd's policy
// will checkpoint the job every few seconds (posd_server's session config); true or false decide
// for every session.
TEST(Config, KeepShadowsIsAutoByDefaultOrTrueOrFalseAndSurvivesTheSessionsYaml) {
  EXPECT_FALSE(parse_config("").value().ckpt_keep_shadows.has_value());
  EXPECT_FALSE(parse_config("checkpoint: {keep_shadows: auto}").value().ckpt_keep_shadows.has_value());
  EXPECT_EQ(parse_config("checkpoint: {keep_shadows: true}").value().ckpt_keep_shadows, std::optional<bool>(true));
  EXPECT_EQ(parse_config("checkpoint: {keep_shadows: false}").value().ckpt_keep_shadows, std::optional<bool>(false));
  auto bad = parse_config("checkpoint: {keep_shadows: sometimes}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("keep_shadows"), std::string::npos) << bad.status().message();
  for (const char* text : {"", "checkpoint: {keep_shadows: true}", "checkpoint: {keep_shadows: false}"}) {
    const Config c = parse_config(text).value();
    auto back = parse_config(config_to_yaml(c));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->ckpt_keep_shadows, c.ckpt_keep_shadows) << text;
  }
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

TEST(Config, CheckpointCopyThreadsAreAutoOrOneToSixtyFourAndTheStagingIsBounded) {
  auto d = parse_config("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ckpt_copy_threads, 0u);  // auto
  EXPECT_EQ(d->ckpt_staging_bytes, 32ull << 20);
  auto c = parse_config("checkpoint: {copy_threads: 12, staging: 96MiB}");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->ckpt_copy_threads, 12u);
  EXPECT_EQ(c->ckpt_staging_bytes, 96ull << 20);
  EXPECT_EQ(parse_config("checkpoint: {copy_threads: auto}").value().ckpt_copy_threads, 0u);
  for (const char* bad : {"checkpoint: {copy_threads: 0}", "checkpoint: {copy_threads: 65}",
                          "checkpoint: {staging: 4KiB}", "checkpoint: {staging: 2GiB}"}) {
    auto r = parse_config(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(r.status().message().find("copy_threads") != std::string::npos ||
                r.status().message().find("staging") != std::string::npos)
        << r.status().message();
  }
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

TEST(Config, GpuSharesArePerCentsAboveZeroAndAtMostAHundredWithOneDecimal) {
  EXPECT_EQ(parse_share("30%").value(), 300u);
  EXPECT_EQ(parse_share("30").value(), 300u);
  EXPECT_EQ(parse_share("12.5%").value(), 125u);
  EXPECT_EQ(parse_share("100%").value(), 1000u);
  EXPECT_EQ(parse_share("0.1").value(), 1u);
  for (const char* bad : {"", "%", "0", "0%", "100.1", "101%", "-5%", "1e1", "30%%", "12.55", ".5", "5.", "abc", "1000"})
    EXPECT_FALSE(parse_share(bad).ok()) << bad;
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

// The error message of a config that must be refused; "accepted" when it was not.
std::string refusal(const std::string& yaml) {
  auto r = parse_config(yaml);
  return r.ok() ? std::string("accepted") : r.status().message();
}

// True when `text` contains every one of `parts`: the tests ask for the key path, the line and
// the offending text in each message.
::testing::AssertionResult names(const std::string& text, std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    if (text.find(p) == std::string::npos) return ::testing::AssertionFailure() << "'" << p << "' not in: " << text;
  return ::testing::AssertionSuccess();
}

TEST(Config, AFractionalMaxClientsIsRefusedWithItsKeyAndLine) {
  EXPECT_TRUE(names(refusal("backend: host\nclient:\n  max_clients: 2.9\n"), {"line 3", "client.max_clients", "'2.9'"}));
  EXPECT_TRUE(names(refusal("client: {max_clients: 4KiB}"), {"line 1", "client.max_clients", "'4KiB'"}));
  EXPECT_TRUE(names(refusal("client: {max_clients: 5000}"), {"client.max_clients", "5000 is out of range [1, 4096]"}));
  EXPECT_EQ(parse_config("client: {max_clients: 0x10}").value().max_clients, 16u);
}

TEST(Config, PosdMaxPendingIsAWholeNumberOfConnectionsFrom1To4096) {
  EXPECT_EQ(parse_config("").value().posd_max_pending, 32u);
  EXPECT_EQ(parse_config("posd: {max_pending: 200}").value().posd_max_pending, 200u);
  EXPECT_TRUE(names(refusal("posd:\n  max_pending: 0\n"), {"line 2", "posd.max_pending", "0 is out of range [1, 4096]"}));
  EXPECT_TRUE(names(refusal("posd: {max_pending: 5000}"), {"posd.max_pending", "out of range"}));
  EXPECT_TRUE(names(refusal("posd: {max_pending: -1}"), {"posd.max_pending", "'-1'"}));
  EXPECT_TRUE(names(refusal("posd: {max_pending: 8.5}"), {"posd.max_pending", "'8.5'"}));
  EXPECT_TRUE(names(refusal("posd: {max_pending: [8]}"), {"posd.max_pending must be a single value"}));
}

TEST(Config, AVaBaseThatIsNotAnAddressIsRefusedInsteadOfPlacingTheWindowAtZero) {
  EXPECT_TRUE(names(refusal("client:\n  va_base: banana\n"), {"line 2", "client.va_base", "'banana'"}));
  EXPECT_TRUE(names(refusal("client: {va_base: 0}"), {"client.va_base", "out of range"}));
  EXPECT_TRUE(names(refusal("client: {va_base: 0x110000000001}"), {"client.va_base", "not 4 KiB aligned"}));
  EXPECT_TRUE(names(refusal("client: {va_base: 17TiB}"), {"client.va_base", "'17TiB'"}));  // an address, not a size
  EXPECT_EQ(parse_config("client: {va_base: 0x100000000000}").value().va_base, 0x100000000000ull);
  EXPECT_EQ(parse_config("client: {va_base: 17592186044416}").value().va_base, 0x100000000000ull);
}

TEST(Config, AMalformedSizeIsRefusedWithItsKeyAndLine) {
  for (const char* bad : {"2.5.7GiB", "1..5G", "-1", "1.", ".5G", "5GiBs", "5 GiB x", "0x10", "1e9", "lots"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(names(refusal(std::string("log_level: warn\nclient:\n  memory_quota: ") + bad + "\n"),
                      {"line 3", "client.memory_quota", std::string("'") + bad + "'"}));
  }
  EXPECT_TRUE(names(refusal("client:\n  memory_quota:\n"), {"line 2", "client.memory_quota has no value"}));
  EXPECT_TRUE(names(refusal("client: {memory_quota: ''}"), {"client.memory_quota", "must start with a digit"}));
  EXPECT_EQ(parse_config("client: {memory_quota: 1.5GiB}").value().memory_quota, 3ull << 29);
}

TEST(Config, ZeroHostDeviceMemoryIsRefused) {
  EXPECT_TRUE(names(refusal("host_backend:\n  device_memory: 0\n"), {"line 2", "host_backend.device_memory", "minimum"}));
  EXPECT_TRUE(names(refusal("host_backend: {device_count: 0}"), {"host_backend.device_count", "out of range"}));
  EXPECT_TRUE(names(refusal("host_backend: {device_name: ''}"), {"host_backend.device_name must not be empty"}));
  EXPECT_EQ(parse_config("host_backend: {device_memory: 1MiB}").value().host_device_memory, 1ull << 20);
}

TEST(Config, ARepeatedKeyIsRefusedAtTopLevelAndInsideASectionNamingBothLines) {
  EXPECT_TRUE(names(refusal("backend: host\nlog_level: info\nbackend: cuda\n"),
                    {"line 3", "backend is given twice (first on line 1)"}));
  EXPECT_TRUE(names(refusal("client:\n  max_clients: 4\n  va_size: 1TiB\n  max_clients: 8\n"),
                    {"line 4", "client.max_clients is given twice (first on line 2)"}));
  EXPECT_TRUE(names(refusal("queues: {depth: 64, depth: 128}"), {"line 1", "queues.depth is given twice"}));
  EXPECT_TRUE(names(refusal("client: {max_clients: 4}\nclient: {va_size: 1TiB}\n"),
                    {"line 2", "client is given twice (first on line 1)"}));
  // The brief's own example: yaml-cpp keeps both pairs, a lookup would silently take the first.
  EXPECT_TRUE(names(refusal("posd:\n  a: 1\n  a: 2\n"), {"line 2", "posd.a"}));
  EXPECT_NE(refusal("a: 1\na: 2\n"), "accepted");
}

TEST(Config, NegativeAndOverflowingNumbersAreRefused) {
  EXPECT_TRUE(names(refusal("queues: {depth: -1}"), {"queues.depth", "'-1'"}));
  EXPECT_TRUE(names(refusal("queues: {spin_us: -5}"), {"queues.spin_us", "'-5'"}));
  EXPECT_TRUE(names(refusal("client: {max_clients: 18446744073709551616}"), {"client.max_clients", "too large"}));
  EXPECT_TRUE(names(refusal("client: {va_base: 0x10000000000000000}"), {"client.va_base", "too large"}));
  EXPECT_TRUE(names(refusal("client: {memory_quota: 16777216TiB}"), {"client.memory_quota", "larger than 2^64"}));
  EXPECT_TRUE(names(refusal("client: {memory_quota: 18446744073709551616}"), {"client.memory_quota", "larger than 2^64"}));
  EXPECT_TRUE(names(refusal("queues: {spin_us: 10000001}"), {"queues.spin_us", "out of range"}));
  EXPECT_TRUE(names(refusal("posd: {devices: [99999999999]}"), {"posd.devices", "'99999999999' is not a device index"}));
}

TEST(Config, AValueOfTheWrongTypeNamesItsKeyAndLine) {
  EXPECT_TRUE(names(refusal("queues:\n  depth: [1]\n"), {"line 2", "queues.depth must be a single value, not a list"}));
  EXPECT_TRUE(names(refusal("backend: {a: 1}"), {"line 1", "backend must be a single value, not a mapping"}));
  EXPECT_TRUE(names(refusal("log_level: warn\nclient: 5\n"), {"line 2", "client must be a mapping"}));
  EXPECT_TRUE(names(refusal("posd: {host_kernel_libraries: lib.so}"), {"posd.host_kernel_libraries must be a list"}));
  EXPECT_TRUE(names(refusal("posd:\n  host_kernel_libraries:\n    - a.so\n    - [b.so]\n"),
                    {"line 4", "posd.host_kernel_libraries[1] must be a single value"}));
  EXPECT_TRUE(names(refusal("- backend: host\n"), {"line 1", "a config is a mapping"}));
  EXPECT_TRUE(names(refusal("{[x]: 1}"), {"line 1", "a key", "not a plain word"}));
}

TEST(Config, BooleansAreTrueOrFalseOnly) {
  for (const char* bad : {"yes", "on", "1", "True", "y"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(names(refusal(std::string("queues:\n  record_latency: ") + bad + "\n"),
                      {"line 2", "queues.record_latency", std::string("'") + bad + "' is not true or false"}));
  }
  EXPECT_TRUE(parse_config("queues: {record_latency: true}").value().record_latency);
  EXPECT_FALSE(parse_config("queues: {record_latency: false}").value().record_latency);
}

TEST(Config, AWordChoiceTakesOnlyTheListedWords) {
  EXPECT_TRUE(names(refusal("queues: {delayed_verdict: true}"), {"queues.delayed_verdict must be auto|on|off, not 'true'"}));
  EXPECT_TRUE(names(refusal("\nlog_level: warning\n"), {"line 2", "log_level must be error|warn|info|debug, not 'warning'"}));
  EXPECT_TRUE(names(refusal("backend: Host"), {"backend must be host|cuda, not 'Host'"}));
  EXPECT_EQ(parse_config("queues: {delayed_verdict: on}").value().delayed_verdict, VerdictLook::kDelayed);
}

TEST(Config, CheckpointModeIsAnUnknownKeyThatSaysCheckpointsAreRequestedPerJob) {
  EXPECT_TRUE(names(refusal("checkpoint:\n  shadow_pool: auto\n  mode: off\n"),
                    {"line 3", "unknown config key 'checkpoint.mode'", "requested per job", "docs/checkpoint.md"}));
  EXPECT_TRUE(names(refusal("checkpoint: {shadow_pol: 1GiB}"),
                    {"unknown config key 'checkpoint.shadow_pol'", "keys of checkpoint: shadow_pool"}));
}

TEST(Config, AKeyGivenAcrossKeysBlamesTheFirstOfThemInTheFile) {
  EXPECT_TRUE(names(refusal("posd:\n  arena_max: 64MiB\n  arena: 128MiB\n"),
                    {"line 2", "posd.arena, 128 MiB, is more than posd.arena_max, 64 MiB"}));
  EXPECT_TRUE(names(refusal("backend: host\nclient: {max_clients: 4096, va_size: 1TiB}\n"),
                    {"line 2", "client.va_base + client.max_clients * client.va_size", "128 TiB"}));
  EXPECT_TRUE(names(refusal("posd: {arena: 512KiB}"), {"posd.arena", "minimum, 1 MiB"}));
}

TEST(Config, SyntaxErrorsAndSecondDocumentsAreRefusedWithTheLine) {
  EXPECT_TRUE(names(refusal("backend: host\nclient: [unclosed\n"), {"line 3", "not valid YAML"}));
  EXPECT_TRUE(names(refusal("backend: host\n---\nbackend: cuda\n"), {"line 3", "one YAML document"}));
}

TEST(Config, AFileErrorStartsWithThePathAndGivesTheLine) {
  const std::string path = ::testing::TempDir() + "/pos_config_lines.yaml";
  std::ofstream(path) << "# a comment\nposd:\n  arena: 2.5.7GiB\n";
  auto c = load_config_file(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find(path + ": line 3: posd.arena: '2.5.7GiB' is not a size"), 0u)
      << c.status().message();
}

TEST(Config, ADirectoryGivenAsTheConfigFileIsRefused) {
  auto c = load_config_file(::testing::TempDir());
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(names(c.status().message(), {"is a directory"}));
  auto missing = load_config_file("/nonexistent/pos.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(names(missing.status().message(), {"/nonexistent/pos.yaml", "No such file"}));
}

TEST(Config, SizesRefuseSignsSecondDotsPartBytesAndTrailingText) {
  for (const char* bad : {"", "-1", "+1", "2.5.7GiB", "1..5G", "1.", ".5", "1.5", "1.1KiB", "64 ", " 64", "4  KiB",
                          "4KiBx", "4 parsecs", "0x10", "18446744073709551616", "17179869184GiB"}) {
    EXPECT_FALSE(parse_size(bad).ok()) << "'" << bad << "' was accepted as " << parse_size(bad).value();
  }
  EXPECT_EQ(parse_size("4 KiB").value(), 4096u);
  EXPECT_EQ(parse_size("18446744073709551615").value(), UINT64_MAX);
  EXPECT_EQ(parse_size("16777215TiB").value(), 16777215ull << 40);
  EXPECT_EQ(parse_size("0.5KiB").value(), 512u);
  EXPECT_EQ(parse_size("1.25GB").value(), 1250000000u);
}

TEST(Config, WholeNumbersAreDecimalOrHexDigitsOnly) {
  EXPECT_EQ(parse_uint("4096").value(), 4096u);
  EXPECT_EQ(parse_uint("0x110000000000").value(), 0x110000000000ull);
  EXPECT_EQ(parse_uint("0XfF").value(), 255u);
  EXPECT_EQ(parse_uint("18446744073709551615").value(), UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", "0x", "2.9", "1e3", "12 ", "0x1g", "1_000", "18446744073709551616",
                          "0x10000000000000000"})
    EXPECT_FALSE(parse_uint(bad).ok()) << "'" << bad << "'";
}

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Config, TheEnvironmentOverridesTheFilesBackendAndLogLevelOnEveryLoadingPath) {
  const std::string path = ::testing::TempDir() + "/pos_config_env.yaml";
  std::ofstream(path) << "backend: cuda\nlog_level: error\nclient: {memory_quota: 1MiB}\n";
  ScopedEnv backend("POS_BACKEND", "host"), level("POS_LOG_LEVEL", "debug");
  {
    ScopedEnv file("POS_CONFIG", path.c_str());
    auto c = config_from_environment();
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->backend, "host");
    EXPECT_EQ(c->log_level, LogLevel::kDebug);
    EXPECT_EQ(c->memory_quota, 1u << 20);  // the rest comes from the file
  }
  // posd --config FILE: load_config_file, then the same overrides.
  auto f = load_config_file(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->backend, "cuda");
  ASSERT_TRUE(apply_environment_overrides(&f.value()).ok());
  EXPECT_EQ(f->backend, "host");
  EXPECT_EQ(f->log_level, LogLevel::kDebug);
}

TEST(Config, ABadEnvironmentValueIsRefusedNamingTheVariable) {
  Config c;
  {
    ScopedEnv backend("POS_BACKEND", "tpu");
    Status s = apply_environment_overrides(&c);
    EXPECT_TRUE(names(s.message(), {"POS_BACKEND must be host|cuda, not 'tpu'"}));
  }
  {
    ScopedEnv backend("POS_BACKEND", nullptr), level("POS_LOG_LEVEL", "loud");
    Status s = apply_environment_overrides(&c);
    EXPECT_TRUE(names(s.message(), {"POS_LOG_LEVEL must be error|warn|info|debug, not 'loud'"}));
  }
  ScopedEnv backend("POS_BACKEND", nullptr), level("POS_LOG_LEVEL", nullptr), file("POS_CONFIG", nullptr);
  EXPECT_TRUE(apply_environment_overrides(&c).ok());
  EXPECT_EQ(c.backend, "host");
}

// Every ```yaml block of every docs/*.md file is a whole config that parses: the docs show what a
// user may copy. Fragments that are not configs use another fence language.
TEST(Config, EveryYamlBlockInTheDocsIsAConfigThatParses) {
  const char* dir = std::getenv("POS_DOCS_DIR");
  ASSERT_NE(dir, nullptr) << "POS_DOCS_DIR is not set (unittest/meson.build sets it for config_test)";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".md") files.push_back(e.path());
  ASSERT_FALSE(ec) << dir << ": " << ec.message();
  std::sort(files.begin(), files.end());
  int blocks = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line, yaml;
    int n = 0, line_no = 0, opened_at = 0;
    bool inside = false;
    while (std::getline(in, line)) {
      ++line_no;
      if (!inside && line.rfind("```yaml", 0) == 0) {
        inside = true, yaml.clear(), opened_at = line_no, ++n, ++blocks;
      } else if (inside && line.rfind("```", 0) == 0) {
        inside = false;
        auto c = parse_config(yaml);
        EXPECT_TRUE(c.ok()) << f.string() << ", yaml block " << n << " (opened on line " << opened_at
                            << "): " << c.status().message();
      } else if (inside) {
        yaml += line + "\n";
      }
    }
    EXPECT_FALSE(inside) << f.string() << ": yaml block " << n << " (line " << opened_at << ") is never closed";
  }
  EXPECT_GT(blocks, 0) << "no ```yaml blocks in " << dir << "/*.md: the variable names the wrong folder";
}

TEST(Config, PosdSpareSessionIsOffUnlessSaidAndOnlyABoolean) {
  auto d = parse_config("posd:\n  socket: /tmp/x.sock\n");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->posd_spare_session);
  auto p = parse_config("posd:\n  spare_session: true\n");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->posd_spare_session);
  auto bad = parse_config("posd:\n  spare_session: 2\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("spare_session"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace pos

namespace pos {
namespace {

// posd.limits (docs/limits.md): the first rule whose patterns match a job's name gives its quota;
// other jobs get client.memory_quota. Each malformed rule is refused by its place in the list.
TEST(Config, PosdLimitsGiveTheFirstMatchingRulesQuotaAndMalformedRulesAreRefusedByPlace) {
  auto c = parse_config(
      "client: {memory_quota: 2GiB}\n"
      "posd:\n  limits:\n    - jobs: [\"train*\", \"*/bench/*\"]\n      memory: 8GiB\n"
      "    - jobs: [\"train-big\"]\n      memory: 16GiB\n    - jobs: [\"free\"]\n      memory: 0\n"
      "    - jobs: [\"shared*\"]\n      gpu_share: 12.5%\n    - jobs: [\"narrow\"]\n      sms: 40\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(memory_quota_for_job(*c, "train-big"), 8ull << 30);  // the first rule that matches
  EXPECT_EQ(memory_quota_for_job(*c, "/opt/bench/x"), 8ull << 30);
  EXPECT_EQ(memory_quota_for_job(*c, "free"), 0u);
  EXPECT_EQ(memory_quota_for_job(*c, "eval"), 2ull << 30);  // client.memory_quota
  EXPECT_EQ(memory_quota_for_job(*c, "shared-1"), 2ull << 30);  // a rule with a share only
  EXPECT_EQ(gpu_share_for_job(*c, "shared-1"), 125u);
  EXPECT_EQ(gpu_share_for_job(*c, "train-big"), 0u);
  EXPECT_EQ(sms_for_job(*c, "narrow"), 40u);  // a rule with an SM limit only
  EXPECT_EQ(sms_for_job(*c, "train-big"), 0u);
  EXPECT_EQ(memory_quota_for_job(*c, "narrow"), 2ull << 30);
  struct Case {
    std::string yaml, says;
  };
  for (const Case& k : std::vector<Case>{
           {"posd: {limits: {jobs: [a], memory: 1GiB}}", "posd.limits must be a list of rules"},
           {"posd: {limits: [{memory: 1GiB}]}", "posd.limits[0] names no jobs"},
           {"posd: {limits: [{jobs: [a]}]}", "posd.limits[0] sets no limit"},
           {"posd: {limits: [{jobs: [a], memory: 1GiB}, {jobs: [b], memory: lots}]}", "posd.limits[1].memory"},
           {"posd: {limits: [{jobs: [a], memory: 1GiB, cpu: 2}]}", "unknown config key 'posd.limits[0].cpu'"},
           {"posd: {limits: [{jobs: a, memory: 1GiB}]}", "posd.limits[0].jobs must be a list"},
           {"posd: {limits: [{jobs: [\"\"], memory: 1GiB}]}", "posd.limits[0].jobs[0] is an empty pattern"},
           {"posd: {limits: [a]}", "posd.limits[0] must be a mapping"},
           {"posd: {limits: [{jobs: [a], gpu_share: 120%}]}", "posd.limits[0].gpu_share"},
           {"posd: {limits: [{jobs: [a], gpu_share: 0}]}", "posd.limits[0].gpu_share"},
           {"posd: {limits: [{jobs: [a], sms: 0}]}", "posd.limits[0].sms"},
           {"posd: {limits: [{jobs: [a], sms: many}]}", "posd.limits[0].sms"},
           {"posd: {usage_region: run/usage}", "posd.usage_region must be an absolute path"}}) {
    auto r = parse_config(k.yaml);
    ASSERT_FALSE(r.ok()) << k.yaml;
    EXPECT_NE(r.status().message().find(k.says), std::string::npos) << k.yaml << ": " << r.status().to_string();
  }
}

// posd hands its config to each session process as config_to_yaml's text: every field must come
// back as it was, including strings a YAML scalar would misread.
TEST(Config, EveryFieldOffItsDefaultRoundTripsThroughTheYamlASessionProcessReads) {
  Config c;
  c.backend = "cuda";
  c.log_level = LogLevel::kDebug;
  c.max_clients = 7;
  c.memory_quota = 123456789;
  c.va_base = 0x120000000000ull;
  c.va_size = 0x4000000000ull;
  c.queue_depth = 77;
  c.spin_ns = 12000;
  c.sync_spin_ns = 34000;
  c.record_latency = true;
  c.delayed_verdict = VerdictLook::kImmediate;
  c.host_device_count = 3;
  c.host_device_memory = 5ull << 30;
  c.host_device_name = "dev: #1 \"quoted\" - yes";
  c.shadow_pool_bytes = 64ull << 20;
  c.posd_socket = "/run/pos x/posd.sock";
  c.posd_group = "123";
  c.posd_devices = {2, 0};
  c.posd_max_pending = 9;
  c.posd_arena_bytes = 32ull << 20;
  c.posd_arena_max = 1ull << 30;
  c.host_kernel_libraries = {"/a b/k.so", "true"};
  c.posd_isolation = Isolation::kShared;
  c.posd_session_binary = "/opt/pos/libexec/posd-session";
  c.posd_spare_session = true;
  c.posd_checkpoint_staging_ahead = true;
  c.posd_usage_region = "/run/pos x/usage";
  c.posd_limits = {{{"train*", "a: b"}, 8ull << 30, 0, 0}, {{"*"}, 0, 305, 16}, {{"eval"}, UINT64_MAX, 1000, 0}};
  const std::string text = config_to_yaml(c);
  auto back = parse_config(text);
  ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
  const Config& b = *back;
  EXPECT_EQ(b.backend, c.backend);
  EXPECT_EQ(b.log_level, c.log_level);
  EXPECT_EQ(b.max_clients, c.max_clients);
  EXPECT_EQ(b.memory_quota, c.memory_quota);
  EXPECT_EQ(b.va_base, c.va_base);
  EXPECT_EQ(b.va_size, c.va_size);
  EXPECT_EQ(b.queue_depth, c.queue_depth);
  EXPECT_EQ(b.spin_ns, c.spin_ns);
  EXPECT_EQ(b.sync_spin_ns, c.sync_spin_ns);
  EXPECT_EQ(b.record_latency, c.record_latency);
  EXPECT_EQ(b.delayed_verdict, c.delayed_verdict);
  EXPECT_EQ(b.host_device_count, c.host_device_count);
  EXPECT_EQ(b.host_device_memory, c.host_device_memory);
  EXPECT_EQ(b.host_device_name, c.host_device_name);
  EXPECT_EQ(b.shadow_pool_bytes, c.shadow_pool_bytes);
  EXPECT_EQ(b.posd_socket, c.posd_socket);
  EXPECT_EQ(b.posd_group, c.posd_group);
  EXPECT_EQ(b.posd_devices, c.posd_devices);
  EXPECT_EQ(b.posd_max_pending, c.posd_max_pending);
  EXPECT_EQ(b.posd_arena_bytes, c.posd_arena_bytes);
  EXPECT_EQ(b.posd_arena_max, c.posd_arena_max);
  EXPECT_EQ(b.host_kernel_libraries, c.host_kernel_libraries);
  EXPECT_EQ(b.posd_isolation, c.posd_isolation);
  EXPECT_EQ(b.posd_session_binary, c.posd_session_binary);
  EXPECT_EQ(b.posd_spare_session, c.posd_spare_session);
  EXPECT_EQ(b.posd_checkpoint_staging_ahead, c.posd_checkpoint_staging_ahead);
  EXPECT_EQ(b.posd_usage_region, c.posd_usage_region);
  ASSERT_EQ(b.posd_limits.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b.posd_limits[i].jobs, c.posd_limits[i].jobs) << i;
    EXPECT_EQ(b.posd_limits[i].memory, c.posd_limits[i].memory) << i;
    EXPECT_EQ(b.posd_limits[i].gpu_share, c.posd_limits[i].gpu_share) << i;
    EXPECT_EQ(b.posd_limits[i].sms, c.posd_limits[i].sms) << i;
  }
  // The defaults round-trip too (the empty device list, auto shadow pool, process isolation).
  auto d = parse_config(config_to_yaml(Config{}));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(config_to_yaml(*d), config_to_yaml(Config{}));
  EXPECT_EQ(d->posd_isolation, Isolation::kProcess);
}

TEST(Config, PosdIsolationIsProcessOrShared) {
  auto p = parse_config("posd:\n  isolation: shared\n");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->posd_isolation, Isolation::kShared);
  auto bad = parse_config("posd:\n  isolation: mps\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("posd.isolation must be process|shared, not 'mps'"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace pos
