// factory.cc — picks the device backend named by the config; loads the CUDA one (libpos_cuda.so,
// linked against the driver and cuBLAS) only when asked for, so hosts without a driver run the rest.
#include "pos/backends/factory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "pos/backends/host/host_backend.h"

namespace pos {
namespace {

using CreateFn = DeviceBackend* (*)(const Config*, Status*);

// Next to libpos itself (the install prefix), or where the build tree puts it (backends/cuda/ below
// libpos's folder), unless POS_CUDA_BACKEND_LIB says.
std::string cuda_library_path() {
  if (const char* p = std::getenv("POS_CUDA_BACKEND_LIB"); p != nullptr && *p != '\0') return p;
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&cuda_library_path), &info) != 0 && info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) {
      const std::string dir = self.substr(0, slash + 1);
      for (const char* rel : {"libpos_cuda.so", "backends/cuda/libpos_cuda.so"})
        if (access((dir + rel).c_str(), F_OK) == 0) return dir + rel;
      return dir + "libpos_cuda.so";
    }
  }
  return "libpos_cuda.so";
}

StatusOr<std::unique_ptr<DeviceBackend>> load_cuda_backend(const Config& config) {
  const std::string path = cuda_library_path();
  // Kept loaded for the life of the process: backends and their clients hold its code.
  // DEEPBIND: in-process, the app's CUDA runtime and cuBLAS entry points are POS's own shim, and
  // the backend's calls into the real cuBLAS must not bind to them (they would loop back into
  // POS). Sanitizer runtimes cannot interpose on a deep-bound library, so those builds go without.
  int flags = RTLD_NOW | RTLD_LOCAL;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  flags |= RTLD_DEEPBIND;
#endif
  void* lib = dlopen(path.c_str(), flags);
  if (lib == nullptr) {
    const char* err = dlerror();
    return Status(Code::kUnavailable, cuda::kErrorNoDevice,
                  "the CUDA backend cannot be loaded (" + std::string(err != nullptr ? err : path) +
                      "); it needs a build with the CUDA toolkit and an NVIDIA driver (libcuda.so.1)");
  }
  auto create = reinterpret_cast<CreateFn>(dlsym(lib, "pos_cuda_backend_create"));
  if (create == nullptr) return Status::Internal(path + " has no pos_cuda_backend_create");
  Status s;
  DeviceBackend* b = create(&config, &s);
  if (b == nullptr) return s.ok() ? Status::Internal("the CUDA backend failed to start") : s.with_context("cuda backend");
  return std::unique_ptr<DeviceBackend>(b);
}

}  // namespace

StatusOr<std::unique_ptr<DeviceBackend>> make_backend(const Config& config) {
  if (config.backend == "host") return host::make_host_backend(config);
  if (config.backend == "cuda") return load_cuda_backend(config);
  return Status::InvalidArgument("unknown backend '" + config.backend + "' (host | cuda)");
}

}  // namespace pos
