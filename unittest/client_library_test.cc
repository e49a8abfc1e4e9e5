// client_library_test.cc — what the built libpos_client.so links and exports (docs/remoting.md). It is
// preloaded into arbitrary programs: no POS core, protobuf, yaml-cpp or Boost; only CUDA entry points.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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


// The stand-ins for the toolkit's libraries (remoting/client/cuda_libs): each has the real one's
// SONAME and exactly its symbol version (which the program's references ask of that file), needs
// nothing, and defines no symbol, so every CUDA call resolves to the preloaded libpos_client.
TEST(CudaStandIns, HaveTheToolkitsNamesAndVersionsAndDefineNoSymbol) {
  const char* dir = std::getenv("POS_CUDA_STAND_INS");
  const char* toolkit = std::getenv("POS_CUDA_LIB_DIR");
  ASSERT_NE(dir, nullptr) << "POS_CUDA_STAND_INS is not set (meson sets it)";
  ASSERT_NE(toolkit, nullptr) << "POS_CUDA_LIB_DIR is not set (meson sets it)";
  // Version definitions: readelf -V prints "... Name: libcudart.so.13" under .gnu.version_d.
  auto version_names = [](const std::string& lib) {
    std::vector<std::string> out;
    bool in_defs = false;
    for (const std::string& l : lines(run("readelf -V -W '" + lib + "'"))) {
      if (l.find("Version definition section") != std::string::npos) in_defs = true;
      else if (l.find("Version needs section") != std::string::npos || l.find("Version symbols section") != std::string::npos)
        in_defs = false;
      else if (in_defs && l.find("Name: ") != std::string::npos) out.push_back(l.substr(l.find("Name: ") + 6));
    }
    return out;
  };
  int checked_against_toolkit = 0;
  for (const char* base : {"libcudart", "libcublas", "libcublasLt"}) {
    std::string file;  // lib<name>.so.<major>
    for (const std::string& l : lines(run("ls '" + std::string(dir) + "'"))) {
      const std::string prefix = std::string(base) + ".so.";
      if (l.rfind(prefix, 0) == 0 && l.size() > prefix.size() && l.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
        file = l;
    }
    ASSERT_FALSE(file.empty()) << "no " << base << ".so.<major> in " << dir;
    const std::string lib = std::string(dir) + "/" + file;
    const std::string dynamic = run("readelf -d -W '" + lib + "'");
    EXPECT_NE(dynamic.find("Library soname: [" + file + "]"), std::string::npos) << dynamic;
    EXPECT_TRUE(needed(lib).empty()) << lib << " needs something";
    const std::vector<std::string> versions = version_names(lib);
    ASSERT_FALSE(versions.empty()) << lib << " defines no version";
    for (const std::string& v : versions) EXPECT_EQ(v, file) << lib;
    // Only the version node itself is "defined" (nm lists it as an absolute symbol).
    for (const std::string& n : exported_names(lib)) EXPECT_EQ(n, file) << lib << " defines " << n;
    const std::string real = std::string(toolkit) + "/" + file;
    if (::access(real.c_str(), R_OK) == 0) {
      EXPECT_EQ(version_names(real), versions) << real << " and " << lib << " differ in their versions";
      ++checked_against_toolkit;
    }
  }
  // The toolkit the stand-ins were built for is the one the programs are built with.
  EXPECT_EQ(checked_against_toolkit, 3) << "the toolkit in " << toolkit << " lacks a library of the stand-ins' major version";
}

}  // namespace
