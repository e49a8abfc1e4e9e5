// client_library_test.cc — what the built libpos_client.so links and exports (docs/remoting.md). It is
// preloaded into arbitrary programs: no POS core, protobuf, yaml-cpp or Boost; only CUDA entry points.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string client_lib() {
  const char* v = std::getenv("POS_CLIENT_LIB");
  if (v == nullptr) ADD_FAILURE() << "POS_CLIENT_LIB is not set (meson sets it)";
  return v == nullptr ? "" : v;
}

// Runs a command line; its stdout, or a failed assertion when it cannot run or exits non-zero
// (a missing readelf / nm must not read as "nothing found").
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run: " << cmd;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << cmd << " failed:\n" << out;
  return out;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

// DT_NEEDED entries: readelf -d prints "... (NEEDED)  Shared library: [libfoo.so.1]".
std::vector<std::string> needed(const std::string& lib) {
  std::vector<std::string> out;
  for (const std::string& l : lines(run("readelf -d -W '" + lib + "'"))) {
    if (l.find("(NEEDED)") == std::string::npos) continue;
    const size_t a = l.find('['), b = l.rfind(']');
    if (a != std::string::npos && b != std::string::npos && b > a) out.push_back(l.substr(a + 1, b - a - 1));
  }
  return out;
}

// The symbols the library defines in its dynamic symbol table: the names (mangled) or, demangled,
// whole lines of `nm --format=posix` (a demangled name has spaces in it).
std::vector<std::string> exported_names(const std::string& lib) {
  std::vector<std::string> out;
  for (const std::string& l : lines(run("nm -D --defined-only --format=posix '" + lib + "'")))
    out.push_back(l.substr(0, l.find(' ')));
  return out;
}
std::vector<std::string> exported_demangled(const std::string& lib) {
  return lines(run("nm -D --defined-only --format=posix -C '" + lib + "'"));
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

TEST(ClientLibrary, LinksNoProtobufYamlBoostOrPosRuntime) {
  const std::vector<std::string> libs = needed(client_lib());
  // What every C++ shared library needs: proves the NEEDED list was read at all.
  bool libc = false;
  for (const std::string& l : libs) libc = libc || starts_with(l, "libc.so");
  EXPECT_TRUE(libc) << "readelf -d listed no libc.so: the NEEDED list was not read";
  for (const std::string& l : libs) {
    for (const char* banned : {"libpos.so", "libpos_posd", "libpos_remoting", "libpos_cuda", "libpos_inproc",
                               "libyaml-cpp", "libprotobuf", "libboost"})
      EXPECT_FALSE(starts_with(l, banned)) << "libpos_client.so needs " << l;
  }
}

TEST(ClientLibrary, ExportsOnlyCudaEntryPoints) {
  const std::string lib = client_lib();
  const std::vector<std::string> names = exported_names(lib);
  // The entry points an nvcc-built program binds to must be there.
  for (const char* must : {"cudaMalloc", "cudaLaunchKernel", "cublasSgemm_v2", "__cudaRegisterFatBinary",
                           "__cudaPushCallConfiguration"}) {
    bool found = false;
    for (const std::string& n : names) found = found || n == must;
    EXPECT_TRUE(found) << "libpos_client.so does not export " << must;
  }
  for (const std::string& n : names)
    EXPECT_TRUE(starts_with(n, "cuda") || starts_with(n, "cublas") || starts_with(n, "__cuda"))
        << "libpos_client.so exports " << n << ", outside the CUDA / cuBLAS entry points";
  for (const std::string& n : exported_demangled(lib))
    EXPECT_EQ(n.find("pos::"), std::string::npos) << "libpos_client.so exports " << n;
}

}  // namespace
